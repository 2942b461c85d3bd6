"""`mlops serve`'s request logs: sampled REST and gRPC predictions written as TF Serving's PredictionLog TFRecords that
decode to the model, the version that answered, the label asked for and the tensors; exact sampling counts from a
seeded draw; files rotated by size and by age (an injected clock) and bounded in number; and a log that cannot be
written leaves every request answered and is counted on the Prometheus page."""
from __future__ import annotations

import random
import threading
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2

from rollout.metrics import parse_prometheus_text
from serving import TRAFFIC_HEADER, VERIFIER_TRAFFIC, is_verifier
from serving.clients import GrpcClient, RestClient
from serving.server import request_log
from serving.server.monitoring import REQUEST_LOG_COUNT
from serving.server.request_log import (
    LoggedPrediction,
    RequestLogger,
    log_file_name,
    log_files,
    open_request_logger,
    read_prediction_logs,
)
from settings.config import ConfigError, RequestLogConfig, load_config
from tests.serving.conftest import MODEL, ROW, expected_probability, http_json, start_server

PREDICT = "/tensorflow.serving.PredictionService/Predict"


def settings(**changes) -> RequestLogConfig:
    return RequestLogConfig(enabled=True, **changes)


def records(directory: Path, model: str = MODEL) -> list:
    return [record for path in log_files(str(directory), model) for record in read_prediction_logs(path)]


def grpc_request(version: int | None = None, label: str | None = None, row: dict = ROW) -> bytes:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL
    if version is not None:
        request.model_spec.version.value = version
    if label is not None:
        request.model_spec.version_label = label
    request.inputs["fare"].CopyFrom(tf.make_tensor_proto([row["fare"]], dtype=tf.float32))
    request.inputs["trip_start_hour"].CopyFrom(tf.make_tensor_proto([row["trip_start_hour"]], dtype=tf.int64))
    request.inputs["payment_type"].CopyFrom(tf.make_tensor_proto([row["payment_type"]], dtype=tf.string))
    return request.SerializeToString()


def grpc_predict(target: str, body: bytes) -> bytes:
    with grpc.insecure_channel(target) as channel:
        return channel.unary_unary(PREDICT)(body, timeout=10)


def log_counts(server) -> dict[str, float]:
    with urllib.request.urlopen(f"{server.rest_url}/monitoring/prometheus/metrics", timeout=5) as response:
        samples = parse_prometheus_text(response.read().decode())
    return {s.labels["status"]: s.value for s in samples if s.name == REQUEST_LOG_COUNT
            and s.labels["model_name"] == MODEL}


def test_rest_and_grpc_predictions_decode_to_model_version_label_and_tensors(logged_server, tmp_path):
    server = logged_server
    second = {"fare": 10.0, "trip_start_hour": 20, "payment_type": "Credit Card"}
    assert http_json("POST", f"{server.rest_url}/v1/models/{MODEL}/labels/canary:predict",
                     {"instances": [ROW, second]})[0] == 200
    assert http_json("POST", f"{server.rest_url}/v1/models/{MODEL}/versions/1:predict",
                     {"signature_name": "scores", "inputs": {k: [v] for k, v in ROW.items()}})[0] == 200
    assert http_json("POST", f"{server.rest_url}/v1/models/{MODEL}:predict", {"instances": [ROW]})[0] == 200
    sent = grpc_request(label="stable")
    answer = grpc_predict(server.grpc_target, sent)
    assert http_json("POST", f"{server.rest_url}/v1/models/{MODEL}:predict", {"instances": [{"fare": 1.0}]})[0] == 400
    server.stop()  # writes what is queued and closes the files

    labelled, versioned, latest, over_grpc = records(tmp_path / "logs")  # the refused request is not logged
    for record, version, signature in ((labelled, 2, "serving_default"), (versioned, 1, "scores"),
                                       (latest, 2, "serving_default"), (over_grpc, 1, "serving_default")):
        assert record.WhichOneof("log_type") == "predict_log"
        spec = record.log_metadata.model_spec
        assert (spec.name, spec.version.value, spec.signature_name) == (MODEL, version, signature)
        assert record.log_metadata.sampling_config.sampling_rate == 1.0
        assert list(record.log_metadata.saved_model_tags) == ["serve"]
        response_spec = record.predict_log.response.model_spec
        assert (response_spec.name, response_spec.version.value) == (MODEL, version)
    # The request as it named the model: a label, a version, neither.
    assert labelled.predict_log.request.model_spec.version_label == "canary"
    assert versioned.predict_log.request.model_spec.version.value == 1
    assert latest.predict_log.request.model_spec.WhichOneof("version_choice") is None
    assert over_grpc.predict_log.request.model_spec.version_label == "stable"
    # REST's JSON as the tensors TF Serving would have made of it, in the signature's dtypes.
    inputs = {name: tf.make_ndarray(t) for name, t in labelled.predict_log.request.inputs.items()}
    assert inputs["fare"].dtype == np.float32 and inputs["fare"].tolist() == [2.5, 10.0]
    assert inputs["trip_start_hour"].dtype == np.int64 and inputs["trip_start_hour"].tolist() == [7, 20]
    assert inputs["payment_type"].tolist() == [b"Cash", b"Credit Card"]
    probabilities = tf.make_ndarray(labelled.predict_log.response.outputs["probabilities"])
    np.testing.assert_allclose(probabilities, [expected_probability(ROW, 2), expected_probability(second, 2)],
                               rtol=1e-6)
    assert set(versioned.predict_log.response.outputs) == {"probabilities", "logits"}
    # gRPC's messages as they crossed the wire.
    assert over_grpc.predict_log.request.SerializeToString() == predict_pb2.PredictRequest.FromString(
        sent).SerializeToString()
    assert over_grpc.predict_log.response == predict_pb2.PredictResponse.FromString(answer)


