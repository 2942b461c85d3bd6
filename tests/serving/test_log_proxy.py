"""`mlops log-proxy` in front of a real `mlops serve` process (standing for TF Serving): every REST and gRPC answer
through it is the server's own, errors included; its Prometheus page is the server's with the proxy's counts
appended; the predictions it logs are the records `mlops serve` itself writes for the same requests; and a server
that does not answer, or a log that cannot be written, costs no request more than TF Serving's own answer."""
from __future__ import annotations

import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import types
from pathlib import Path

import grpc
import pytest
import tensorflow as tf
from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2, model_pb2

from rollout.metrics import parse_prometheus_text
from serving.repository.local import ModelRepository
from serving.server.log_proxy import LogProxy
from serving.server.monitoring import METRICS_PATH, REQUEST_LOG_COUNT
from serving.server.request_log import RequestLogger, failure_files, log_files, read_failures, read_prediction_logs
from settings.config import RequestLogConfig
from tests.serving.conftest import MODEL, ROW, save_tiny_model
from tests.serving.test_failures import BAD_ROW, grpc_call, kept, rest_call, typed_grpc_request, verifier_counts
from tests.serving.test_request_log import grpc_request, verifier_and_user_predictions

REPO_ROOT = Path(__file__).resolve().parents[2]
PREDICTION_SERVICE = "/tensorflow.serving.PredictionService/"
MODEL_SERVICE = "/tensorflow.serving.ModelService/"
SERVING_READY = re.compile(r"serving REST on http://(\S+) and gRPC on (\S+)")
PROXY_READY = re.compile(r"proxying REST on http://(\S+) to \S+ and gRPC on (\S+) to")


class Process:
    """`python -m serving.cli <args>` on free loopback ports, its ready line parsed for its REST and gRPC ports."""

    def __init__(self, args: list[str], ready: re.Pattern, log_path: Path) -> None:
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "serving.cli", *args, "--rest-port", "0", "--grpc-port", "0"],
            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=self.log, text=True,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO_ROOT)},
        )
        for line in self.process.stdout:
            match = ready.search(line)
            if match:
                self.rest, self.grpc = match.groups()
                return
        raise RuntimeError(f"{args[0]} exited with {self.process.wait()}; see {log_path}")

    def stop(self) -> str:
        """SIGTERM, as the kubelet sends; returns what it printed after its ready line."""
        self.process.send_signal(signal.SIGTERM)
        try:
            rest = self.process.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            self.process.kill()
            rest = self.process.communicate()[0]
        self.log.close()
        return rest


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> ModelRepository:
    folder = tmp_path_factory.mktemp("proxy")
    repo = ModelRepository(folder / "models")
    for version, bias in ((1, -3.0), (2, 3.0)):
        repo.add_version(MODEL, save_tiny_model(folder / f"export-{version}", bias), version=version)
    repo.serve(MODEL, [1, 2], {"stable": 1, "canary": 2})
    return repo


@pytest.fixture(scope="module")
def upstream(repository, tmp_path_factory):
    """`mlops serve` without request logging: what TF Serving answers, here."""
    server = Process(["serve", "--model-config", str(repository.config_path), "--poll-seconds", "0"],
                     SERVING_READY, tmp_path_factory.mktemp("upstream") / "serve.log")
    try:
        yield server
    finally:
        server.stop()


def open_proxy(upstream: Process, directory: Path | None, **settings) -> LogProxy:
    logger = None
    if directory is not None:
        logger = RequestLogger(RequestLogConfig(enabled=True, **settings), str(directory),
                               random_source=random.Random(5))
    proxy = LogProxy(upstream.rest, upstream.grpc, "127.0.0.1", 0, 0, logger)
    proxy.start()
    return proxy


@pytest.fixture
def proxy(upstream, tmp_path):
    proxy = open_proxy(upstream, tmp_path / "logs")
    try:
        yield proxy
    finally:
        proxy.stop()


def http_call(address: str, method: str, path: str, body: bytes | None = None) -> tuple[int, str, bytes]:
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request(method, path, body, {"Content-Type": "application/json"} if body is not None else {})
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type"), response.read()
    finally:
        connection.close()


def rpc(target: str, method: str, request: bytes) -> tuple[str, str, bytes]:
    with grpc.insecure_channel(target) as channel:
        try:
            return "OK", "", channel.unary_unary(method)(request, timeout=10)
        except grpc.RpcError as e:
            return e.code().name, e.details(), b""


