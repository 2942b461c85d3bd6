"""Issue 14's findings as a hostile or busy client meets them: each is refused cheaply, answered in JSON, or bounded."""
from __future__ import annotations

import json
import logging
import socket
import threading
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from serving import ServingLimits
from serving.server.batching import BatchingParameters
from serving.server.servable import Signature
from tests.serving.conftest import FEATURES, MODEL, ROW, expected_probability, http_json, start_server, wait_for
from tests.serving.test_rest_protocol import raw_exchange, split_response

PREDICT = f"/v1/models/{MODEL}:predict"


def predict_request(rows: list[dict]) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL
    for name, dtype in FEATURES.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto([row[name] for row in rows], dtype=dtype))
    return request


@pytest.fixture
def stub(server):
    with grpc.insecure_channel(server.grpc_target, options=[("grpc.max_send_message_length", 1 << 28)]) as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


@pytest.fixture
def limited(repository):
    """A server with small limits: 3 connections, 2 requests in flight, 0.5 s for headers and bodies."""
    limits = ServingLimits(max_request_bytes=64 * 1024, max_in_flight_requests=2, max_connections=3,
                           header_timeout_s=0.5, body_timeout_s=0.5, max_header_bytes=4096)
    server = start_server(repository, limits=limits)
    try:
        yield server
    finally:
        server.stop()


def assert_still_serving(server) -> None:
    status, body = http_json("POST", server.rest_url + PREDICT, {"instances": [ROW]})
    assert status == 200 and body["predictions"] == pytest.approx([expected_probability(ROW, 2)])


