"""The end of `make demo`: serve the pushed model, print one REST and one gRPC prediction, stop."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from serving.client import GrpcClient, RestClient
from serving.model_repository import list_versions, validate_model_name


def serve_and_predict(serving_base_dir: str, model_name: str, row: Mapping[str, Any]) -> None:
    """Serves `<serving_base_dir>/<model_name>/<latest version>/` on free loopback ports and prints a prediction
    for `row` (raw features; columns the model does not take, such as the label, are ignored) from each API.

    Raises FileNotFoundError when no version has been pushed there.
    """
    from serving.server import ModelServer

    model_dir = Path(serving_base_dir) / validate_model_name(model_name)
    versions = list_versions(model_dir)
    if not versions:
        raise FileNotFoundError(f"No pushed version of {model_name!r} under {model_dir}; run the pipeline first.")
    server = ModelServer.for_model(model_name, model_dir, rest_port=0, grpc_port=0, poll_seconds=0)
    for problem in server.start():
        print(f"warning: {problem}")
    try:
        server.wait_until_available(model_name, versions[-1])
        print(f"serving {model_name} version {versions[-1]}: REST {server.rest_url}, gRPC {server.grpc_target}")
        with RestClient(server.rest_url) as rest, GrpcClient(server.grpc_target) as grpc:
            rest_probability = rest.predict(row, model_name, drop_unknown_features=True)[0]
            grpc_probability = grpc.predict(row, model_name, drop_unknown_features=True)[0]
        print(f"REST prediction: {rest_probability:.6f}")
        print(f"gRPC prediction: {grpc_probability:.6f}")
    finally:
        server.stop()
        print("server stopped")