ROWS = json.dumps({"instances": [ROW, {**ROW, "fare": 30.0}]}).encode()
REST_CALLS = [
    ("POST", f"/v1/models/{MODEL}:predict", ROWS),
    ("POST", f"/v1/models/{MODEL}/labels/canary:predict", ROWS),
    ("POST", f"/v1/models/{MODEL}/versions/1:predict",
     json.dumps({"signature_name": "scores", "inputs": {k: [v] for k, v in ROW.items()}}).encode()),
    ("POST", f"/v1/models/{MODEL}:predict", b"{not json"),
    ("POST", f"/v1/models/{MODEL}:predict", json.dumps({"instances": [{"fare": 1.0}]}).encode()),
    ("POST", f"/v1/models/{MODEL}/versions/9:predict", ROWS),
    ("POST", "/v1/models/absent:predict", ROWS),
    ("POST", f"/v1/models/{MODEL}:classify", json.dumps({"examples": [ROW]}).encode()),
    ("GET", f"/v1/models/{MODEL}", None),
    ("GET", f"/v1/models/{MODEL}/labels/stable/metadata", None),
    ("GET", "/v1/models/absent", None),
    ("GET", "/somewhere/else", None),
]


def test_rest_answers_through_the_proxy_are_the_servers(proxy, upstream):
    for method, path, body in REST_CALLS:
        direct = http_call(upstream.rest, method, path, body)
        assert http_call(proxy.rest_url.removeprefix("http://"), method, path, body) == direct, (method, path)
    assert {http_call(upstream.rest, m, p, b)[0] for m, p, b in REST_CALLS} >= {200, 400, 404}


def model_spec(**fields) -> model_pb2.ModelSpec:
    spec = model_pb2.ModelSpec(name=fields.pop("name", MODEL))
    if "version" in fields:
        spec.version.value = fields.pop("version")
    return model_pb2.ModelSpec(**fields) if fields else spec


def test_grpc_answers_and_statuses_through_the_proxy_are_the_servers(proxy, upstream):
    metadata = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"],
                                                              model_spec=model_spec(version_label="canary"))
    calls = [
        (PREDICTION_SERVICE + "Predict", grpc_request()),
        (PREDICTION_SERVICE + "Predict", grpc_request(label="stable")),
        (PREDICTION_SERVICE + "Predict", grpc_request(version=9)),
        (PREDICTION_SERVICE + "Predict", b"\x0a\xff"),
        (PREDICTION_SERVICE + "GetModelMetadata", metadata.SerializeToString()),
        (PREDICTION_SERVICE + "Classify", b""),
        (MODEL_SERVICE + "GetModelStatus",
         get_model_status_pb2.GetModelStatusRequest(model_spec=model_spec()).SerializeToString()),
        ("/no.such.Service/Method", b""),
    ]
    codes = set()
    for method, request in calls:
        direct = rpc(upstream.grpc, method, request)
        assert rpc(proxy.grpc_target, method, request) == direct, method
        codes.add(direct[0])
    assert codes >= {"OK", "NOT_FOUND", "INVALID_ARGUMENT", "UNIMPLEMENTED"}


def test_the_metrics_page_is_the_servers_with_the_proxys_counts_appended(upstream, tmp_path):
    proxy = open_proxy(upstream, tmp_path / "logs")
    try:
        assert http_call(proxy.rest_url.removeprefix("http://"), "GET", METRICS_PATH) == http_call(
            upstream.rest, "GET", METRICS_PATH), "nothing counted yet: the server's page alone"
        assert rpc(proxy.grpc_target, PREDICTION_SERVICE + "Predict", grpc_request())[0] == "OK"
        proxy.request_logger.flush()
        status, content_type, page = http_call(proxy.rest_url.removeprefix("http://"), "GET", METRICS_PATH)
        _, _, server_page = http_call(upstream.rest, "GET", METRICS_PATH)
    finally:
        proxy.stop()
    assert status == 200 and content_type.startswith("text/plain")
    assert page.startswith(server_page)
    counts = {s.labels["status"]: s.value for s in parse_prometheus_text(page.decode()) if s.name == REQUEST_LOG_COUNT}
    assert counts == {"written": 1, "dropped": 0, "failed": 0, "verifier": 0}
    assert page.decode().count(f"# TYPE {REQUEST_LOG_COUNT} counter") == 1


