"""The REST API as TF Serving documents it (tensorflow.org/tfx/serving/api_rest): bodies, formats and error codes."""
from __future__ import annotations

import json
import math

import pytest

from tests.serving.conftest import MODEL, ROW, expected_probability, http_json

ROW_2 = {"fare": 40.0, "trip_start_hour": 23, "payment_type": "Credit Card"}


def columns(*rows: dict) -> dict:
    return {name: [row[name] for row in rows] for name in rows[0]}


def test_model_status_all_versions_one_version_and_by_label(server):
    status, body = http_json("GET", f"{server.rest_url}/v1/models/{MODEL}")
    assert status == 200
    assert body == {
        "model_version_status": [
            {"version": "2", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}},
            {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}},
        ]
    }
    status, body = http_json("GET", f"{server.rest_url}/v1/models/{MODEL}/versions/1")
    assert status == 200 and [row["version"] for row in body["model_version_status"]] == ["1"]
    status, body = http_json("GET", f"{server.rest_url}/v1/models/{MODEL}/labels/canary")
    assert status == 200 and [row["version"] for row in body["model_version_status"]] == ["2"]


def test_model_metadata_body(server):
    status, body = http_json("GET", f"{server.rest_url}/v1/models/{MODEL}/labels/stable/metadata")
    assert status == 200
    assert body["model_spec"] == {"name": MODEL, "signature_name": "", "version": "1"}
    signatures = body["metadata"]["signature_def"]["signature_def"]
    serving_default = signatures["serving_default"]
    assert serving_default["method_name"] == "tensorflow/serving/predict"
    assert serving_default["inputs"]["fare"]["dtype"] == "DT_FLOAT"
    assert serving_default["inputs"]["trip_start_hour"]["dtype"] == "DT_INT64"
    assert serving_default["inputs"]["payment_type"]["dtype"] == "DT_STRING"
    fare_shape = serving_default["inputs"]["fare"]["tensor_shape"]
    assert fare_shape == {"dim": [{"size": "-1", "name": ""}], "unknown_rank": False}
    assert serving_default["inputs"]["fare"]["name"].endswith(":0")
    assert serving_default["outputs"]["probabilities"]["dtype"] == "DT_FLOAT"
    assert set(signatures["scores"]["outputs"]) == {"probabilities", "logits"}
    # Without a version, metadata describes the latest version.
    status, body = http_json("GET", f"{server.rest_url}/v1/models/{MODEL}/metadata")
    assert status == 200 and body["model_spec"]["version"] == "2"


def test_predict_row_format_one_output_gives_a_value_per_instance(server):
    status, body = http_json("POST", f"{server.rest_url}/v1/models/{MODEL}:predict", {"instances": [ROW, ROW_2]})
    assert status == 200
    assert set(body) == {"predictions"}
    assert body["predictions"] == pytest.approx([expected_probability(ROW, 2), expected_probability(ROW_2, 2)])


def test_predict_columnar_format_one_output_gives_the_tensor(server):
    status, body = http_json(
        "POST", f"{server.rest_url}/v1/models/{MODEL}/versions/1:predict", {"inputs": columns(ROW, ROW_2)}
    )
    assert status == 200
    assert set(body) == {"outputs"}
    assert body["outputs"] == pytest.approx([expected_probability(ROW, 1), expected_probability(ROW_2, 1)])


def test_predict_with_signature_name_and_several_outputs(server):
    url = f"{server.rest_url}/v1/models/{MODEL}/labels/stable:predict"
    status, body = http_json("POST", url, {"signature_name": "scores", "instances": [ROW, ROW_2]})
    assert status == 200
    assert [set(p) for p in body["predictions"]] == [{"probabilities", "logits"}] * 2
    assert body["predictions"][1]["probabilities"] == pytest.approx(expected_probability(ROW_2, 1))

    status, body = http_json("POST", url, {"signature_name": "scores", "inputs": columns(ROW, ROW_2)})
    assert status == 200
    assert set(body["outputs"]) == {"probabilities", "logits"}
    expected = [expected_probability(ROW, 1), expected_probability(ROW_2, 1)]
    assert body["outputs"]["probabilities"] == pytest.approx(expected)


def test_predict_accepts_nan_and_b64_strings(server):
    row = {"fare": math.nan, "trip_start_hour": -1, "payment_type": {"b64": "Q2FzaA=="}}  # b64 of "Cash"
    status, body = http_json("POST", f"{server.rest_url}/v1/models/{MODEL}:predict", {"instances": [row]})
    assert status == 200
    assert body["predictions"] == pytest.approx([expected_probability({**row, "payment_type": "Cash"}, 2)])


