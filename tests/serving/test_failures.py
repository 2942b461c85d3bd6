"""Failed predictions kept with their inputs (serving/server/failures.py): `mlops serve` and `mlops log-proxy` answer
them at /monitoring/failures/NAME for both transports, with the version, code, whole message and first rows; the
verifier's are marked; the request log writes the users' failures to failures-*.jsonl and leaves the verifier's out.
The proxy's side is in test_log_proxy.py."""
from __future__ import annotations

import json
import urllib.request

import grpc
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2

from serving import TRAFFIC_HEADER, VERIFIER_TRAFFIC
from serving.server.failures import (
    MAX_PARSED_BYTES,
    MAX_PARSED_JSON_DEPTH,
    MAX_PARSED_JSON_ITEMS,
    MAX_ROWS,
    MAX_VALUE_CHARS,
    RecentFailures,
    rows_from_arrays,
    rows_from_json_body,
    rows_from_predict_request,
)
from serving.server.request_log import FAILURE_FILE_NAME, failure_files, log_files, read_failures
from tests.serving.conftest import MODEL, ROW, http_json

PREDICT = "/tensorflow.serving.PredictionService/Predict"
# The tiny model's trip_start_hour is int64: a string there is refused before the model runs.
BAD_ROW = {**ROW, "trip_start_hour": "seven"}


def kept(base_url: str, model: str = MODEL) -> list[dict]:
    status, answer = http_json("GET", f"{base_url}/monitoring/failures/{model}")
    assert status == 200, answer
    return answer["failures"]


def typed_grpc_request(fare: list[float], hours: list[int], dtype=tf.int64, version: int | None = None) -> bytes:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL
    if version is not None:
        request.model_spec.version.value = version
    request.inputs["fare"].CopyFrom(tf.make_tensor_proto(fare, dtype=tf.float32))
    request.inputs["trip_start_hour"].CopyFrom(tf.make_tensor_proto(hours, dtype=dtype))
    request.inputs["payment_type"].CopyFrom(tf.make_tensor_proto(["Cash"] * len(fare), dtype=tf.string))
    return request.SerializeToString()


def grpc_call(target: str, body: bytes, verifier: bool = False) -> grpc.StatusCode:
    metadata = [(TRAFFIC_HEADER, VERIFIER_TRAFFIC)] if verifier else []
    with grpc.insecure_channel(target) as channel:
        try:
            channel.unary_unary(PREDICT)(body, timeout=10, metadata=metadata)
        except grpc.RpcError as e:
            return e.code()
    return grpc.StatusCode.OK