def test_every_sampled_prediction_is_counted_as_written(logged_server):
    for _ in range(3):
        assert http_json("POST", f"{logged_server.rest_url}/v1/models/{MODEL}:predict", {"instances": [ROW]})[0] == 200
    grpc_predict(logged_server.grpc_target, grpc_request())
    logged_server.request_logger.flush()
    assert log_counts(logged_server) == {"written": 4, "dropped": 0, "failed": 0, "verifier": 0}


def verifier_and_user_predictions(rest_url: str, grpc_target: str) -> None:
    """Two user predictions and three of the rollout's verifier (marked as rollout/verify.py marks them), over both
    transports."""
    mark = {TRAFFIC_HEADER: VERIFIER_TRAFFIC}
    for options in ({}, {"headers": mark}):
        with RestClient(rest_url, **options) as rest, GrpcClient(grpc_target, **options) as rpc:
            assert rest.predict(ROW, MODEL) == pytest.approx([expected_probability(ROW, 2)])
            assert rpc.predict(ROW, MODEL) == pytest.approx([expected_probability(ROW, 2)])
            if options:
                assert rest.predict(ROW, MODEL, label="stable") == pytest.approx([expected_probability(ROW, 1)])


def test_the_verifiers_predictions_are_counted_apart_and_left_out_of_the_logs(logged_server, tmp_path):
    verifier_and_user_predictions(logged_server.rest_url, logged_server.grpc_target)
    logged_server.request_logger.flush()
    assert log_counts(logged_server) == {"written": 2, "dropped": 0, "failed": 0, "verifier": 3}
    assert [r.predict_log.request.model_spec.version_label for r in records(tmp_path / "logs")] == ["", ""]


def test_the_verifiers_mark_is_one_header_read_as_http_and_grpc_send_it():
    assert is_verifier([(b"x-mlops-traffic", b"verifier")]) and is_verifier([("X-MLOps-Traffic", " Verifier ")])
    assert not is_verifier([("x-mlops-traffic", "user")]) and not is_verifier([("x-other", "verifier")])
    assert not is_verifier([])


@pytest.mark.parametrize("rate", [0.0, 1.0, 0.3])
def test_sampling_logs_exactly_the_seeded_draws(repository, tmp_path, rate):
    logger = RequestLogger(settings(sampling_rate=rate), str(tmp_path / "logs"), random_source=random.Random(11))
    server = start_server(repository, request_logger=logger)
    try:
        server.wait_until_available(MODEL, 2)
        for index in range(30):
            if index % 2:
                grpc_predict(server.grpc_target, grpc_request())
            else:
                assert http_json("POST", f"{server.rest_url}/v1/models/{MODEL}:predict", {"instances": [ROW]})[0] == 200
    finally:
        server.stop()
    logged = records(tmp_path / "logs")
    # 0.3: the draws of random.Random(11) below 0.3, 10 of the first 30.
    assert len(logged) == {0.0: 0, 1.0: 30, 0.3: 10}[rate]
    assert all(r.log_metadata.sampling_config.sampling_rate == rate for r in logged)


class FakeClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def fixed_prediction(payload: bytes = b"x" * 100) -> LoggedPrediction:
    return LoggedPrediction(3, "serving_default", payload, payload)


def write(logger: RequestLogger, clock: FakeClock, times: list[float]) -> None:
    for at in times:
        clock.now = at
        logger.submit(MODEL, fixed_prediction)
    assert logger.flush()


