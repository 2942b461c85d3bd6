"""The end of `make demo`: serve the model repository's stable track, print one REST and one gRPC prediction, stop."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from serving.clients import GrpcClient, RestClient, format_prediction
from serving.repository.base import validate_model_name
from serving.repository.local import ModelRepository

STABLE_LABEL = "stable"


def serve_and_predict(serving_base_dir: str, model_name: str, row: Mapping[str, Any]) -> None:
    """Serves the repository's models.config on free loopback ports, as `mlops serve --model-config` does, and prints
    a prediction of the `stable` version for `row` (raw features; columns the model does not take, such as the
    label, are ignored) from each API.

    Raises FileNotFoundError when no version of `model_name` is served there yet.
    """
    from serving.server.model_server import ModelServer

    repository = ModelRepository(serving_base_dir)
    stable = repository.labels(validate_model_name(model_name)).get(STABLE_LABEL)
    if stable is None:
        raise FileNotFoundError(f"No version of {model_name!r} is served from {Path(repository.config_path)}; run "
                                "the pipeline first.")
    server = ModelServer(config_path=repository.config_path, rest_port=0, grpc_port=0, poll_seconds=0)
    for problem in server.start():
        print(f"warning: {problem}")
    try:
        server.wait_until_available(model_name, stable)
        print(f"serving {model_name} version {stable} (label {STABLE_LABEL}): REST {server.rest_url}, "
              f"gRPC {server.grpc_target}")
        latest = repository.latest_version(model_name)
        if latest != stable:
            print(f"version {latest} is published but not serving yet: mlops rollout start --version {latest}")
        with RestClient(server.rest_url) as rest, GrpcClient(server.grpc_target) as grpc:
            by_rest = rest.predict_outputs(row, model_name, label=STABLE_LABEL, drop_unknown_features=True)[0]
            by_grpc = grpc.predict_outputs(row, model_name, label=STABLE_LABEL, drop_unknown_features=True)[0]
        print(f"REST prediction: {format_prediction(by_rest)}")
        print(f"gRPC prediction: {format_prediction(by_grpc)}")
    finally:
        server.stop()
        print("server stopped")
