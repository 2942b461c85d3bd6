"""Answers kept under their request ids (serving/server/answers.py), what the shadow step joins: `mlops serve` keeps a
prediction's answer, over REST and gRPC, when the request carries an x-request-id (as every request Envoy routes
does), and answers them at /monitoring/answers/NAME/SINCE; the verifier's and unmarked requests are not kept."""
from __future__ import annotations

import json
import time
import urllib.request

import grpc
import numpy as np
import pytest
import tensorflow as tf

from serving import REQUEST_ID_HEADER, TRAFFIC_HEADER, VERIFIER_TRAFFIC, request_id
from serving.server.answers import MAX_ROWS, RecentAnswers, per_row_outputs
from tests.serving.conftest import MODEL, ROW, expected_probability, http_json, start_server
from tests.serving.test_failures import PREDICT, typed_grpc_request


def answers(base_url: str, since_ms: int = 0, model: str = MODEL) -> dict:
    status, answer = http_json("GET", f"{base_url}/monitoring/answers/{model}/{since_ms}")
    assert status == 200, answer
    return answer


def rest_predict(base_url: str, rows: list[dict], headers: dict[str, str]) -> int:
    request = urllib.request.Request(f"{base_url}/v1/models/{MODEL}/versions/1:predict",
                                     data=json.dumps({"instances": rows}).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **headers})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status


def grpc_predict(target: str, metadata: list[tuple[str, str]]) -> None:
    with grpc.insecure_channel(target) as channel:
        channel.unary_unary(PREDICT)(typed_grpc_request([1.0, 2.5], [7, 8], version=1), timeout=10,
                                     metadata=metadata)


@pytest.fixture
def wide_server(repository):
    """A server taking batches of more rows than an answer keeps."""
    model_server = start_server(repository, max_batch_size=4 * MAX_ROWS)
    try:
        model_server.wait_until_available(MODEL, 1)
        yield model_server
    finally:
        model_server.stop()


def test_answers_to_requests_with_an_id_are_kept_with_outputs_inputs_and_time(wide_server):
    server = wide_server
    url = server.rest_url
    rows = [{**ROW, "fare": float(i)} for i in range(MAX_ROWS + 2)]
    assert rest_predict(url, rows, {REQUEST_ID_HEADER: "rest-1"}) == 200
    grpc_predict(server.grpc_target, [(REQUEST_ID_HEADER, "grpc-1")])
    assert rest_predict(url, [ROW], {}) == 200, "no id: nothing to join, not kept"
    assert rest_predict(url, [ROW], {REQUEST_ID_HEADER: "verifier-1", TRAFFIC_HEADER: VERIFIER_TRAFFIC}) == 200
    grpc_predict(server.grpc_target, [(REQUEST_ID_HEADER, "verifier-2"), (TRAFFIC_HEADER, VERIFIER_TRAFFIC)])
    kept = answers(url)
    assert [(a["request_id"], a["transport"], a["version"], a["row_count"]) for a in kept["answers"]] == [
        ("rest-1", "rest", 1, MAX_ROWS + 2), ("grpc-1", "grpc", 1, 2)]
    rest, grpc_answer = kept["answers"]
    assert rest["rows"] == rows[:MAX_ROWS]
    assert rest["outputs"]["probabilities"] == pytest.approx([expected_probability(r, 1) for r in rows[:MAX_ROWS]],
                                                             abs=1e-6)
    assert grpc_answer["rows"][1] == {"fare": 2.5, "trip_start_hour": 8, "payment_type": "Cash"}
    assert rest["latency_ms"] > 0 and rest["number"] < grpc_answer["number"]
    # Read from the second answer's millisecond (a gRPC channel opened between them): only it.
    assert grpc_answer["time"] - rest["time"] > 0.001
    later = answers(url, int(grpc_answer["time"] * 1000))["answers"]
    assert [a["request_id"] for a in later] == ["grpc-1"]
    assert answers(url, model="absent")["answers"] == []
    status, answer = http_json("GET", f"{url}/monitoring/answers/{MODEL}")
    assert status == 404 and "GET /monitoring/answers/NAME/SINCE" in answer["error"]


def test_recent_answers_keep_the_newest_and_say_when_older_ones_were_dropped():
    clock = iter(range(1, 100))
    kept = RecentAnswers(clock=lambda: float(next(clock)), kept=3)
    arrays = {"fare": np.array([1.0, 2.0], np.float32), "payment_type": np.array([b"Cash", b"Credit"], object)}
    for i in range(4):
        kept.add(f"id-{i}", MODEL, 1, "rest", 0.002, arrays, {"probabilities": np.array([[0.25], [0.75]])})
    kept.add("", MODEL, 1, "rest", 0.002, arrays, {})  # no id: not kept
    found, oldest, dropped = kept.since(MODEL, 0)
    assert [a.request_id for a in found] == ["id-1", "id-2", "id-3"] and (oldest, dropped) == (2.0, True)
    assert found[0].outputs == {"probabilities": [0.25, 0.75]} and found[0].latency_ms == 2.0
    assert found[0].rows == [{"fare": 1.0, "payment_type": "Cash"}, {"fare": 2.0, "payment_type": "Credit"}]
    assert [a.request_id for a in kept.since(MODEL, 3.0)[0]] == ["id-3"]


def test_only_outputs_with_one_value_per_row_are_kept():
    outputs = {"probabilities": tf.constant([0.5, float("nan")]), "class": np.array([b"yes", b"no"], object),
               "scores": np.zeros((2, 3)), "column": np.array([[1], [2]])}
    assert per_row_outputs(outputs) == {"probabilities": [0.5, "nan"], "class": ["yes", "no"], "column": [1, 2]}


def test_the_request_id_is_read_from_headers_or_metadata_and_bounded():
    assert request_id([(b"X-Request-Id", b" abc ")]) == "abc"
    assert request_id([("x-request-id", "x" * 500)]) == "x" * 128
    assert request_id([("content-type", "application/json")]) == ""


def test_answers_read_while_a_server_answers_are_each_counted_once(server):
    server.wait_until_available(MODEL, 1)
    for i in range(5):
        rest_predict(server.rest_url, [ROW], {REQUEST_ID_HEADER: f"r-{i}"})
    first = answers(server.rest_url)
    again = answers(server.rest_url, int((time.time() - 60) * 1000))
    assert [a["number"] for a in first["answers"]] == [a["number"] for a in again["answers"]]
    assert first["instance"] == again["instance"] and first["dropped"] is False