def test_files_rotate_before_a_record_would_pass_the_size_bound(tmp_path):
    clock = FakeClock()
    probe = RequestLogger(settings(), str(tmp_path / "probe"), clock=clock)
    write(probe, clock, [clock.now])
    probe.close()
    [path] = log_files(str(tmp_path / "probe"), MODEL)
    size = Path(path).stat().st_size  # one record with its metadata and TFRecord framing
    logger = RequestLogger(settings(max_file_bytes=3 * size), str(tmp_path / "logs"), clock=clock)
    write(logger, clock, [clock.now] * 10)
    logger.close()
    files = log_files(str(tmp_path / "logs"), MODEL)
    assert [len(list(read_prediction_logs(f))) for f in files] == [3, 3, 3, 1]
    assert all(Path(f).stat().st_size <= 3 * size for f in files)


def test_files_rotate_by_the_age_of_their_first_record_and_are_named_by_it(tmp_path):
    clock = FakeClock(1_700_000_000.0)
    start = clock.now
    logger = RequestLogger(settings(max_file_seconds=10), str(tmp_path / "logs"), clock=clock)
    write(logger, clock, [start, start + 1, start + 9.5, start + 10, start + 25.25])
    logger.close()
    files = log_files(str(tmp_path / "logs"), MODEL)
    assert [len(list(read_prediction_logs(f))) for f in files] == [3, 1, 1]
    stamps = [Path(f).name.split("-")[1] for f in files]
    assert stamps == ["20231114T221320000000Z", "20231114T221330000000Z", "20231114T221345250000Z"]
    assert files == sorted(files)
    assert [r.log_metadata.timestamp_secs for f in files for r in read_prediction_logs(f)] == [
        int(start), int(start) + 1, int(start) + 9, int(start) + 10, int(start) + 25]


def test_an_idle_file_past_its_age_is_closed(tmp_path, monkeypatch):
    opened = []

    class Recording:
        def __init__(self, path: str) -> None:
            self.closed = threading.Event()
            opened.append(self)

        def write(self, record: bytes) -> None:
            pass

        def flush(self) -> None:
            pass

        def close(self) -> None:
            self.closed.set()

    monkeypatch.setattr(request_log, "open_record_file", Recording)
    clock = FakeClock()
    logger = RequestLogger(settings(max_file_seconds=5), str(tmp_path / "logs"), clock=clock)
    write(logger, clock, [clock.now])
    assert not opened[0].closed.is_set()
    clock.now += 5
    # The writer looks at the age of its files each time it wakes, at least every WRITE_INTERVAL_S.
    assert opened[0].closed.wait(10), "the idle file was not closed"
    logger.close()


def test_a_models_folder_keeps_at_most_max_files_the_oldest_deleted(tmp_path):
    folder = tmp_path / "logs" / MODEL
    folder.mkdir(parents=True)
    older = [folder / log_file_name(1_600_000_000.0 + i, 1, i) for i in range(2)]  # an earlier process's files
    for path in older:
        path.write_bytes(b"")
    (folder / "notes.txt").write_text("not a log")
    clock = FakeClock()
    logger = RequestLogger(settings(max_file_seconds=1, max_files=3), str(tmp_path / "logs"), clock=clock)
    write(logger, clock, [clock.now + 2 * i for i in range(6)])
    logger.close()
    files = log_files(str(tmp_path / "logs"), MODEL)
    assert len(files) == 3 and not any(p.exists() for p in older)
    assert [r.log_metadata.timestamp_secs for f in files for r in read_prediction_logs(f)] == [
        int(clock.now) - 4, int(clock.now) - 2, int(clock.now)]
    assert (folder / "notes.txt").exists()


def test_a_shared_folder_never_loses_another_writers_open_file(tmp_path):
    # Two servers on one ReadWriteMany claim: the second rotates a file per record and prunes to max_files at each,
    # while the first still writes the file it opened.
    clock = FakeClock()
    first = RequestLogger(settings(max_files=2), str(tmp_path / "logs"), clock=clock)
    write(first, clock, [clock.now])
    [open_file] = log_files(str(tmp_path / "logs"), MODEL)
    second = RequestLogger(settings(max_files=2, max_file_bytes=1), str(tmp_path / "logs"), clock=clock)
    write(second, clock, [clock.now + 0.1 * i for i in range(1, 5)])
    write(first, clock, [clock.now])
    assert Path(open_file).exists(), "a file started within twice max_file_seconds may still be written"
    first.close()
    assert len(list(read_prediction_logs(open_file))) == 2, "both of the first server's records are in its file"
    # Long after, every file is closed: the next rotation prunes the folder to max_files again.
    write(second, clock, [clock.now + 3 * settings().max_file_seconds])
    second.close()
    assert len(log_files(str(tmp_path / "logs"), MODEL)) == 2 and not Path(open_file).exists()