# -- 1. a request's cost is bounded before work starts ---------------------------------------------------------
def test_grpc_values_beyond_the_declared_shape_are_refused_before_any_array(stub, monkeypatch):
    built = []
    monkeypatch.setattr(tf, "make_ndarray", lambda *a, **k: built.append(a) or pytest.fail("array built"))
    request = predict_request([ROW])
    request.inputs["payment_type"].string_val.extend([b"x"] * 1000)  # shape still [1]
    with pytest.raises(grpc.RpcError) as error:
        stub.Predict(request, timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "declares shape [1] (1 elements) but carries 1001 values" in error.value.details()
    assert not built


def test_a_large_grpc_message_is_sized_up_from_its_wire_bytes_before_parsing(stub, monkeypatch):
    from serving.server.grpc import servicer

    parsed = []
    real_request = servicer.predict_pb2.PredictRequest

    class RecordingRequest:
        def __new__(cls, *args, **kwargs):
            parsed.append(True)
            return real_request(*args, **kwargs)

    request = predict_request([ROW])
    request.inputs["payment_type"].string_val.extend([b"ab"] * 600_000)  # ~2.4 MB, declared shape [1]
    monkeypatch.setattr(servicer.predict_pb2, "PredictRequest", RecordingRequest)
    with pytest.raises(grpc.RpcError) as error:
        stub.Predict(request, timeout=30)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Input payment_type carries more than 8 values" in error.value.details()
    assert not parsed  # refused from the wire bytes; the message was never parsed


def test_a_rest_body_of_far_more_values_than_a_batch_is_refused_before_parsing(server, monkeypatch):
    from serving.server.rest import endpoints

    parsed = []
    real_parse = endpoints.parse_json_body
    monkeypatch.setattr(endpoints, "parse_json_body", lambda body: parsed.append(1) or real_parse(body))
    body = json.dumps({"inputs": {"payment_type": ["ab"] * 20_000, "fare": [1.0], "trip_start_hour": [1]}})
    status, response = http_json("POST", server.rest_url + PREDICT, raw=body.encode())
    assert status == 400 and "JSON values, more than the" in response["error"]
    assert not parsed
    monkeypatch.undo()
    assert_still_serving(server)


def test_rows_over_the_batch_limit_are_refused_before_conversion(server, monkeypatch):
    from serving.server.rest import codec

    converted = []
    monkeypatch.setattr(codec, "json_to_array", lambda *a: converted.append(1) or pytest.fail("converted"))
    status, response = http_json("POST", server.rest_url + PREDICT, {"instances": [ROW] * 9})
    assert status == 400 and "Batch size 9 is larger than the maximum batch size 8" in response["error"]
    columns = {name: [ROW[name]] * 9 for name in ROW}
    status, response = http_json("POST", server.rest_url + PREDICT, {"inputs": columns})
    assert status == 400 and "Batch size 9" in response["error"]
    assert not converted


def test_a_body_over_the_limit_is_refused_by_its_declared_length_and_unread(limited):
    status, headers, payload = split_response(raw_exchange(
        limited.rest_port, f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\nContent-Length: {64 * 1024 + 1}\r\n\r\n".encode()
    ))
    assert status == 413 and headers["connection"] == "close"
    assert "over the limit of 65536 bytes" in json.loads(payload)["error"]


def test_a_chunked_body_over_the_limit_is_refused_as_it_arrives(limited):
    chunk = b"x" * 40_000
    request = (f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
               + (f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n") * 2 + b"0\r\n\r\n")
    status, _, payload = split_response(raw_exchange(limited.rest_port, request))
    assert status == 413 and "Request body is over the limit of 65536" in json.loads(payload)["error"]


def test_requests_past_the_in_flight_bound_get_unavailable_on_both_transports(limited, monkeypatch):
    gate = threading.Event()
    running = []
    real_run = Signature.run

    def held_run(self, inputs):
        running.append(1)
        gate.wait(20)
        return real_run(self, inputs)

    monkeypatch.setattr(Signature, "run", held_run)
    results = []
    held = [threading.Thread(target=lambda: results.append(http_json("POST", limited.rest_url + PREDICT,
                                                                       {"instances": [ROW]})))
            for _ in range(2)]
    for thread in held:
        thread.start()
    wait_for(lambda: limited.admission.requests == 2, what="two requests in flight")
    try:
        status, response = http_json("POST", limited.rest_url + PREDICT, {"instances": [ROW]})
        assert status == 503 and "Server is overloaded: 2 requests in flight" in response["error"]
        with grpc.insecure_channel(limited.grpc_target) as channel:
            with pytest.raises(grpc.RpcError) as error:
                prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(predict_request([ROW]), timeout=10)
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE
        # Status stays available while predictions are overloaded.
        assert http_json("GET", f"{limited.rest_url}/v1/models/{MODEL}")[0] == 200
    finally:
        gate.set()
        for thread in held:
            thread.join(20)
    assert [status for status, _ in results] == [200, 200]
    assert (limited.admission.requests, limited.admission.bytes) == (0, 0)


# -- 3. backlog ------------------------------------------------------------------------------------------------
def test_a_burst_of_connections_waits_in_the_backlog_while_the_server_is_busy(server):
    # The event loop is stalled for a second: the kernel must complete every handshake meanwhile (listen backlog).
    server._loop.call_soon_threadsafe(time.sleep, 1.5)
    connections = []
    try:
        for _ in range(120):  # under the kernel's cap on any backlog on older kernels (somaxconn 128)
            connection = socket.create_connection(("127.0.0.1", server.rest_port), timeout=0.5)
            connections.append(connection)
        for connection in connections[:20]:
            connection.sendall(f"GET /v1/models/{MODEL} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        for connection in connections[:20]:
            connection.settimeout(15)
            assert connection.recv(65536).startswith(b"HTTP/1.1 200")
    finally:
        for connection in connections:
            connection.close()


# -- 4. slow clients and connection count ----------------------------------------------------------------------
def test_a_client_sending_headers_byte_by_byte_is_cut_off(limited):
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", limited.rest_port), timeout=10) as connection:
        received = b""
        for byte in f"GET /v1/models/{MODEL} HTTP/1.1\r\nHost: x\r\nX-Slow: ".encode() + b"a" * 100:
            try:
                connection.sendall(bytes([byte]))
            except OSError:
                break
            time.sleep(0.1)
            connection.setblocking(False)
            try:
                chunk = connection.recv(65536)
            except BlockingIOError:
                chunk = None
            connection.setblocking(True)
            if chunk is not None:
                received += chunk
                if not chunk:
                    break
    elapsed = time.monotonic() - started
    assert elapsed < 5, "the slow client kept its connection"
    status, _, payload = split_response(received)
    assert status == 408 and "did not arrive within 0.5 s" in json.loads(payload)["error"]
    assert_still_serving(limited)


def test_a_connection_that_sends_nothing_is_closed(limited):
    with socket.create_connection(("127.0.0.1", limited.rest_port), timeout=5) as connection:
        assert connection.recv(65536).startswith(b"HTTP/1.1 408")
        assert connection.recv(65536) == b""


def test_a_body_that_stops_arriving_is_cut_off(limited):
    status, _, payload = split_response(raw_exchange(
        limited.rest_port, f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{{\"inst".encode()
    ))
    assert status == 408 and "body did not arrive" in json.loads(payload)["error"]
    assert limited.admission.requests == 0


def test_headers_over_the_size_limit_get_431(limited):
    status, _, payload = split_response(raw_exchange(
        limited.rest_port, f"GET /v1/models/{MODEL} HTTP/1.1\r\nHost: x\r\nX-Big: {'a' * 5000}\r\n\r\n".encode()
    ))
    assert status == 431 and "over 4096 bytes" in json.loads(payload)["error"]


def test_connections_past_the_limit_get_503_and_a_freed_slot_serves_again(limited):
    idle = [socket.create_connection(("127.0.0.1", limited.rest_port), timeout=5) for _ in range(3)]
    try:
        time.sleep(0.1)  # the server has accepted them
        status, headers, payload = split_response(raw_exchange(
            limited.rest_port, f"GET /v1/models/{MODEL} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        ))
        assert status == 503 and "too many open connections" in json.loads(payload)["error"]
        assert headers["connection"] == "close"
    finally:
        for connection in idle:
            connection.close()
    wait_for(lambda: http_json("GET", f"{limited.rest_url}/v1/models/{MODEL}")[0] == 200, timeout_s=5,
             what="a connection slot")


# -- 5. deep nesting -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("depth,message", [
    (100, "nests JSON 103 levels deep, more than the 4"),
    (500, "JSON values, more than the"),  # so many brackets are too many values already
    (100_000, "JSON values, more than the"),
])
def test_deeply_nested_values_get_400_without_a_traceback(server, caplog, depth, message):
    caplog.set_level(logging.WARNING)
    nested = "[" * depth + "1.0" + "]" * depth
    body = f'{{"instances": [{{"fare": {nested}, "trip_start_hour": 7, "payment_type": "Cash"}}]}}'
    status, response = http_json("POST", server.rest_url + PREDICT, raw=body.encode())
    assert status == 400 and message in response["error"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert_still_serving(server)


# -- 6. fairness between transports ----------------------------------------------------------------------------
@pytest.mark.parametrize("batching", [
    None, BatchingParameters(max_batch_size=8, batch_timeout_micros=500, num_batch_threads=2),
], ids=["batching off", "batching on"])
def test_mixed_load_serves_both_transports(repository, batching):
    # Four clients on each transport for a second and a half: neither may be starved (the benchmark measures how
    # fair; here each must get a good share of the answers).
    server = start_server(repository, batching=batching, grpc_workers=8)
    counts = {"rest": 0, "grpc": 0}
    stop = time.monotonic() + 1.5

    def rest_client():
        import http.client

        connection = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=10)
        body = json.dumps({"instances": [ROW]})
        while time.monotonic() < stop:
            connection.request("POST", PREDICT, body, {"Content-Type": "application/json"})
            assert connection.getresponse().read()
            counts["rest"] += 1

    def grpc_client():
        with grpc.insecure_channel(server.grpc_target) as channel:
            predict = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict
            request = predict_request([ROW])
            while time.monotonic() < stop:
                predict(request, timeout=10)
                counts["grpc"] += 1

    try:
        clients = [threading.Thread(target=f) for f in [rest_client] * 4 + [grpc_client] * 4]
        for client in clients:
            client.start()
        for client in clients:
            client.join(20)
        stats = server.scheduler.stats
    finally:
        server.stop()
    total = counts["rest"] + counts["grpc"]
    assert total > 20, counts
    assert min(counts.values()) >= 0.2 * total, counts
    if batching is not None:  # the transports' requests shared batches
        assert stats.mixed_transport_batches > 0 and stats.batches < stats.tasks, stats


# -- 7. contract gaps ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("literal,message", [
    ("1e39", "1e+39 is out of range for float"), ("-1e39", "out of range for float"),
    ("1e400", "too big to be stored in a double"), ("1000000000000000000000000000000000000000", "out of range"),
])
def test_floats_out_of_float32_range_get_400(server, literal, message):
    for body in (f'{{"instances": [{{"fare": {literal}, "trip_start_hour": 7, "payment_type": "Cash"}}]}}',
                 f'{{"inputs": {{"fare": [{literal}], "trip_start_hour": [7], "payment_type": ["Cash"]}}}}'):
        status, response = http_json("POST", server.rest_url + PREDICT, raw=body.encode())
        assert status == 400, response
        assert message in response["error"]


@pytest.mark.parametrize("count", [1, 200])  # a few values are checked in Python, many with numpy
def test_float_columns_are_range_checked_however_long(count):
    from serving.server.rest.codec import leaf_type

    leaf = leaf_type(types_pb2.DT_FLOAT)
    largest = float(np.finfo(np.float32).max)
    assert leaf.fast_column([1.0] * (count - 1) + [largest]).dtype == np.float32
    with pytest.raises(ValueError, match="out of range for float"):
        leaf.fast_column([1.0] * (count - 1) + [1e39])
    with pytest.raises(ValueError, match="out of range for float"):
        leaf.fast_column([1] * (count - 1) + [-(10**39)])


def test_the_largest_float32_and_infinity_are_accepted(server):
    largest = float(np.finfo(np.float32).max)
    for fare in (repr(largest), "Infinity", "-Infinity", "NaN"):
        body = f'{{"instances": [{{"fare": {fare}, "trip_start_hour": 7, "payment_type": "Cash"}}]}}'
        status, response = http_json("POST", server.rest_url + PREDICT, raw=body.encode())
        assert status == 200, (fare, response)


@pytest.mark.parametrize("method", ["PATCH", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"])
def test_every_method_gets_a_json_error(server, method):
    status, headers, payload = split_response(raw_exchange(
        server.rest_port, f"{method} /v1/models/{MODEL} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    ))
    assert status == 400 and headers["content-type"] == "application/json"
    if method != "HEAD":  # HEAD answers carry headers only
        assert f"Malformed request: {method} /v1/models/{MODEL}" in json.loads(payload)["error"]


@pytest.mark.parametrize("length", ["4_10", "abc", "-1", "1e3", "12 34"])
def test_a_malformed_content_length_gets_a_json_400(server, length):
    status, headers, payload = split_response(raw_exchange(
        server.rest_port, f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n{{}}".encode()
    ))
    assert status == 400 and headers["connection"] == "close"
    assert "not valid HTTP/1.1" in json.loads(payload)["error"]
    assert_still_serving(server)


@pytest.mark.parametrize("framing", [
    "Content-Length: 2\r\nContent-Length: 3",  # two lengths: which one ends the body?
    "Content-Length: 2\r\nTransfer-Encoding: chunked",  # both framings: the classic request-smuggling shape
])
def test_ambiguous_body_framing_gets_a_json_400(server, framing):
    status, _, payload = split_response(raw_exchange(
        server.rest_port, f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\n{framing}\r\n\r\n{{}}".encode()
    ))
    assert status == 400 and "not valid HTTP/1.1" in json.loads(payload)["error"]


def test_an_int64_tensor_over_grpc_at_the_declared_count_is_accepted(stub):
    request = predict_request([ROW, ROW])
    request.inputs["trip_start_hour"].CopyFrom(tf.make_tensor_proto(np.array([7, 7], np.int64)))
    assert request.inputs["trip_start_hour"].dtype == types_pb2.DT_INT64
    response = stub.Predict(request, timeout=10)
    assert tf.make_ndarray(response.outputs["probabilities"]).tolist() == pytest.approx(
        [expected_probability(ROW, 2)] * 2
    )
