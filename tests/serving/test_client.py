"""The clients against the server over both transports, and their retry, timeout and error behaviour."""
from __future__ import annotations

import json
import math
import socket
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest
from tensorflow_serving.apis import prediction_service_pb2_grpc

from serving.clients import (
    GrpcClient,
    InvalidInputError,
    ModelNotFoundError,
    RestClient,
    ServingTimeoutError,
    ServingUnavailableError,
    connect,
    convert_value,
)
from tests.serving.conftest import MODEL, ROW, expected_probability


@pytest.fixture(params=["rest", "grpc"])
def client(request, server):
    with connect(**{request.param: server.rest_url if request.param == "rest" else server.grpc_target}) as c:
        yield c


@pytest.mark.parametrize("version,label,answering", [(None, None, 2), (1, None, 1), (2, None, 2),
                                                     (None, "stable", 1), (None, "canary", 2)])
def test_predict_by_version_and_label(client, version, label, answering):
    rows = [ROW, {"fare": 40.0, "trip_start_hour": 23, "payment_type": "Credit Card"}]
    assert client.predict(rows, MODEL, version=version, label=label) == pytest.approx(
        [expected_probability(row, answering) for row in rows], abs=1e-6
    )
    assert client.predict(ROW, MODEL, version=version, label=label) == pytest.approx(
        [expected_probability(ROW, answering)], abs=1e-6
    )


def test_raw_values_are_converted_and_missing_ones_get_the_markers(client):
    as_csv_strings = {"fare": "2.5", "trip_start_hour": "7", "payment_type": "Cash"}
    missing = [{"fare": None, "trip_start_hour": "", "payment_type": None}, {"fare": math.nan}, {}]
    probabilities = client.predict([as_csv_strings, *missing], MODEL, version=1)
    assert probabilities[0] == pytest.approx(expected_probability(ROW, 1), abs=1e-6)
    # Missing: fare NaN (the model reads it as 0), hour -1, payment "".
    assert probabilities[1:] == pytest.approx([expected_probability({}, 1)] * 3, abs=1e-6)


def test_metadata_and_status(client):
    metadata = client.metadata(MODEL, label="stable")
    assert (metadata.name, metadata.version) == (MODEL, 1)
    serving_default = metadata.signatures["serving_default"]
    assert {name: spec.dtype for name, spec in serving_default.inputs.items()} == {
        "fare": "DT_FLOAT", "trip_start_hour": "DT_INT64", "payment_type": "DT_STRING"
    }
    assert serving_default.inputs["fare"].shape == (-1,)
    assert set(metadata.signatures) == {"serving_default", "scores"}
    assert [(s.version, s.state, s.error_code) for s in client.status(MODEL)] == [
        (2, "AVAILABLE", "OK"), (1, "AVAILABLE", "OK")
    ]
    assert [s.version for s in client.status(MODEL, label="canary")] == [2]


@pytest.mark.parametrize(
    "call,error,message",
    [
        (lambda c: c.predict(ROW, "nope"), ModelNotFoundError, "nope"),
        (lambda c: c.predict(ROW, MODEL, version=9), ModelNotFoundError, "9"),
        (lambda c: c.predict(ROW, MODEL, label="beta"), ModelNotFoundError, "beta"),
        (lambda c: c.status("nope"), ModelNotFoundError, "nope"),
        (lambda c: c.predict({**ROW, "fare": "twelve"}, MODEL), InvalidInputError, "'fare' expects DT_FLOAT"),
        (lambda c: c.predict({**ROW, "trip_start_hour": 7.5}, MODEL), InvalidInputError, "'trip_start_hour'"),
        (lambda c: c.predict({**ROW, "tips": 1.0}, MODEL), InvalidInputError, "does not take: ['tips']"),
        (lambda c: c.predict([ROW] * 9, MODEL), InvalidInputError, "maximum batch size 8"),
        (lambda c: c.predict(ROW, MODEL, signature_name="nope"), InvalidInputError, "no signature 'nope'"),
    ],
    ids=["unknown model", "unknown version", "unknown label", "status of unknown model", "bad float",
         "bad int", "unknown feature", "batch over the limit", "unknown signature"],
)
def test_typed_errors(client, call, error, message):
    with pytest.raises(error, match=message.replace("[", r"\[").replace("]", r"\]")):
        call(client)
    assert client.predict(ROW, MODEL) == pytest.approx([expected_probability(ROW, 2)], abs=1e-6)


def test_unknown_features_can_be_dropped(client):
    with_label_column = {**ROW, "tips": 3.0}
    assert client.predict(with_label_column, MODEL, drop_unknown_features=True) == pytest.approx(
        [expected_probability(ROW, 2)], abs=1e-6
    )


def test_convert_value_markers_and_types():
    assert math.isnan(convert_value("", "DT_FLOAT", "f"))
    assert convert_value(None, "DT_INT64", "i") == -1
    assert convert_value(float("nan"), "DT_STRING", "s") == ""
    assert convert_value("12", "DT_INT64", "i") == 12
    assert convert_value(12.0, "DT_INT64", "i") == 12
    assert convert_value(3, "DT_STRING", "s") == "3"
    with pytest.raises(InvalidInputError, match="'b'"):
        convert_value(True, "DT_FLOAT", "b")


class _StubHandler(BaseHTTPRequestHandler):
    """Answers every request with the next (status, body) of the server's script; counts requests."""

    def do_GET(self):  # noqa: N802
        server = self.server
        server.requests += 1
        status, body = server.script[min(server.requests, len(server.script)) - 1]
        if status == "hang":
            time.sleep(5)
            return
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def stub_rest():
    servers = []

    def start(script):
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), _StubHandler)
        httpd.daemon_threads = True
        httpd.script, httpd.requests = script, 0
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(httpd)
        return httpd

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