def test_an_unwritable_log_folder_leaves_requests_answered_and_counts_failures(repository, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("the log folder would be below this file")
    logger = RequestLogger(settings(), str(blocker / "logs"))
    server = start_server(repository, request_logger=logger)
    try:
        server.wait_until_available(MODEL, 2)
        for _ in range(3):
            status, body = http_json("POST", f"{server.rest_url}/v1/models/{MODEL}:predict", {"instances": [ROW]})
            assert status == 200 and body["predictions"][0] == pytest.approx(expected_probability(ROW, 2), rel=1e-6)
        grpc_predict(server.grpc_target, grpc_request())
        logger.flush()
        assert log_counts(server) == {"written": 0, "dropped": 0, "failed": 4, "verifier": 0}
    finally:
        server.stop()


def test_a_writer_that_fails_mid_run_is_counted_and_the_next_file_recovers(logged_server, tmp_path, monkeypatch):
    server = logged_server
    assert http_json("POST", f"{server.rest_url}/v1/models/{MODEL}:predict", {"instances": [ROW]})[0] == 200
    server.request_logger.flush()

    class Broken:
        def __init__(self, path: str) -> None:
            pass

        def write(self, record: bytes) -> None:
            raise tf.errors.UnavailableError(None, None, "the bucket went away")

        def close(self) -> None:
            pass

    opened = request_log.open_record_file
    monkeypatch.setattr(request_log, "open_record_file", Broken)
    # The open file fails too, from now on: its writer is swapped for a broken one.
    for files in server.request_logger._files.values():
        files.writer = Broken(files.path)
    for _ in range(2):
        assert http_json("POST", f"{server.rest_url}/v1/models/{MODEL}:predict", {"instances": [ROW]})[0] == 200
    grpc_predict(server.grpc_target, grpc_request())
    server.request_logger.flush()
    assert log_counts(server) == {"written": 1, "dropped": 0, "failed": 3, "verifier": 0}
    monkeypatch.setattr(request_log, "open_record_file", opened)
    assert http_json("POST", f"{server.rest_url}/v1/models/{MODEL}:predict", {"instances": [ROW]})[0] == 200
    server.request_logger.flush()
    assert log_counts(server) == {"written": 2, "dropped": 0, "failed": 3, "verifier": 0}
    server.stop()
    assert len(records(tmp_path / "logs")) == 2


def test_a_full_queue_drops_and_counts_instead_of_waiting(tmp_path):
    started, release = threading.Event(), threading.Event()

    def slow() -> LoggedPrediction:
        started.set()
        release.wait(10)
        return fixed_prediction()

    logger = RequestLogger(settings(queue_size=1), str(tmp_path / "logs"))
    logger.submit(MODEL, slow)
    assert started.wait(10)  # the writer holds the first record
    logger.submit(MODEL, fixed_prediction)  # fills the queue
    logger.submit(MODEL, fixed_prediction)  # dropped at once
    assert logger.metrics.value(MODEL, "dropped") == 1
    release.set()
    logger.close()
    assert logger.metrics.value(MODEL, "written") == 2
    assert len(records(tmp_path / "logs")) == 2


def test_request_logging_is_off_by_default_and_its_settings_are_checked():
    config = load_config(None)
    assert config.serving.request_log.enabled is False
    assert open_request_logger(config.serving.request_log, config.request_log_dir) is None
    assert config.request_log_dir == "outputs/request_logs"
    assert load_config(None, ["serving.request_log.directory=gs://bucket/logs"]).request_log_dir == "gs://bucket/logs"
    with pytest.raises(ConfigError, match="sampling_rate must be a share from 0 to 1"):
        load_config(None, ["serving.request_log.sampling_rate=1.5"])
    for key in ("max_file_bytes", "max_file_seconds", "max_files", "queue_size"):
        with pytest.raises(ConfigError, match=f"serving.request_log.{key} must be positive"):
            load_config(None, [f"serving.request_log.{key}=0"])


def test_the_page_shows_no_request_log_family_without_a_logger(server):
    assert http_json("POST", f"{server.rest_url}/v1/models/{MODEL}:predict", {"instances": [ROW]})[0] == 200
    with urllib.request.urlopen(f"{server.rest_url}/monitoring/prometheus/metrics", timeout=5) as response:
        assert REQUEST_LOG_COUNT not in response.read().decode()


@pytest.mark.parametrize("value", [np.array([b"Cash"], object), np.array([[b"a", b""], [b"bc", b"d"]], object),
                                   np.array([], object), np.array(b"x", object)])
def test_string_tensors_are_filled_as_make_tensor_proto_fills_them(value):
    from tensorflow.core.framework import tensor_pb2

    from serving.server.grpc.codec import array_to_tensor_proto

    # The REST records' string inputs (and gRPC's string outputs) take this path, at a fifth of make_tensor_proto's
    # cost per tensor.
    proto = tensor_pb2.TensorProto()
    array_to_tensor_proto(value, proto)
    assert proto == tf.make_tensor_proto(value)