def test_paths_are_case_insensitive_and_names_url_decoded(server):
    status, _ = http_json("POST", f"{server.rest_url}/V1/Models/{MODEL}/Labels/canary:Predict", {"instances": [ROW]})
    assert status == 200


BAD_REQUESTS = [
    # (what, method, path after the host, JSON body or raw bytes, HTTP status, text in the error)
    ("malformed JSON", "POST", f"/v1/models/{MODEL}:predict", b"{instances: [1", 400, "JSON Parse error"),
    ("empty body", "POST", f"/v1/models/{MODEL}:predict", b"", 400, "The document is empty"),
    ("JSON not an object", "POST", f"/v1/models/{MODEL}:predict", b"[1, 2]", 400, "Is not object"),
    ("neither instances nor inputs", "POST", f"/v1/models/{MODEL}:predict", {"rows": [ROW]}, 400,
     "Missing 'inputs' or 'instances' key"),
    ("both instances and inputs", "POST", f"/v1/models/{MODEL}:predict",
     {"instances": [ROW], "inputs": columns(ROW)}, 400, "only one of"),
    ("empty instances", "POST", f"/v1/models/{MODEL}:predict", {"instances": []}, 400, "No values"),
    ("unknown feature in a row", "POST", f"/v1/models/{MODEL}:predict",
     {"instances": [{**ROW, "tips": 1.0}]}, 400, "unknown: ['tips']"),
    ("missing feature in a row", "POST", f"/v1/models/{MODEL}:predict",
     {"instances": [{"fare": 1.0, "trip_start_hour": 2}]}, 400, "missing: ['payment_type']"),
    ("missing named input", "POST", f"/v1/models/{MODEL}:predict",
     {"inputs": {"fare": [1.0], "trip_start_hour": [2]}}, 400, "Missing named input: payment_type"),
    ("unknown named input", "POST", f"/v1/models/{MODEL}:predict",
     {"inputs": {**columns(ROW), "tip": [1]}}, 400, "Unknown named input"),
    ("plain list for several inputs", "POST", f"/v1/models/{MODEL}:predict", {"instances": [1.0, 2.0]}, 400,
     "expecting list of objects"),
    ("string for a float", "POST", f"/v1/models/{MODEL}:predict",
     {"instances": [{**ROW, "fare": "twelve"}]}, 400, "is not of expected type: float"),
    ("fraction for an int64", "POST", f"/v1/models/{MODEL}:predict",
     {"instances": [{**ROW, "trip_start_hour": 7.5}]}, 400, "is not of expected type: int64"),
    ("bool for a float", "POST", f"/v1/models/{MODEL}:predict",
     {"inputs": {**columns(ROW), "fare": [True]}}, 400, "Type: Bool is not of expected type: float"),
    ("int64 out of range", "POST", f"/v1/models/{MODEL}:predict",
     {"inputs": {**columns(ROW), "trip_start_hour": [2**70]}}, 400, "out of range for int64"),
    ("number for a string", "POST", f"/v1/models/{MODEL}:predict",
     {"instances": [{**ROW, "payment_type": 3}]}, 400, "is not of expected type: string"),
    ("null value", "POST", f"/v1/models/{MODEL}:predict",
     {"instances": [{**ROW, "fare": None}]}, 400, "Type: Null"),
    ("wrong rank", "POST", f"/v1/models/{MODEL}:predict",
     {"instances": [{**ROW, "fare": [1.0, 2.0]}]}, 400, "shape"),
    ("ragged columns", "POST", f"/v1/models/{MODEL}:predict",
     {"inputs": {"fare": [1.0, 2.0], "trip_start_hour": [1], "payment_type": ["a"]}}, 400, "same 0th-dimension"),
    ("batch over the limit", "POST", f"/v1/models/{MODEL}:predict", {"instances": [ROW] * 9}, 400,
     "larger than the maximum batch size 8"),
    ("unknown signature", "POST", f"/v1/models/{MODEL}:predict",
     {"signature_name": "nope", "instances": [ROW]}, 400, 'signature name: "nope" not found'),
    ("signature_name not a string", "POST", f"/v1/models/{MODEL}:predict",
     {"signature_name": 100, "instances": [ROW]}, 400, "'signature_name' key must be a string value."),
    ("unknown model", "POST", "/v1/models/nope:predict", {"instances": [ROW]}, 404, "Servable not found"),
    ("unknown version", "POST", f"/v1/models/{MODEL}/versions/9:predict", {"instances": [ROW]}, 404,
     f"Specific({MODEL}, 9)"),
    ("unknown label", "POST", f"/v1/models/{MODEL}/labels/beta:predict", {"instances": [ROW]}, 400,
     "Unrecognized servable version label: beta"),
    ("model name with ..", "POST", "/v1/models/..:predict", {"instances": [ROW]}, 400, "is invalid"),
    ("encoded ../ in the model name", "GET", "/v1/models/..%2F..%2Fetc", None, 400, "is invalid"),
    ("model name with a slash", "GET", f"/v1/models/{MODEL}/extra/segment", None, 400, "Malformed request"),
    ("status of an unknown model", "GET", "/v1/models/nope", None, 404, "Could not find any versions of model nope"),
    ("status of an unknown version", "GET", f"/v1/models/{MODEL}/versions/9", None, 404,
     f"Could not find version 9 of model {MODEL}"),
    ("metadata of an unknown label", "GET", f"/v1/models/{MODEL}/labels/beta/metadata", None, 400,
     "Unrecognized servable version label"),
    ("no model name", "GET", "/v1/models", None, 400, "Missing model name"),
    ("predict with GET", "GET", f"/v1/models/{MODEL}:predict", None, 400, "Malformed request"),
    ("classify", "POST", f"/v1/models/{MODEL}:classify", {"examples": [ROW]}, 501, "not implemented"),
    ("outside the API", "GET", "/index.html", None, 404, "Unknown path"),
    ("integer of more digits than int() converts", "POST", f"/v1/models/{MODEL}:predict",
     b'{"instances": [{"fare": ' + b"9" * 5000 + b', "trip_start_hour": 7, "payment_type": "Cash"}]}', 400,
     "JSON Parse error"),
    ("integer too large for a float (row)", "POST", f"/v1/models/{MODEL}:predict",
     {"instances": [{**ROW, "fare": 10**400}]}, 400, "out of range for float"),
    ("integer too large for a float (column)", "POST", f"/v1/models/{MODEL}:predict",
     {"inputs": {**columns(ROW), "fare": [10**400]}}, 400, "out of range for float"),
    ("version of more digits than int() converts", "POST", f"/v1/models/{MODEL}/versions/{'9' * 5000}:predict",
     {"instances": [ROW]}, 400, "Failed to convert version"),
    ("status of a version of 5000 digits", "GET", f"/v1/models/{MODEL}/versions/{'9' * 5000}", None, 400,
     "Failed to convert version"),
]


