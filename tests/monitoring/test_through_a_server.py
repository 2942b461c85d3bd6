"""End to end through a real server: `mlops serve`'s server with its request logger on answers eval-split rows over
REST and gRPC (serving/clients/, as a user's client sends them), then the same rows with fare x 3 and a payment type
training never saw; `mlops monitor` over what the server logged finds nothing in the first window and exactly fare and
payment_type in the second, against the training data of the real pipeline run the served version carries."""
from __future__ import annotations

from monitoring.monitor import Window, monitor
from serving.clients import GrpcClient, RestClient
from serving.repository.local import ModelRepository
from serving.server.request_log import RequestLogger
from settings.config import RequestLogConfig, load_config
from tests.monitoring.conftest import MODEL
from tests.monitoring.test_monitor import shifted
from tests.serving.conftest import start_server

ROWS_PER_REQUEST = 4


def send(server, rows) -> int:
    """Half the rows over REST, half over gRPC, a few per request (the served model takes three of the features);
    returns the number of requests."""
    half = len(rows) // 2
    for client, part in ((RestClient(server.rest_url), rows[:half]), (GrpcClient(server.grpc_target), rows[half:])):
        answers = client.predict([{k: (v.decode() if isinstance(v, bytes) else v) for k, v in row.items()}
                                  for row in part], MODEL, drop_unknown_features=True,
                                 rows_per_request=ROWS_PER_REQUEST)
        assert len(answers) == len(part)
    return -(-half // ROWS_PER_REQUEST) + -(-(len(rows) - half) // ROWS_PER_REQUEST)


def test_a_shift_in_what_a_real_server_answered_is_found_in_its_own_logs(taxi_run, tmp_path):
    evaluation = taxi_run.splits["eval"]
    logger = RequestLogger(RequestLogConfig(enabled=True), str(tmp_path / "logs"))
    server = start_server(ModelRepository(taxi_run.config.serving_base_dir), request_logger=logger)
    config = load_config(None, [*taxi_run.overrides, f"serving.request_log.directory={tmp_path / 'logs'}",
                                f"monitoring.output_dir={tmp_path / 'out'}", "monitoring.min_requests=40"])
    try:
        server.wait_until_available(MODEL, taxi_run.version)
        like_training = send(server, evaluation)
        assert logger.flush()
        first = monitor(config, Window(last=like_training))
        changed = send(server, shifted(evaluation))
    finally:
        server.stop()
    assert first.exit_code == 0 and first.record["judged"] and first.record["flagged"] == []
    assert first.record["window"]["requests"] == like_training and first.record["window"]["rows"] == len(evaluation)
    served = {f["name"]: f for f in first.record["features"]}
    assert sorted(served) == ["fare", "payment_type", "trip_start_hour"], "the features the served model takes"
    assert all(not f["skew"]["crossed"] for f in served.values())

    second = monitor(config, Window(last=changed))
    record = second.record
    assert second.exit_code == 3 and record["flagged"] == ["fare", "payment_type"]
    assert record["version"] == taxi_run.version and record["window"]["rows"] == len(evaluation)
    assert record["previous"]["judged"] and record["previous"]["requests"] == like_training
    features = {f["name"]: f for f in record["features"]}
    assert features["fare"]["skew"]["crossed"] and features["fare"]["drift"]["crossed"]
    assert features["payment_type"]["skew"]["value"] == 1.0 and "Bitcoin" in features["payment_type"]["anomalies"][0]
    assert not features["trip_start_hour"]["flagged"]
    # The server's logger stamps each record: the window's span is when its requests were answered.
    assert record["window"]["from"] <= record["window"]["to"] <= record["finished_at"]
