"""TF Serving's REST API (https://www.tensorflow.org/tfx/serving/api_rest) on uvicorn.

`RestApi` is the protocol (method, path, body -> status, JSON). `RestApp` is the ASGI application that sizes up,
admits and reads each request before the protocol sees it, and `RestServer` runs it on uvicorn with httptools'
HTTP/1.1 parser, adding what uvicorn leaves to a proxy: a deadline for headers, a cap on header size and on
connections, and JSON bodies for the errors the HTTP layer itself answers.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import itertools
import json
import logging
import math
import re
import socket
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any
from urllib.parse import unquote

import grpc
import numpy as np
import tensorflow as tf
import uvicorn
from tensorflow.core.protobuf import meta_graph_pb2
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from serving.api_messages import message_to_json_dict, model_metadata_json, model_status_response
from serving.errors import ServingRequestError, invalid_argument
from serving.limits import (
    AdmissionControl,
    ServingLimits,
    check_batch_size,
    check_float_range,
    check_json_cost,
    check_request_bytes,
    max_json_depth,
    max_json_items,
)
from serving.model_manager import ModelManager
from serving.monitoring import METRICS_PATH, RequestMetrics
from serving.predictor import Predictor
from serving.request_log import RequestLogger, predict_messages_from_arrays
from serving.servable import ServableVersion, dtype_label

logger = logging.getLogger(__name__)

# The same paths the real server accepts (model_servers/http_rest_api_util.cc), case-insensitive.
PREDICT_PATH = re.compile(
    r"/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:(classify|regress|predict)", re.IGNORECASE
)
STATUS_PATH = re.compile(
    r"/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:/(metadata))?", re.IGNORECASE
)
INT64_MAX = 2**63 - 1
# Columns of at most this many values are range-checked in Python rather than numpy.
SMALL_COLUMN = 64
# An unread body up to this size is read and dropped before an early error, so the connection stays usable and the
# client reads the answer instead of a reset; a larger one closes the connection.
DRAIN_BYTES = 1024 * 1024


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
            self.largest = float(np.finfo(self.numpy_dtype).max)
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
                    number = float(value)
                except OverflowError as e:
                    raise ValueError(f"JSON Value: {value} is out of range for {self.label}") from e
                if math.isfinite(number) and abs(number) > self.largest:
                    raise ValueError(f"JSON Value: {value} is out of range for {self.label}")
                return number
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
            if len(values) <= SMALL_COLUMN:  # a few values: plain Python beats numpy's per-call overhead
                for value in values:
                    if abs(value) > self.largest and not (type(value) is float and math.isinf(value)):
                        raise ValueError(f"JSON Value: {value} is out of range for {self.label}")
                return np.array(values, dtype=self.numpy_dtype)
            try:
                wide = np.array(values, dtype=np.float64)
            except OverflowError:
                return None  # an integer too large for a float: the value-by-value path says which one
            check_float_range(wide, self.numpy_dtype, self.label)
            return wide.astype(self.numpy_dtype, copy=False)
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


@functools.cache
def leaf_type(dtype_enum: int) -> _LeafType:
    return _LeafType(tf.dtypes.as_dtype(dtype_enum))


def json_to_array(value: Any, info: meta_graph_pb2.TensorInfo) -> np.ndarray:
    leaf = leaf_type(info.dtype)
    if isinstance(value, list):
        fast = leaf.fast_column(value)
        if fast is not None:
            return fast
        if value and all(type(item) is list for item in value):  # a batch of flat examples, e.g. [[1.0], [2.0]]
            widths = set(map(len, value))
            if len(widths) == 1:
                fast = leaf.fast_column(list(itertools.chain.from_iterable(value)))
                if fast is not None:
                    return fast.reshape(len(value), widths.pop())
    flat: list = []
    shape = _flatten(value, leaf, flat)
    return np.array(flat, dtype=leaf.numpy_dtype).reshape(shape)


def instances_to_arrays(
    instances: Any, inputs: dict[str, meta_graph_pb2.TensorInfo], max_batch_size: int
) -> dict[str, np.ndarray]:
    """Row format: a list with one entry (an object per named input, or a value for a lone input) per example."""
    if not isinstance(instances, list):
        raise invalid_argument("Expecting 'instances' to be an list/array")
    if not instances:
        raise invalid_argument("No values in 'instances' array")
    check_batch_size(len(instances), max_batch_size)
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


def inputs_to_arrays(
    value: Any, inputs: dict[str, meta_graph_pb2.TensorInfo], max_batch_size: int
) -> dict[str, np.ndarray]:
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
        if isinstance(value[name], list) and inputs[name].tensor_shape.dim:
            check_batch_size(len(value[name]), max_batch_size)
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


def _map_leaves(value: Any, fn) -> Any:
    """`fn` applied to every element of an array of any rank, as nested lists (an object array's elements are
    plain bytes, not arrays)."""
    if not isinstance(value, np.ndarray):
        return fn(value)
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


def _model_and_api(method: str, path: str) -> tuple[str, str]:
    """The model a REST request names and its API label as TF Serving's http_server.cc records them ("predict" and
    the like for POSTs, "" for status and metadata GETs); ("", "") when it names none."""
    match = PREDICT_PATH.fullmatch(path) if method == "POST" else STATUS_PATH.fullmatch(path)
    if match is None or not match.group(1):
        return "", ""
    return unquote(match.group(1)), match.group(4).lower() if method == "POST" else ""


class RestApi:
    """The protocol: maps one HTTP request to a status code and a JSON-serialisable body."""

    def __init__(self, manager: ModelManager, predictor: Predictor, executor: Executor, inline_bytes: int,
                 metrics: RequestMetrics | None = None, request_logger: RequestLogger | None = None) -> None:
        self.manager = manager
        self.predictor = predictor
        self.executor = executor
        self.inline_bytes = inline_bytes
        self.metrics = metrics or RequestMetrics()
        self.request_logger = request_logger
        self._json_limits_cache: dict[int, tuple[ServableVersion, tuple[int, int]]] = {}

    async def handle(self, method: str, raw_path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        path = raw_path.split("?", 1)[0]
        started = time.perf_counter()
        status = "OK"
        try:
            return 200, await self._dispatch(method, path, body)
        except ServingRequestError as e:
            status = e.code.name
            return e.http_status, {"error": e.message}
        except Exception as e:  # noqa: BLE001 - one broken request must not take the server down
            status = "INTERNAL"
            logger.exception("internal error serving %s %s", method, path)
            return 500, {"error": f"Internal error: {e}"}
        finally:
            model, api = _model_and_api(method, path)
            self.metrics.record(model, status, api, "REST", time.perf_counter() - started)

    async def _dispatch(self, method: str, path: str, body: bytes) -> dict[str, Any]:
        if method == "POST":
            match = PREDICT_PATH.fullmatch(path)
            if match:
                name, version, label, verb = match.groups()
                if verb.lower() != "predict":
                    raise ServingRequestError(
                        grpc.StatusCode.UNIMPLEMENTED, f"The {verb} API is not implemented here; use :predict."
                    )
                return await self._predict(unquote(name), _parse_version(version), label and unquote(label), body)
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

    async def _predict(self, name: str, version: int | None, label: str | None, body: bytes) -> dict[str, Any]:
        servable = self.manager.resolve(name, version, label)
        if len(body) > self.inline_bytes:  # a large body is sized up and parsed off the event loop
            loop = asyncio.get_running_loop()
            prepared = await loop.run_in_executor(self.executor, self._prepare, servable, body)
        else:
            prepared = self._prepare(servable, body)
        signature_name, arrays, row_format = prepared
        signature, outputs = await self.predictor.predict(servable, signature_name, arrays, "rest")
        answer = outputs_to_json(outputs, row_format)
        if self.request_logger is not None and self.request_logger.sample():
            self.request_logger.submit(servable.model_name, functools.partial(
                predict_messages_from_arrays, servable.model_name, version, label, servable.version, signature.name,
                arrays, outputs))
        return answer

    def _json_limits(self, servable: ServableVersion) -> tuple[int, int]:
        """(items, depth) a valid body for `servable` can need; the signature is named inside the body, so the most
        permissive of its signatures counts. Worked out once per loaded version."""
        cached = self._json_limits_cache.get(id(servable))
        if cached is not None and cached[0] is servable:
            return cached[1]
        max_batch_size = self.predictor.max_batch_size
        signatures = servable.signatures.values()
        limits = (max(max_json_items(s.inputs, max_batch_size) for s in signatures),
                  max(max_json_depth(s.inputs) for s in signatures))
        if len(self._json_limits_cache) > 64:
            self._json_limits_cache.clear()
        self._json_limits_cache[id(servable)] = (servable, limits)
        return limits

    def _prepare(self, servable: ServableVersion, body: bytes) -> tuple[str, dict[str, np.ndarray], bool]:
        """Sizes up, parses and converts a predict body: (signature name, input arrays, row format?)."""
        max_batch_size = self.predictor.max_batch_size
        check_json_cost(body, *self._json_limits(servable))
        request = parse_json_body(body)
        signature_name = request.get("signature_name", "")
        if not isinstance(signature_name, str):
            raise invalid_argument("'signature_name' key must be a string value.")
        signature = servable.signature(signature_name)
        if "instances" in request and "inputs" in request:
            raise invalid_argument("Not formatted correctly expecting only one of 'inputs' or 'instances' keys")
        if "instances" in request:
            return signature.name, instances_to_arrays(request["instances"], signature.inputs, max_batch_size), True
        if "inputs" in request:
            return signature.name, inputs_to_arrays(request["inputs"], signature.inputs, max_batch_size), False
        raise invalid_argument("Missing 'inputs' or 'instances' key")


def _parse_json_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # a literal too large for a double (Infinity itself is spelled out and allowed)
        raise ValueError(f"Number {text[:40]} is too big to be stored in a double")
    return value


def parse_json_body(body: bytes) -> dict[str, Any]:
    if not body.strip():
        raise invalid_argument("JSON Parse error: The document is empty")
    try:
        # NaN and Infinity are accepted, as TF Serving's parser does (kParseNanAndInfFlag).
        document = json.loads(body, parse_float=_parse_json_float)
    except (ValueError, RecursionError) as e:
        # ValueError: JSONDecodeError, UnicodeDecodeError, a number too large, and an integer of more digits than
        # int() converts.
        raise invalid_argument(f"JSON Parse error: {e}") from e
    if not isinstance(document, dict):
        raise invalid_argument(f"JSON Value: {json_type_name(document)} Is not object; send a JSON object.")
    return document


# ------------------------------------------------------------------------------------------------ the HTTP layer
class _EarlyAnswer(Exception):
    """Ends a request before the protocol sees it (too large, too slow, overloaded)."""

    def __init__(self, status: int, message: str, close: bool) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.close = close


def json_response_bytes(status: int, reason: str, message: str) -> bytes:
    """A whole HTTP/1.1 response with a JSON error body that closes the connection (for the protocol layer)."""
    data = json.dumps({"error": message}).encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n"
        "connection: close\r\n\r\n"
    ).encode() + data


class RestApp:
    """ASGI application: bounds each request's size, time and admission, then hands it to `RestApi`."""

    def __init__(self, api: RestApi, limits: ServingLimits, admission: AdmissionControl) -> None:
        self.api = api
        self.limits = limits
        self.admission = admission

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        method = scope["method"]
        raw_path = scope["raw_path"].decode("latin-1")
        if method == "GET" and raw_path.split("?", 1)[0] == METRICS_PATH:
            await _send_text(send, self.api.metrics.text())
            return
        length, chunked = _body_framing(scope["headers"])
        body_pending = chunked or length > 0
        try:
            status, payload, close = await self._answer(method, raw_path, length, receive)
        except _EarlyAnswer as e:
            status, payload, close = e.status, {"error": e.message}, e.close
            if body_pending and not close and not await self._drained(receive, length, chunked):
                close = True
        await _send_json(send, status, payload, close)

    async def _answer(self, method, raw_path, length, receive) -> tuple[int, dict, bool]:
        if not raw_path.lower().startswith("/v1/"):
            raise _EarlyAnswer(404, f"Unknown path {raw_path}; the API lives under /v1/models/.", close=False)
        try:
            check_request_bytes(length, self.limits.max_request_bytes)
        except ServingRequestError as e:
            raise _EarlyAnswer(413, e.message, close=True) from e
        if method != "POST":  # status and metadata: cheap, and answered even when predictions are overloaded
            body = await self._read_body(receive, length, None)
            status, payload = await self.api.handle(method, raw_path, body)
            return status, payload, False
        try:
            self.admission.admit(length)
        except ServingRequestError as e:
            raise _EarlyAnswer(e.http_status, e.message, close=False) from e
        reservation = [length]  # grows with a chunked body
        try:
            body = await self._read_body(receive, length, reservation)
            status, payload = await self.api.handle(method, raw_path, body)
            return status, payload, False
        finally:
            self.admission.release(reservation[0])

    async def _read_body(self, receive, length: int, reservation: list[int] | None) -> bytes:
        """The whole body within `body_timeout_s`, never more than `max_request_bytes` (chunked bodies too).

        `reservation` holds the bytes admitted for this request; a chunked body's bytes are admitted as they come.
        """
        chunks: list[bytes] = []
        size = 0
        task = asyncio.current_task()
        timed_out = []
        timer = asyncio.get_running_loop().call_later(
            self.limits.body_timeout_s, lambda: (timed_out.append(True), task.cancel())
        )
        try:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _EarlyAnswer(400, "The client closed the connection before sending the whole body.", True)
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.limits.max_request_bytes:
                    raise _EarlyAnswer(413, f"Request body is over the limit of {self.limits.max_request_bytes} "
                                            "bytes; send fewer examples per request.", close=True)
                if reservation is not None and size > reservation[0]:
                    try:
                        self.admission.grow(size - reservation[0])
                    except ServingRequestError as e:
                        raise _EarlyAnswer(e.http_status, e.message, close=True) from e
                    reservation[0] = size
                if chunk:
                    chunks.append(chunk)
                if not message.get("more_body", False):
                    break
        except asyncio.CancelledError:
            if not timed_out:
                raise
            raise _EarlyAnswer(408, f"The request body did not arrive within {self.limits.body_timeout_s:g} s; "
                                    "send it faster or in a smaller request.", close=True) from None
        finally:
            timer.cancel()
        if length and size != length:
            raise _EarlyAnswer(400, f"The body has {size} bytes but Content-Length says {length}.", close=True)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _drained(self, receive, length: int, chunked: bool) -> bool:
        """Reads and drops a small unread body so the connection can carry the next request."""
        if chunked or length > DRAIN_BYTES:
            return False
        try:
            size = 0
            while True:
                message = await asyncio.wait_for(receive(), self.limits.body_timeout_s)
                if message["type"] == "http.disconnect":
                    return False
                size += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return size == length
        except asyncio.TimeoutError:
            return False


