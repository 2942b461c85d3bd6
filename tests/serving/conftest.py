"""Tiny SavedModels shaped like the taxi model (one tensor per raw feature, `probabilities` out) and servers on them."""
from __future__ import annotations

import math
import random
import shutil
from pathlib import Path

import pytest
import tensorflow as tf

from serving.repository.local import ModelRepository
from serving.server.model_server import ModelServer
from serving.server.request_log import RequestLogger
from settings.config import RequestLogConfig

MODEL = "tiny"
# Each version's bias: far enough apart that a response tells which version answered.
VERSION_BIAS = {1: -3.0, 2: 3.0, 3: 0.5}
FEATURES = {"fare": tf.float32, "trip_start_hour": tf.int64, "payment_type": tf.string}
ROW = {"fare": 2.5, "trip_start_hour": 7, "payment_type": "Cash"}


class TinyTaxiModel(tf.Module):
    def __init__(self, bias: float) -> None:
        super().__init__()
        self.bias = tf.Variable(bias, dtype=tf.float32)

    def logits(self, fare, trip_start_hour, payment_type):
        fare = tf.where(tf.math.is_nan(fare), tf.zeros_like(fare), fare)
        cash = tf.cast(tf.equal(payment_type, "Cash"), tf.float32)
        return self.bias + 0.1 * fare + 0.01 * tf.cast(trip_start_hour, tf.float32) - cash


def _signature_spec():
    return [tf.TensorSpec([None], dtype, name=name) for name, dtype in FEATURES.items()]


def save_tiny_model(export_dir: Path, bias: float) -> Path:
    """A tf.Module SavedModel: `serving_default` -> probabilities, `scores` -> probabilities and logits."""
    module = TinyTaxiModel(bias)

    @tf.function(input_signature=_signature_spec())
    def serve(fare, trip_start_hour, payment_type):
        return {"probabilities": tf.sigmoid(module.logits(fare, trip_start_hour, payment_type))}

    @tf.function(input_signature=_signature_spec())
    def scores(fare, trip_start_hour, payment_type):
        logits = module.logits(fare, trip_start_hour, payment_type)
        return {"probabilities": tf.sigmoid(logits), "logits": logits}

    tf.saved_model.save(module, str(export_dir), signatures={"serving_default": serve, "scores": scores})
    return export_dir


def expected_probability(row: dict, version: int) -> float:
    """What version `version` of the tiny model answers for `row` (missing fare counts as 0)."""
    fare = row.get("fare")
    fare = 0.0 if fare is None or (isinstance(fare, float) and math.isnan(fare)) else float(fare)
    hour = row.get("trip_start_hour")
    hour = -1 if hour is None else int(hour)
    cash = 1.0 if row.get("payment_type") == "Cash" else 0.0
    logit = VERSION_BIAS[version] + 0.1 * fare + 0.01 * hour - cash
    return 1.0 / (1.0 + math.exp(-logit))


@pytest.fixture(scope="session")
def tiny_exports(tmp_path_factory) -> dict[int, Path]:
    """SavedModel exports, one per version bias, saved once per session."""
    folder = tmp_path_factory.mktemp("tiny_exports")
    return {version: save_tiny_model(folder / str(version), bias) for version, bias in VERSION_BIAS.items()}


@pytest.fixture
def repository(tmp_path, tiny_exports) -> ModelRepository:
    """A model repository holding versions 1 and 2 of `tiny`, served with stable=1 and canary=2."""
    repo = ModelRepository(tmp_path / "models")
    repo.add_version(MODEL, tiny_exports[1], version=1)
    repo.add_version(MODEL, tiny_exports[2], version=2)
    repo.serve(MODEL, [1, 2], {"stable": 1, "canary": 2})
    return repo


def start_server(repository: ModelRepository, **options) -> ModelServer:
    """A started server on free loopback ports over `repository`, polling its config every 0.1 s."""
    defaults = dict(rest_port=0, grpc_port=0, poll_seconds=0.1, max_batch_size=8, grpc_workers=4,
                    max_num_load_retries=2, load_retry_interval_s=0.05)
    model_server = ModelServer(config_path=repository.config_path, **{**defaults, **options})
    model_server.start()
    return model_server


@pytest.fixture
def server(repository) -> ModelServer:
    """A running server over `repository` (batches of at most 8 rows; a failed load is retried twice)."""
    model_server = start_server(repository)
    try:
        yield model_server
    finally:
        model_server.stop()


@pytest.fixture
def logged_server(repository, tmp_path) -> ModelServer:
    """A server over `repository` (stable=1, canary=2) logging every prediction under tmp_path/logs."""
    logger = RequestLogger(RequestLogConfig(enabled=True), str(tmp_path / "logs"), random_source=random.Random(0))
    model_server = start_server(repository, request_logger=logger)
    model_server.wait_until_available(MODEL, 2)
    try:
        yield model_server
    finally:
        model_server.stop()


def copy_export(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def http_json(method: str, url: str, body: object = None, raw: bytes | None = None) -> tuple[int, dict]:
    """One HTTP request; returns the status and the decoded JSON body (errors included)."""
    import json
    import urllib.error
    import urllib.request

    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def version_answering(probability: float, row: dict = ROW) -> int | None:
    """Which tiny-model version gives `probability` for `row` (None if none does)."""
    for version in VERSION_BIAS:
        if abs(expected_probability(row, version) - probability) < 1e-5:
            return version
    return None


def wait_for(condition, timeout_s: float = 15.0, what: str = "condition") -> None:
    """Polls `condition` every 20 ms; fails the test after `timeout_s`."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