@pytest.mark.parametrize(
    "what,method,path,body,http_status,message", BAD_REQUESTS, ids=[case[0] for case in BAD_REQUESTS]
)
def test_bad_request_gets_an_error_and_the_server_keeps_serving(server, what, method, path, body, http_status, message):
    raw = body if isinstance(body, bytes) else None
    status, response = http_json(method, server.rest_url + path, None if raw is not None else body, raw=raw)
    assert status == http_status, response
    assert set(response) == {"error"}
    assert message in response["error"]

    status, response = http_json("POST", f"{server.rest_url}/v1/models/{MODEL}:predict", {"instances": [ROW]})
    assert status == 200
    assert response["predictions"] == pytest.approx([expected_probability(ROW, 2)])


def test_batch_at_the_limit_is_accepted(server):
    status, body = http_json("POST", f"{server.rest_url}/v1/models/{MODEL}:predict", {"instances": [ROW] * 8})
    assert status == 200 and len(body["predictions"]) == 8


def raw_exchange(port: int, request: bytes, timeout_s: float = 10.0) -> bytes:
    """Sends raw bytes on a new connection and returns everything received until the server closes it."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as connection:
        connection.sendall(request)
        received = b""
        while True:  # until the server closes; the socket timeout fails the test if it never does
            chunk = connection.recv(65536)
            if not chunk:
                return received
            received += chunk


def split_response(received: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, payload = received.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, payload


def test_a_chunked_body_is_read_like_any_other(server):
    body = json.dumps({"instances": [ROW]}).encode()
    half = len(body) // 2
    received = raw_exchange(server.rest_port, (
        f"POST /v1/models/{MODEL}:predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        f"Connection: close\r\n\r\n{half:x}\r\n".encode() + body[:half] + f"\r\n{len(body) - half:x}\r\n".encode()
        + body[half:] + b"\r\n0\r\n\r\n"
    ))
    status, _, payload = split_response(received)
    assert status == 200, received
    assert json.loads(payload)["predictions"] == pytest.approx([expected_probability(ROW, 2)])