def _body_framing(headers: list[tuple[bytes, bytes]]) -> tuple[int, bool]:
    """(Content-Length, chunked?) from the request headers; httptools has already refused malformed ones."""
    length, chunked = 0, False
    for name, value in headers:
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = True
    return length, chunked


async def _send_json(send, status: int, payload: dict, close: bool) -> None:
    data = json.dumps(payload, allow_nan=True).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    if status == 503:
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _send_text(send, text: str) -> None:
    data = text.encode("utf-8")
    headers = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8"),
               (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _overloaded_app(scope, receive, send) -> None:
    """Answers every request of a connection over the connection limit, then closes it."""
    if scope["type"] == "http":
        await _send_json(send, 503, {"error": "Server has too many open connections; retry with backoff."}, True)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus a deadline for headers, a cap on their size and on connections."""

    limits: ServingLimits  # set on the per-server subclass made by `protocol_class`

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self.app = _overloaded_app
        self._header_timer = None
        self._start_header_clock()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._start_header_clock()

    def on_url(self, url: bytes) -> None:
        self._count_header_bytes(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_header_bytes(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._stop_header_clock()
        super().on_headers_complete()

    def connection_lost(self, exc) -> None:
        self._stop_header_clock()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        # httptools refused the request (e.g. a malformed Content-Length): say so in JSON, as every error here is.
        self._close_with(400, "Bad Request", f"{msg.rstrip('.')}: the request line, headers or body framing "
                                             "(Content-Length, Transfer-Encoding) are not valid HTTP/1.1.")

    def _start_header_clock(self) -> None:
        self._stop_header_clock()
        self._header_bytes = 0
        self._header_timer = self.loop.call_later(self.limits.header_timeout_s, self._headers_too_slow)

    def _stop_header_clock(self) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        self._close_with(408, "Request Timeout", f"The request headers did not arrive within "
                                                 f"{self.limits.header_timeout_s:g} s.")

    def _count_header_bytes(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > self.limits.max_header_bytes:
            self._close_with(431, "Request Header Fields Too Large",
                             f"The request line and headers are over {self.limits.max_header_bytes} bytes.")
            raise ValueError("headers too large")  # stops the parser; the connection is already closing

    def _close_with(self, status: int, reason: str, message: str) -> None:
        self._stop_header_clock()
        if not self.transport.is_closing():
            self.transport.write(json_response_bytes(status, reason, message))
            self.transport.close()


def protocol_class(limits: ServingLimits) -> type[GuardedHttpToolsProtocol]:
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (0: a free port); IPPROTO_TCP so asyncio sets TCP_NODELAY on connections."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


class RestServer:
    """An ASGI app (`RestApp`, or `mlops log-proxy`'s forwarder) on uvicorn, serving on an already bound socket inside
    the server's event loop."""

    def __init__(self, app: Callable[..., Awaitable[None]], sock: socket.socket, limits: ServingLimits) -> None:
        self.sock = sock
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            app, http=protocol_class(limits), lifespan="off", log_config=None, log_level="warning",
            access_log=False, server_header=False, proxy_headers=False, backlog=limits.backlog,
            timeout_keep_alive=limits.keep_alive_timeout_s, timeout_graceful_shutdown=5, ws="none",
        )
        self._server = uvicorn.Server(config)
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._task = asyncio.ensure_future(self._server.serve(sockets=[self.sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise OSError("the REST server stopped while starting")
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            await self._task
        self.sock.close()