def test_proxied_predictions_are_logged_as_mlops_serve_logs_them(repository, tmp_path):
    """Both sides as the commands they run as (the sidecar's and the local server's), stopped by SIGTERM."""
    server_logs, proxy_logs = tmp_path / "server-logs", tmp_path / "proxy-logs"
    server = Process(["serve", "--model-config", str(repository.config_path), "--poll-seconds", "0",
                      "--set", "serving.request_log.enabled=true",
                      "--set", f"serving.request_log.directory={server_logs}"], SERVING_READY, tmp_path / "serve.log")
    try:
        proxy = Process(["log-proxy", "--upstream-rest", server.rest, "--upstream-grpc", server.grpc,
                         "--set", "serving.request_log.enabled=true",
                         "--set", f"serving.request_log.directory={proxy_logs}"], PROXY_READY, tmp_path / "proxy.log")
        try:
            for _, path, body in REST_CALLS[:3]:
                assert http_call(proxy.rest, "POST", path, body)[0] == 200
            for request in (grpc_request(), grpc_request(label="canary")):
                assert rpc(proxy.grpc, PREDICTION_SERVICE + "Predict", request)[0] == "OK"
            assert http_call(proxy.rest, "POST", *REST_CALLS[3][1:])[0] == 400  # answered, not logged
        finally:
            assert "proxy stopped" in proxy.stop()
    finally:
        assert "server stopped" in server.stop()

    def logged(directory: Path) -> list:
        found = [r for path in log_files(str(directory), MODEL) for r in read_prediction_logs(path)]
        for record in found:
            record.log_metadata.ClearField("timestamp_secs")  # the two wrote each record at their own time
        return found

    from_server, from_proxy = logged(server_logs), logged(proxy_logs)
    assert len(from_proxy) == 5
    assert from_proxy == from_server
    versions = [(r.log_metadata.model_spec.version.value, r.predict_log.request.model_spec.version_label)
                for r in from_proxy]
    assert versions == [(2, ""), (2, "canary"), (1, ""), (2, ""), (2, "canary")]


def free_address() -> str:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_a_server_that_does_not_answer_gets_503_and_unavailable(tmp_path):
    closed = types.SimpleNamespace(rest=free_address(), grpc=free_address())
    proxy = open_proxy(closed, tmp_path / "logs")
    try:
        status, content_type, body = http_call(proxy.rest_url.removeprefix("http://"), "POST",
                                          f"/v1/models/{MODEL}:predict", ROWS)
        assert (status, content_type) == (503, "application/json")
        assert json.loads(body)["error"].startswith(f"TF Serving at {closed.rest} did not answer")
        assert rpc(proxy.grpc_target, PREDICTION_SERVICE + "Predict", grpc_request())[0] == "UNAVAILABLE"
    finally:
        proxy.stop()
    assert not log_files(str(tmp_path / "logs"), MODEL)