def rest_call(base_url: str, path: str, body: bytes, verifier: bool = False) -> int:
    import urllib.error

    headers = {"Content-Type": "application/json", **({TRAFFIC_HEADER: VERIFIER_TRAFFIC} if verifier else {})}
    request = urllib.request.Request(base_url + path, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def test_failed_rest_and_grpc_predictions_are_kept_with_their_inputs_and_answered_as_json(logged_server, tmp_path):
    url = logged_server.rest_url
    assert rest_call(url, f"/v1/models/{MODEL}/labels/canary:predict",
                     json.dumps({"instances": [BAD_ROW]}).encode()) == 400
    assert rest_call(url, f"/v1/models/{MODEL}:predict", json.dumps({"instances": [ROW]}).encode()) == 200
    assert grpc_call(logged_server.grpc_target, typed_grpc_request([1.0, 2.0], [7, 8], tf.int32, version=1)) \
        == grpc.StatusCode.INVALID_ARGUMENT
    assert rest_call(url, f"/v1/models/{MODEL}/versions/9:predict", json.dumps({"instances": [ROW]}).encode()) == 404
    failures = kept(url)
    assert [(f["transport"], f["version"], f["code"], f["traffic"], f["row_count"]) for f in failures] == [
        ("rest", 2, "INVALID_ARGUMENT", "users", 1), ("grpc", 1, "INVALID_ARGUMENT", "users", 2),
        ("rest", None, "NOT_FOUND", "users", 1)]
    assert failures[0]["rows"] == [BAD_ROW]
    assert failures[1]["rows"] == [{"fare": 1.0, "trip_start_hour": 7, "payment_type": "Cash"},
                                   {"fare": 2.0, "trip_start_hour": 8, "payment_type": "Cash"}]
    status, answer = http_json("POST", f"{url}/v1/models/{MODEL}/labels/canary:predict", {"instances": [BAD_ROW]})
    assert kept(url)[-1]["message"] == answer["error"], "the message kept is the one the client got"
    assert kept(logged_server.rest_url, "absent") == []
    logged_server.request_logger.flush()
    [path] = failure_files(str(tmp_path / "logs"), MODEL)
    assert FAILURE_FILE_NAME.fullmatch(path.rsplit("/", 1)[-1])
    assert [f["rows"] for f in read_failures(path)] == [f["rows"] for f in kept(url)]
    assert len(log_files(str(tmp_path / "logs"), MODEL)) == 1, "the one answered prediction, in its own file"


def test_the_verifiers_failures_are_kept_marked_and_left_out_of_the_log(logged_server, tmp_path):
    body = json.dumps({"inputs": {k: [v] for k, v in BAD_ROW.items()}}).encode()
    assert rest_call(logged_server.rest_url, f"/v1/models/{MODEL}:predict", body, verifier=True) == 400
    assert grpc_call(logged_server.grpc_target, typed_grpc_request([1.0], [7], tf.int32), verifier=True) \
        == grpc.StatusCode.INVALID_ARGUMENT
    assert [(f["traffic"], f["rows"][0]["trip_start_hour"]) for f in kept(logged_server.rest_url)] == [
        ("verifier", "seven"), ("verifier", 7)]
    logged_server.request_logger.flush()
    assert failure_files(str(tmp_path / "logs"), MODEL) == []


def test_a_failures_path_without_one_model_is_not_found(server):
    for path in ("/monitoring/failures/", f"/monitoring/failures/{MODEL}/x"):
        status, answer = http_json("GET", server.rest_url + path)
        assert status == 404 and answer["error"] == "Name one model: GET /monitoring/failures/NAME."


def test_rows_come_from_both_json_formats_bounded_in_count_and_length():
    many = [{"fare": float(i), "payment_type": "x" * (MAX_VALUE_CHARS + 5)} for i in range(MAX_ROWS + 3)]
    rows, count = rows_from_json_body(json.dumps({"instances": many}).encode())
    assert count == MAX_ROWS + 3 and len(rows) == MAX_ROWS
    assert rows[-1]["fare"] == MAX_ROWS - 1 and rows[0]["payment_type"] == "x" * MAX_VALUE_CHARS + "..."
    columns = {"fare": [[1.0], [2.0]], "payment_type": ["Cash", "Card"], "hour": 7}
    assert rows_from_json_body(json.dumps({"inputs": columns}).encode()) == (
        [{"fare": 1.0, "payment_type": "Cash", "hour": 7}, {"fare": 2.0, "payment_type": "Card", "hour": 7}], 2)
    assert rows_from_json_body(json.dumps({"instances": [3.5, 4.5]}).encode()) == (
        [{"instance": 3.5}, {"instance": 4.5}], 2)
    assert rows_from_json_body(json.dumps({"inputs": [1, 2]}).encode()) == ([{"inputs": [1, 2]}], 1)
    assert rows_from_json_body(b"[1]") == ([{"body": "[1]"}], 1)
    assert rows_from_arrays({"fare": np.array([1.5, np.nan], np.float32), "name": np.array([b"a", b"\xff"])}) == (
        [{"fare": 1.5, "name": "a"}, {"fare": "nan", "name": "\ufffd"}], 2)
    assert rows_from_predict_request(b"\xff\xff not a message") == ([], 0)


def nested_body(levels: int) -> bytes:
    return json.dumps({"instances": [{"fare": 1.0}]}).replace("1.0", "[" * levels + "1.0" + "]" * levels).encode()


def test_a_body_too_costly_to_parse_again_is_kept_by_its_first_characters():
    from serving.server.limits import json_cost

    inside = next(n for n in range(40) if json_cost(nested_body(n))[1] == MAX_PARSED_JSON_DEPTH)
    assert rows_from_json_body(nested_body(inside))[0][0]["fare"] == 1.0, "a one-element list is its element"
    assert rows_from_json_body(nested_body(inside + 1)) == ([{"body": nested_body(inside + 1).decode()}], 1)
    many = json.dumps({"instances": [{"fare": float(i)} for i in range(MAX_PARSED_JSON_ITEMS)]}).encode()
    assert json_cost(many)[0] > MAX_PARSED_JSON_ITEMS
    assert rows_from_json_body(many) == ([{"body": many[:MAX_VALUE_CHARS].decode()}], 1)
    fewer = json.dumps({"instances": [{"fare": float(i)} for i in range(MAX_PARSED_JSON_ITEMS // 4)]}).encode()
    assert rows_from_json_body(fewer)[1] == MAX_PARSED_JSON_ITEMS // 4
    huge = b" " * MAX_PARSED_BYTES + b"{}"
    assert rows_from_json_body(huge) == ([{"body": " " * MAX_VALUE_CHARS}], 1)


def test_a_refused_messages_rows_are_read_without_building_what_its_shape_declares():
    request = predict_pb2.PredictRequest()
    huge = request.inputs["payment_type"]
    huge.CopyFrom(tf.make_tensor_proto(["Cash"], dtype=tf.string))
    huge.tensor_shape.dim[0].size = 2_000_000_000
    wide = request.inputs["fare"]
    wide.CopyFrom(tf.make_tensor_proto([1.0], dtype=tf.float32))
    wide.tensor_shape.dim.add().size = 100_000_000
    packed = request.inputs["trip_start_hour"]
    packed.CopyFrom(tf.make_tensor_proto(np.arange(40, dtype=np.int64).reshape(20, 2)))
    assert packed.tensor_content, "tf.make_tensor_proto packs a numpy array"
    rows, count = rows_from_predict_request(request.SerializeToString())
    assert count == 2_000_000_000 and len(rows) == MAX_ROWS
    assert rows[0] == {"payment_type": "Cash", "fare": "<a tensor of shape [1, 100000000]>",
                       "trip_start_hour": [0, 1]}
    assert rows[1] == {"payment_type": None, "fare": None, "trip_start_hour": [2, 3]}
    assert rows[MAX_ROWS - 1]["trip_start_hour"] == [2 * MAX_ROWS - 2, 2 * MAX_ROWS - 1]


def test_a_process_keeps_the_newest_failures_and_cuts_long_messages():
    clock = iter(range(100)).__next__
    failures = RecentFailures(clock=lambda: float(clock()), kept=3)
    seen = []
    failures.on_users_failure = seen.append
    for i in range(5):
        failures.add(MODEL, 1, "rest", "INTERNAL", "m" * 2000 if i == 4 else f"error {i}", i == 3, ([{"i": i}], 1))
    failures.add("", 1, "rest", "INTERNAL", "no model named", False, ([], 0))
    assert [f.rows[0]["i"] for f in failures.of_model(MODEL)] == [2, 3, 4]
    assert [f.time for f in failures.of_model(MODEL)] == [2.0, 3.0, 4.0]
    assert failures.of_model(MODEL)[-1].message == "m" * 1024 + "..."
    assert [f.rows[0]["i"] for f in seen] == [0, 1, 2, 4], "the verifier's failure is not handed to the log"


def verifier_counts(page_url: str) -> dict[str, float]:
    from rollout.metrics import parse_prometheus_text
    from serving.server.monitoring import VERIFIER_REQUEST_COUNT

    with urllib.request.urlopen(f"{page_url}/monitoring/prometheus/metrics", timeout=10) as response:
        samples = parse_prometheus_text(response.read().decode())
    return {s.labels["status"]: s.value for s in samples if s.name == VERIFIER_REQUEST_COUNT
            and s.labels["model_name"] == MODEL}


def test_the_verifiers_predictions_are_counted_apart_on_the_metrics_page(server):
    from tests.serving.test_request_log import verifier_and_user_predictions

    verifier_and_user_predictions(server.rest_url, server.grpc_target)  # 2 of the users', 3 of the verifier's
    assert rest_call(server.rest_url, f"/v1/models/{MODEL}:predict", b"{not json", verifier=True) == 400
    assert grpc_call(server.grpc_target, typed_grpc_request([1.0], [7], tf.int32), verifier=True) \
        == grpc.StatusCode.INVALID_ARGUMENT
    assert rest_call(server.rest_url, f"/v1/models/{MODEL}:predict", b"{not json") == 400  # a user's: not counted
    http_json("GET", f"{server.rest_url}/v1/models/{MODEL}")  # a status read: not a prediction
    assert verifier_counts(server.rest_url) == {"OK": 3, "INVALID_ARGUMENT": 2}
