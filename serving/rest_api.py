"""TF Serving's REST API (https://www.tensorflow.org/tfx/serving/api_rest) over a threaded HTTP server.

`RestApi.handle` is the whole protocol (method, path, body -> status, JSON); `RestServer` only moves bytes.
"""
from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

import grpc
import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2

from serving.api_messages import message_to_json_dict, model_metadata_json, model_status_response
from serving.errors import ServingRequestError, invalid_argument
from serving.model_manager import ModelManager
from serving.predictor import run_prediction
from serving.servable import dtype_label

logger = logging.getLogger(__name__)

# The same paths the real server accepts (model_servers/http_rest_api_util.cc), case-insensitive.
PREDICT_PATH = re.compile(
    r"/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:(classify|regress|predict)", re.IGNORECASE
)
STATUS_PATH = re.compile(
    r"/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:/(metadata))?", re.IGNORECASE
)
INT64_MAX = 2**63 - 1
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024


def json_type_name(value: Any) -> str:
    if value is None:
        return "Null"
    if isinstance(value, bool):
        return "Bool"
    if isinstance(value, (int, float)):
        return "Number"
    if isinstance(value, str):
        return "String"
    if isinstance(value, list):
        return "Array"
    return "Object"


def is_b64_object(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and "b64" in value


class _LeafType:
    """What a tensor dtype accepts from JSON, worked out once per tensor rather than once per value."""

    def __init__(self, dtype: tf.DType) -> None:
        self.dtype = dtype
        self.label = dtype_label(dtype)
        self.numpy_dtype = object if dtype == tf.string else dtype.as_numpy_dtype
        if dtype == tf.string:
            self.kind = "string"
        elif dtype == tf.bool:
            self.kind = "bool"
        elif dtype.is_floating:
            self.kind = "float"
        elif dtype.is_integer:
            self.kind = "int"
            self.bounds = (int(dtype.min), int(dtype.max))
        else:
            self.kind = "unsupported"

    def convert(self, value: Any) -> Any:
        """One JSON scalar as a value of the dtype, or ValueError saying why not."""
        kind = self.kind
        if kind == "string":
            if isinstance(value, str):
                return value.encode("utf-8")
            if is_b64_object(value) and isinstance(value["b64"], str):
                try:
                    return base64.b64decode(value["b64"], validate=True)
                except binascii.Error as e:
                    raise ValueError(f"Unable to base64 decode {value['b64']!r}: {e}") from e
        elif kind == "bool":
            if isinstance(value, bool):
                return value
        elif kind == "float":
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                try:
                    return float(value)
                except OverflowError as e:
                    raise ValueError(f"JSON Value: {value} is out of range for {self.label}") from e
        elif kind == "int":
            if isinstance(value, int) and not isinstance(value, bool):
                if not self.bounds[0] <= value <= self.bounds[1]:
                    raise ValueError(f"JSON Value: {value} is out of range for {self.label}")
                return value
        else:
            raise ValueError(f"tensors of type {self.label} are not supported in JSON requests")
        raise ValueError(
            f"JSON Value: {json.dumps(value, allow_nan=True)} Type: {json_type_name(value)} "
            f"is not of expected type: {self.label}"
        )

    def fast_column(self, values: list) -> np.ndarray | None:
        """A flat list of plain values converted in one numpy call; None when the value-by-value path is needed."""
        if not values:
            return None
        types = set(map(type, values))
        if self.kind == "string" and types == {str}:
            return np.array([v.encode("utf-8") for v in values], dtype=object)
        if self.kind == "float" and types <= {int, float}:
            try:
                return np.array(values, dtype=self.numpy_dtype)
            except OverflowError:
                return None  # an integer too large for a float: the value-by-value path says which one
        if self.kind == "int" and types == {int} and self.bounds[0] <= min(values) and max(values) <= self.bounds[1]:
            return np.array(values, dtype=self.numpy_dtype)
        if self.kind == "bool" and types == {bool}:
            return np.array(values, dtype=np.bool_)
        return None


def _flatten(value: Any, leaf: _LeafType, flat: list) -> tuple[int, ...]:
    """Appends the leaves of a (nested) JSON list to `flat`; returns the dense shape, rejecting ragged lists."""
    if isinstance(value, list):
        shapes = {_flatten(item, leaf, flat) for item in value}
        if len(shapes) > 1:
            raise ValueError(f"Nested lists must be dense (same length at each level); got shapes {sorted(shapes)}")
        inner = shapes.pop() if shapes else ()
        return (len(value), *inner)
    if isinstance(value, dict) and not is_b64_object(value):
        raise ValueError(f"JSON Value: {json.dumps(value)} Type: Object is not of expected type: {leaf.label}")
    flat.append(leaf.convert(value))
    return ()


def json_to_array(value: Any, info: meta_graph_pb2.TensorInfo) -> np.ndarray:
    leaf = _LeafType(tf.dtypes.as_dtype(info.dtype))
    if isinstance(value, list):
        fast = leaf.fast_column(value)
        if fast is not None:
            return fast
    flat: list = []
    shape = _flatten(value, leaf, flat)
    return np.array(flat, dtype=leaf.numpy_dtype).reshape(shape)


def instances_to_arrays(instances: Any, inputs: dict[str, meta_graph_pb2.TensorInfo]) -> dict[str, np.ndarray]:
    """Row format: a list with one entry (an object per named input, or a value for a lone input) per example."""
    if not isinstance(instances, list):
        raise invalid_argument("Expecting 'instances' to be an list/array")
    if not instances:
        raise invalid_argument("No values in 'instances' array")
    objects = isinstance(instances[0], dict) and not is_b64_object(instances[0])
    if not objects and len(inputs) > 1:
        raise invalid_argument(
            "instances is a plain list, but expecting list of objects as multiple input tensors required as per "
            f"tensorinfo_map; the signature takes {sorted(inputs)}"
        )
    names = sorted(inputs)
    columns: dict[str, list] = {name: [] for name in names}
    for index, instance in enumerate(instances):
        is_object = isinstance(instance, dict) and not is_b64_object(instance)
        if objects != is_object:
            kind = "object" if objects else "value/list"
            raise invalid_argument(f"Expecting {kind} but got {json_type_name(instance)} at item {index} of input list")
        if objects:
            if set(instance) != set(names):
                unknown = sorted(set(instance) - set(names))
                missing = sorted(set(names) - set(instance))
                raise invalid_argument(
                    f"Failed to process element: {index} of 'instances' list. JSON object keys must be equal to: "
                    f"{','.join(names)} (unknown: {unknown}, missing: {missing})"
                )
            for name in names:
                columns[name].append(instance[name])
        else:
            columns[names[0]].append(instance)
    arrays = {}
    for name in names:
        try:
            arrays[name] = json_to_array(columns[name], inputs[name])
        except (ValueError, OverflowError) as e:
            index = _first_bad_element(columns[name], inputs[name])
            raise invalid_argument(
                f"Failed to process element: {index} key: {name} of 'instances' list. Error: {e}"
            ) from e
    return arrays


def _first_bad_element(values: list, info: meta_graph_pb2.TensorInfo) -> int | str:
    # Only on the error path: find which example broke the column, for the message.
    for index, value in enumerate(values):
        try:
            json_to_array(value, info)
        except (ValueError, OverflowError):
            return index
    return "?"


def inputs_to_arrays(value: Any, inputs: dict[str, meta_graph_pb2.TensorInfo]) -> dict[str, np.ndarray]:
    """Columnar format: an object of named inputs, or a bare value/list when the signature has one input."""
    if not isinstance(value, dict) or is_b64_object(value):
        if len(inputs) > 1:
            raise invalid_argument(
                "inputs is a plain value/list, but expecting an object as multiple input tensors required as per "
                f"tensorinfo_map; the signature takes {sorted(inputs)}"
            )
        value = {next(iter(inputs)): value}
    unknown = sorted(set(value) - set(inputs))
    if unknown:
        raise invalid_argument(
            f"Unknown named input(s): {unknown} in 'inputs' object; the signature takes {sorted(inputs)}."
        )
    arrays = {}
    for name in sorted(inputs):
        if name not in value:
            raise invalid_argument(f"Missing named input: {name} in 'inputs' object.")
        try:
            arrays[name] = json_to_array(value[name], inputs[name])
        except (ValueError, OverflowError) as e:
            raise invalid_argument(f"Failed to process key: {name} of 'inputs' object. Error: {e}") from e
    return arrays


def array_to_json(name: str, value: np.ndarray) -> Any:
    if value.dtype == object or value.dtype.kind == "S":
        # TF Serving base64-encodes string outputs whose alias ends in _bytes.
        if name.endswith("_bytes"):
            return _map_leaves(value, lambda b: {"b64": base64.b64encode(b).decode("ascii")})
        return _map_leaves(value, lambda b: b.decode("utf-8", errors="replace"))
    return value.tolist()


def _map_leaves(value: np.ndarray, fn) -> Any:
    if value.ndim == 0:
        return fn(value.item())
    return [_map_leaves(item, fn) for item in value]


def outputs_to_json(outputs: dict[str, np.ndarray], row_format: bool) -> dict[str, Any]:
    """`predictions` (one entry per example) for row requests, `outputs` (per tensor) for columnar ones."""
    if not row_format:
        if len(outputs) == 1:
            name, value = next(iter(outputs.items()))
            return {"outputs": array_to_json(name, value)}
        return {"outputs": {name: array_to_json(name, value) for name, value in sorted(outputs.items())}}
    if len(outputs) == 1:
        name, value = next(iter(outputs.items()))
        return {"predictions": array_to_json(name, value)}
    sizes = {name: (value.shape[0] if value.ndim else None) for name, value in outputs.items()}
    if len(set(sizes.values())) != 1 or None in sizes.values():
        raise invalid_argument(
            f"Output tensors have different 0th-dimension sizes {sizes}, which the row format cannot express; "
            "send the request in columnar format ('inputs') instead."
        )
    converted = {name: array_to_json(name, value) for name, value in outputs.items()}
    count = next(iter(sizes.values()))
    return {"predictions": [{name: converted[name][i] for name in sorted(converted)} for i in range(count)]}


def _parse_version(text: str | None) -> int | None:
    if not text:
        return None
    try:
        version = int(text)
    except ValueError:  # e.g. more digits than int() converts (sys.get_int_max_str_digits)
        version = INT64_MAX + 1
    if version > INT64_MAX:
        raise invalid_argument(f"Failed to convert version: {text} to numeric.")
    return version


class RestApi:
    """The protocol: maps one HTTP request to a status code and a JSON-serialisable body."""

    def __init__(self, manager: ModelManager, max_batch_size: int) -> None:
        self.manager = manager
        self.max_batch_size = max_batch_size

    def handle(self, method: str, raw_path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        path = urlsplit(raw_path).path
        try:
            return 200, self._dispatch(method, path, body)
        except ServingRequestError as e:
            return e.http_status, {"error": e.message}
        except Exception as e:  # noqa: BLE001 - one broken request must not take the server down
            logger.exception("internal error serving %s %s", method, path)
            return 500, {"error": f"Internal error: {e}"}

    def _dispatch(self, method: str, path: str, body: bytes) -> dict[str, Any]:
        if method == "POST":
            match = PREDICT_PATH.fullmatch(path)
            if match:
                name, version, label, verb = match.groups()
                if verb.lower() != "predict":
                    raise ServingRequestError(
                        grpc.StatusCode.UNIMPLEMENTED, f"The {verb} API is not implemented here; use :predict."
                    )
                return self._predict(unquote(name), _parse_version(version), label and unquote(label), body)
        elif method == "GET":
            match = STATUS_PATH.fullmatch(path)
            if match:
                name, version, label, metadata = match.groups()
                if not name:
                    raise invalid_argument("Missing model name in request.")
                if metadata:
                    servable = self.manager.resolve(unquote(name), _parse_version(version), label and unquote(label))
                    return model_metadata_json(servable)
                states = self.manager.model_status(unquote(name), _parse_version(version), label and unquote(label))
                return message_to_json_dict(model_status_response(states))
        raise invalid_argument(f"Malformed request: {method} {path}")

    def _predict(self, name: str, version: int | None, label: str | None, body: bytes) -> dict[str, Any]:
        request = parse_json_body(body)
        signature_name = request.get("signature_name", "")
        if not isinstance(signature_name, str):
            raise invalid_argument("'signature_name' key must be a string value.")
        servable = self.manager.resolve(name, version, label)
        signature = servable.signature(signature_name)
        if "instances" in request and "inputs" in request:
            raise invalid_argument("Not formatted correctly expecting only one of 'inputs' or 'instances' keys")
        if "instances" in request:
            arrays, row_format = instances_to_arrays(request["instances"], signature.inputs), True
        elif "inputs" in request:
            arrays, row_format = inputs_to_arrays(request["inputs"], signature.inputs), False
        else:
            raise invalid_argument("Missing 'inputs' or 'instances' key")
        _, outputs = run_prediction(servable, signature.name, arrays, self.max_batch_size)
        return outputs_to_json(outputs, row_format)


def parse_json_body(body: bytes) -> dict[str, Any]:
    if not body.strip():
        raise invalid_argument("JSON Parse error: The document is empty")
    try:
        # NaN and Infinity are accepted, as TF Serving's parser does (kParseNanAndInfFlag).
        document = json.loads(body)
    except (ValueError, RecursionError) as e:
        # ValueError: JSONDecodeError, UnicodeDecodeError, and an integer of more digits than int() converts.
        raise invalid_argument(f"JSON Parse error: {e}") from e
    if not isinstance(document, dict):
        raise invalid_argument(f"JSON Value: {json_type_name(document)} Is not object; send a JSON object.")
    return document


class _RestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: clients reuse one connection
    server_version = "mlops-serving"
    timeout = 60  # an idle keep-alive connection is closed after this many seconds
    # Headers and body go out in separate writes; without TCP_NODELAY, Nagle plus delayed ACK adds ~40 ms.
    disable_nagle_algorithm = True

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._respond("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._respond("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._respond("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._respond("DELETE")

    def _respond(self, method: str) -> None:
        server: RestServer = self.server.owner  # type: ignore[attr-defined]
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if self.headers.get("Transfer-Encoding") is not None:
            # The body is not read, so the connection cannot carry another request.
            self.close_connection = True
            status, payload = 411, {
                "error": "Transfer-Encoding is not supported; send the body with a Content-Length header."
            }
        elif length < 0:
            self.close_connection = True
            status, payload = 400, {"error": "Content-Length is not a non-negative integer; send a valid length."}
        elif length > server.max_body_bytes:
            self.close_connection = True
            status, payload = 400, {
                "error": f"Request body of {length} bytes is over the limit of {server.max_body_bytes}; "
                "send fewer examples per request."
            }
        else:
            body = self.rfile.read(length) if length else b""
            if not self.path.lower().startswith("/v1/"):
                status, payload = 404, {"error": f"Unknown path {self.path}; the API lives under /v1/models/."}
            else:
                status, payload = server.api.handle(method, self.path, body)
        data = json.dumps(payload, allow_nan=True).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        logger.debug("%s - %s", self.address_string(), format % args)


class _ThreadingServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, owner: RestServer) -> None:
        self.owner = owner
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, _RestHandler)

    def process_request(self, request, client_address) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request, client_address) -> None:
        logger.debug("connection from %s ended with an error", client_address, exc_info=True)


class RestServer:
    """Serves `RestApi` on host:port (port 0 picks a free one) with one thread per connection."""

    def __init__(
        self,
        manager: ModelManager,
        host: str,
        port: int,
        max_batch_size: int,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        self.api = RestApi(manager, max_batch_size)
        self.max_body_bytes = max_body_bytes
        self._httpd = _ThreadingServer((host, port), self)
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="rest-server", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.close_connections()
        self._httpd.server_close()
        self._thread.join(timeout=5)