def test_an_unwritable_log_leaves_proxied_requests_answered_and_counts_failures(upstream, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("the log folder would be below this file")
    proxy = open_proxy(upstream, blocker / "logs", sampling_rate=0.5)
    try:
        for index in range(12):
            if index % 2:
                assert rpc(proxy.grpc_target, PREDICTION_SERVICE + "Predict", grpc_request())[0] == "OK"
            else:
                assert http_call(proxy.rest_url.removeprefix("http://"), "POST", f"/v1/models/{MODEL}:predict",
                            ROWS)[0] == 200
        proxy.request_logger.flush()
        counts = {status: proxy.request_logger.metrics.value(MODEL, status)
                  for status in ("written", "dropped", "failed", "verifier")}
    finally:
        proxy.stop()
    # random.Random(5): 3 of its first 12 draws are below 0.5.
    assert counts == {"written": 0, "dropped": 0, "failed": 3, "verifier": 0}


def test_the_proxy_leaves_the_verifiers_predictions_out_of_the_logs_and_counts_them(proxy, tmp_path):
    verifier_and_user_predictions(proxy.rest_url, proxy.grpc_target)
    proxy.request_logger.flush()
    counts = {status: proxy.request_logger.metrics.value(MODEL, status)
              for status in ("written", "dropped", "failed", "verifier")}
    assert counts == {"written": 2, "dropped": 0, "failed": 0, "verifier": 3}
    logged = [r for path in log_files(str(tmp_path / "logs"), MODEL) for r in read_prediction_logs(path)]
    assert [r.predict_log.request.model_spec.version_label for r in logged] == ["", ""]


def test_the_proxy_keeps_what_tf_serving_refused_on_both_transports(upstream, tmp_path):
    proxy = open_proxy(upstream, tmp_path / "logs")
    try:
        assert rest_call(proxy.rest_url, f"/v1/models/{MODEL}/versions/2:predict",
                         json.dumps({"instances": [BAD_ROW, ROW]}).encode()) == 400
        refused = grpc_call(proxy.grpc_target, typed_grpc_request([3.0], [9], tf.int32))
        assert refused == grpc.StatusCode.INVALID_ARGUMENT
        assert rest_call(proxy.rest_url, f"/v1/models/{MODEL}:predict", b"{not json", verifier=True) == 400
        failures = kept(proxy.rest_url)
        proxy.request_logger.flush()
        logged = [f for path in failure_files(str(tmp_path / "logs"), MODEL) for f in read_failures(path)]
    finally:
        proxy.stop()
    assert [(f["transport"], f["version"], f["code"], f["traffic"]) for f in failures] == [
        ("rest", 2, "HTTP 400", "users"), ("grpc", None, "INVALID_ARGUMENT", "users"),
        ("rest", None, "HTTP 400", "verifier")]
    assert failures[0]["rows"] == [BAD_ROW, ROW] and failures[2]["rows"] == [{"body": "{not json"}]
    assert "trip_start_hour" in failures[0]["message"] and failures[1]["rows"][0]["fare"] == 3.0
    assert [f["code"] for f in logged] == ["HTTP 400", "INVALID_ARGUMENT"], "the verifier's stays out of the log"


def test_the_proxy_counts_the_verifiers_predictions_apart(proxy):
    verifier_and_user_predictions(proxy.rest_url, proxy.grpc_target)  # 2 of the users', 3 of the verifier's
    assert rest_call(proxy.rest_url, f"/v1/models/{MODEL}:predict", b"{not json", verifier=True) == 400
    refused = grpc_call(proxy.grpc_target, typed_grpc_request([1.0], [7], tf.int32), verifier=True)
    assert refused == grpc.StatusCode.INVALID_ARGUMENT
    assert rest_call(proxy.rest_url, f"/v1/models/{MODEL}:predict", b"{not json") == 400  # a user's: not counted
    assert verifier_counts(proxy.rest_url) == {"OK": 3, "HTTP 400": 1, "INVALID_ARGUMENT": 1}


def test_the_proxy_keeps_the_answers_to_requests_with_an_id_on_both_transports(proxy, upstream):
    """What the shadow step joins on a cluster: TF Serving keeps nothing, its sidecar keeps the answers it passed."""
    from serving import REQUEST_ID_HEADER, TRAFFIC_HEADER, VERIFIER_TRAFFIC
    from tests.serving.conftest import expected_probability, http_json

    rows = [ROW, {**ROW, "fare": 30.0}]
    for path, headers in ((f"/v1/models/{MODEL}:predict", {REQUEST_ID_HEADER: "rest-a"}),
                          (f"/v1/models/{MODEL}/versions/1:predict", {REQUEST_ID_HEADER: "rest-b"}),
                          (f"/v1/models/{MODEL}:predict", {}),
                          (f"/v1/models/{MODEL}:predict", {REQUEST_ID_HEADER: "v", TRAFFIC_HEADER: VERIFIER_TRAFFIC})):
        connection = http.client.HTTPConnection(*proxy.rest_url.split("://", 1)[1].split(":"), timeout=10)
        connection.request("POST", path, json.dumps({"instances": rows}).encode(),
                           {"Content-Type": "application/json", **headers})
        assert connection.getresponse().status == 200
        connection.close()
    with grpc.insecure_channel(proxy.grpc_target) as channel:
        channel.unary_unary(PREDICTION_SERVICE + "Predict")(typed_grpc_request([1.0, 2.5], [7, 8], version=1),
                                                              timeout=10,
                                                              metadata=[(REQUEST_ID_HEADER, "grpc-a")])
    status, answer = http_json("GET", f"{proxy.rest_url}/monitoring/answers/{MODEL}/0")
    assert status == 200
    kept_answers = answer["answers"]
    assert [(a["request_id"], a["transport"], a["version"], a["row_count"]) for a in kept_answers] == [
        ("rest-a", "rest", None, 2), ("rest-b", "rest", 1, 2), ("grpc-a", "grpc", 1, 2)]
    assert kept_answers[0]["rows"] == rows
    # The unversioned request went to the highest version, 2, as TF Serving's default policy serves.
    assert kept_answers[0]["outputs"] == {"predictions": pytest.approx([expected_probability(r, 2) for r in rows],
                                                                       abs=1e-6)}
    assert kept_answers[2]["outputs"] == {"probabilities": pytest.approx(
        [expected_probability({**ROW, "fare": f, "trip_start_hour": h}, 1) for f, h in ((1.0, 7), (2.5, 8))],
        abs=1e-6)}
    assert all(a["latency_ms"] > 0 for a in kept_answers)