STATUS_BODY = {"model_version_status": [{"version": "4", "state": "AVAILABLE", "status": {"error_code": "OK"}}]}


def test_rest_retries_only_when_unavailable(stub_rest):
    flaky = stub_rest([(503, {"error": "loading"}), (503, {"error": "loading"}), (200, STATUS_BODY)])
    with RestClient(f"http://127.0.0.1:{flaky.server_address[1]}", retries=3, backoff_s=0.01) as client:
        assert [s.version for s in client.status(MODEL)] == [4]
    assert flaky.requests == 3

    down = stub_rest([(503, {"error": "overloaded"})])
    with RestClient(f"http://127.0.0.1:{down.server_address[1]}", retries=2, backoff_s=0.01) as client:
        with pytest.raises(ServingUnavailableError, match="overloaded"):
            client.status(MODEL)
    assert down.requests == 3

    for status in (400, 413, 431):  # a bad request, a body or headers over the server's limits: never retried
        refusing = stub_rest([(status, {"error": "bad request"})])
        with RestClient(f"http://127.0.0.1:{refusing.server_address[1]}", retries=3, backoff_s=0.01) as client:
            with pytest.raises(InvalidInputError, match="bad request"):
                client.status(MODEL)
        assert refusing.requests == 1


def test_rest_timeout(stub_rest):
    hanging = stub_rest([("hang", None)])
    started = time.monotonic()
    with RestClient(f"http://127.0.0.1:{hanging.server_address[1]}", retries=3) as client:
        with pytest.raises(ServingTimeoutError, match="within 0.3s"):
            client.status(MODEL, timeout=0.3)
    assert time.monotonic() - started < 3  # well before the stub's 5 s hang ends
    assert hanging.requests == 1  # timeouts are not retried


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_is_unavailable_after_retries():
    port = _closed_port()
    started = time.monotonic()
    with pytest.raises(ServingUnavailableError, match="is the server running"):
        RestClient(f"http://127.0.0.1:{port}", retries=2, backoff_s=0.01).status(MODEL)
    with pytest.raises(ServingUnavailableError, match="is the server running"):
        with GrpcClient(f"127.0.0.1:{port}", retries=2, backoff_s=0.01) as client:
            client.status(MODEL, timeout=2)
    assert time.monotonic() - started < 10


class _SlowPredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    def GetModelMetadata(self, request, context):  # noqa: N802
        time.sleep(2)
        context.abort(grpc.StatusCode.INTERNAL, "too late")


def test_grpc_timeout():
    slow = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(_SlowPredictionService(), slow)
    port = slow.add_insecure_port("127.0.0.1:0")
    slow.start()
    try:
        with GrpcClient(f"127.0.0.1:{port}") as client, pytest.raises(ServingTimeoutError, match="within 0.3s"):
            client.predict(ROW, MODEL, timeout=0.3)
    finally:
        slow.stop(0)


def test_a_stale_cached_signature_is_fetched_again_once(client):
    from dataclasses import replace

    real = client.metadata(MODEL, label="canary")
    serving_default = real.signatures["serving_default"]
    # As if a rollout moved the label to a version that takes one more input than the cached signature says.
    stale_inputs = {name: spec for name, spec in serving_default.inputs.items() if name != "payment_type"}
    stale = replace(real, signatures={"serving_default": replace(serving_default, inputs=stale_inputs)})
    client._metadata_cache[(MODEL, None, "canary")] = (time.monotonic(), stale)
    assert client.predict(ROW, MODEL, label="canary", drop_unknown_features=True) == pytest.approx(
        [expected_probability(ROW, 2)], abs=1e-6
    )
    # A pinned version is not retried: its signature cannot change.
    client._metadata_cache[(MODEL, 2, None)] = (time.monotonic(), stale)
    with pytest.raises(InvalidInputError, match="payment_type"):
        client.predict(ROW, MODEL, version=2, drop_unknown_features=True)


def test_one_line_per_row_for_each_task_kind():
    from serving.clients import format_prediction, numeric_values

    # A binary model's line is the probability alone, as `mlops predict` printed before task kinds.
    assert format_prediction({"probabilities": 0.25}) == "0.250000"
    assert format_prediction({"value": 151.5}) == "151.500000"
    multiclass = {"probabilities": [0.9, 0.075, 0.025], "classes": ["setosa", "versicolor", "virginica"],
                  "class": "setosa"}
    assert format_prediction(multiclass) == "setosa  setosa=0.900000 versicolor=0.075000 virginica=0.025000"
    # The numbers a canary compares: every probability, never the class names.
    assert numeric_values(multiclass) == [0.9, 0.075, 0.025]
    assert numeric_values({"value": 151.5}) == [151.5]


def test_a_canary_compares_every_class_probability():
    from rollout.verify import compare_answers

    stable = [{"probabilities": [0.9, 0.1], "classes": ["a", "b"], "class": "a"}]
    candidate = [{"probabilities": [0.9, 0.1003], "classes": ["a", "b"], "class": "a"}]
    assert compare_answers(stable, candidate) == (pytest.approx(3e-4), "")
    assert compare_answers([{"value": 10.0}], [{"value": 10.5}]) == (pytest.approx(0.5), "")
    # The class names are compared too, as they are.
    assert compare_answers(stable, [{**candidate[0], "class": "b"}])[1] == (
        "row 0 output 'class' is 'b', stable answers 'a'")
