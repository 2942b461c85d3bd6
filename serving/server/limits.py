"""What one request may cost, checked before the work it would cause: sizes, value counts, nesting, in-flight load.

Each limit is a small function that raises ServingRequestError (INVALID_ARGUMENT for a request that can never be
served, UNAVAILABLE for one the server is too busy to take now), so each can be tested on both sides of its
threshold. The order matters: a REST body is sized up from its bytes (`check_json_cost`) before `json.loads` builds
any Python object, and a gRPC message's value counts are read from its wire bytes (`check_wire_value_counts`)
before the protobuf is parsed, so a request far over a limit is refused for a small fraction of its size.
"""
from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterable, Mapping

import grpc
import numpy as np
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from serving import ServingLimits  # noqa: F401 - the limits live with the defaults, importable without TensorFlow
from serving.server.errors import ServingRequestError, invalid_argument

# Elements per example when the signature leaves a non-batch dimension (or the rank) open.
MAX_ELEMENTS_PER_EXAMPLE = 1 << 20
# Never more elements in one input tensor than this, whatever the batch size and signature allow.
MAX_TENSOR_ELEMENTS = 1 << 26
# JSON nesting allowed for an input of unknown rank (TF's own rank limit is 254; real models stay far below).
MAX_UNKNOWN_RANK = 32
# Room for the request's own keys (signature_name, instances/inputs) around the values.
JSON_ITEMS_SLACK = 64


def unavailable(message: str) -> ServingRequestError:
    return ServingRequestError(grpc.StatusCode.UNAVAILABLE, message)


# ------------------------------------------------------------------------------------------------ sizes
def check_request_bytes(size: int, max_request_bytes: int) -> None:
    """A REST body or gRPC message of `size` bytes is refused above `max_request_bytes`."""
    if size > max_request_bytes:
        raise invalid_argument(
            f"Request of {size} bytes is over the limit of {max_request_bytes} bytes; send fewer examples per request."
        )


def check_batch_size(rows: int, max_batch_size: int) -> None:
    """A request of `rows` examples is refused above `max_batch_size`."""
    if rows > max_batch_size:
        raise invalid_argument(
            f"Batch size {rows} is larger than the maximum batch size {max_batch_size}; "
            "split the request into smaller ones."
        )


def signature_dims(info: meta_graph_pb2.TensorInfo) -> list[int] | None:
    """The signature's shape for a tensor, -1 for unknown dimensions, None for unknown rank."""
    if info.tensor_shape.unknown_rank:
        return None
    return [d.size for d in info.tensor_shape.dim]


def max_input_elements(info: meta_graph_pb2.TensorInfo, max_batch_size: int) -> int:
    """The most elements a valid input for `info` can hold: a full batch of examples of the signature's shape."""
    dims = signature_dims(info)
    if dims == []:
        return 1  # a scalar input
    if dims is None or any(d < 0 for d in dims[1:]):
        per_example = MAX_ELEMENTS_PER_EXAMPLE
    else:
        per_example = math.prod(dims[1:])
    return min(max(max_batch_size, 1) * max(per_example, 1), MAX_TENSOR_ELEMENTS)


def max_rank(infos: Iterable[meta_graph_pb2.TensorInfo]) -> int:
    ranks = [MAX_UNKNOWN_RANK if (dims := signature_dims(info)) is None else len(dims) for info in infos]
    return max(ranks, default=0)


# ------------------------------------------------------------------------------------------- REST: JSON cost
_STRING_LITERAL = re.compile(rb'"[^"]*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_OPENING, _CLOSING, _QUOTE, _COMMA = b"[{", b"]}", ord('"'), ord(",")
_DEPTH_CHUNK = 256 * 1024
# Bodies up to this size are sized up with a regex (fastest for small ones); larger ones in numpy chunks.
_SMALL_BODY = 64 * 1024


def json_skeleton(body: bytes) -> bytes:
    """`body` with every string literal emptied: what is left is numbers, literals and structure.

    Escaped backslashes and quotes go first, so every remaining quote delimits a string. Invalid JSON may be
    sized wrongly after its first error, but json.loads stops there too.
    """
    if b"\\" in body:
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    return _STRING_LITERAL.sub(b'""', body)


def count_json_items(skeleton: bytes) -> int:
    """Commas plus containers plus one: at least the number of values and members the document holds."""
    return skeleton.count(b",") + skeleton.count(b"[") + skeleton.count(b"{") + 1


def json_nesting_depth(skeleton: bytes) -> int:
    """How deep arrays and objects nest (0 for a bare value)."""
    brackets = skeleton.translate(None, _NOT_BRACKETS)
    if len(brackets) < 256:  # a small request: numpy's overhead would dominate
        depth = deepest = 0
        for byte in brackets:
            depth += 1 if byte in _OPENING else -1
            deepest = max(deepest, depth)
        return deepest
    deepest = depth = 0
    for start in range(0, len(brackets), _DEPTH_CHUNK):  # in chunks: a few MB of scratch for any body size
        codes = np.frombuffer(brackets, dtype=np.uint8, count=min(_DEPTH_CHUNK, len(brackets) - start), offset=start)
        levels = np.cumsum(np.where((codes == _OPENING[0]) | (codes == _OPENING[1]), 1, -1).astype(np.int32))
        deepest = max(deepest, depth + int(levels.max()))
        depth += int(levels[-1])
    return deepest


def max_json_items(inputs: Mapping[str, meta_graph_pb2.TensorInfo], max_batch_size: int) -> int:
    """Items a valid request for `inputs` can need: per value at most a comma, a list and a {"b64": ...} object."""
    values = sum(max_input_elements(info, max_batch_size) for info in inputs.values())
    return 3 * values + 2 * max_batch_size + JSON_ITEMS_SLACK


def max_json_depth(inputs: Mapping[str, meta_graph_pb2.TensorInfo]) -> int:
    """Document, instances/inputs, instance object, one level per dimension of rank, and a {"b64": ...} object."""
    return max_rank(inputs.values()) + 3


def json_cost(body: bytes) -> tuple[int, int]:
    """(count_json_items, json_nesting_depth) of a body, in memory a small fraction of its size."""
    if b"\\" in body:
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    if len(body) <= _SMALL_BODY:
        skeleton = json_skeleton(body)
        return count_json_items(skeleton), json_nesting_depth(skeleton)
    # A large body is scanned in chunks: a regex substitution would build a list entry per string literal.
    codes = np.frombuffer(body, dtype=np.uint8)
    items, depth, deepest, inside = 1, 0, 0, 0
    for start in range(0, len(codes), _DEPTH_CHUNK):
        chunk = codes[start:start + _DEPTH_CHUNK]
        parity = (np.cumsum(chunk == _QUOTE, dtype=np.int32) + inside) & 1  # 1 inside a string literal
        outside = parity == 0
        opening = ((chunk == _OPENING[0]) | (chunk == _OPENING[1])) & outside
        closing = ((chunk == _CLOSING[0]) | (chunk == _CLOSING[1])) & outside
        items += int(np.count_nonzero((chunk == _COMMA) & outside)) + int(np.count_nonzero(opening))
        levels = np.cumsum(opening.view(np.int8) - closing.view(np.int8), dtype=np.int32) + depth
        deepest = max(deepest, int(levels.max()))
        depth, inside = int(levels[-1]), int(parity[-1])
    return items, deepest


def check_json_cost(body: bytes, max_items: int, max_depth: int) -> None:
    """Refuses a JSON body with more values or deeper nesting than any valid request, before it is parsed."""
    items, depth = json_cost(body)
    if items > max_items:
        raise invalid_argument(
            f"Request holds about {items} JSON values, more than the {max_items} that a full batch of this "
            "signature's inputs can need; send fewer examples or fewer values per example."
        )
    if depth > max_depth:
        raise invalid_argument(
            f"Request nests JSON {depth} levels deep, more than the {max_depth} this signature's inputs can use; "
            "send each value at its input's rank."
        )


def check_float_range(values: np.ndarray, numpy_dtype: np.dtype, label: str) -> None:
    """Refuses finite numbers outside the input's float range (TF Serving answers 400; a cast would give inf)."""
    if values.dtype.kind != "f" or np.dtype(numpy_dtype).itemsize >= values.dtype.itemsize:
        return
    largest = float(np.finfo(numpy_dtype).max)
    out_of_range = np.isfinite(values) & (np.abs(values) > largest)
    if out_of_range.any():
        raise ValueError(f"JSON Value: {values[out_of_range].flat[0]!r} is out of range for {label}")


# ------------------------------------------------------------------------------------- gRPC: TensorProto cost
# The repeated field that carries a dtype's values in a TensorProto, and how many of them make one element.
VALUE_FIELD_BY_DTYPE = {
    types_pb2.DT_FLOAT: ("float_val", 1), types_pb2.DT_DOUBLE: ("double_val", 1),
    types_pb2.DT_INT32: ("int_val", 1), types_pb2.DT_INT16: ("int_val", 1), types_pb2.DT_INT8: ("int_val", 1),
    types_pb2.DT_UINT8: ("int_val", 1), types_pb2.DT_UINT16: ("int_val", 1),
    types_pb2.DT_INT64: ("int64_val", 1), types_pb2.DT_BOOL: ("bool_val", 1), types_pb2.DT_STRING: ("string_val", 1),
    types_pb2.DT_HALF: ("half_val", 1), types_pb2.DT_BFLOAT16: ("half_val", 1),
    types_pb2.DT_UINT32: ("uint32_val", 1), types_pb2.DT_UINT64: ("uint64_val", 1),
    types_pb2.DT_COMPLEX64: ("scomplex_val", 2), types_pb2.DT_COMPLEX128: ("dcomplex_val", 2),
}


def check_tensor_proto(name: str, tensor, declared: list[int], max_elements: int, max_batch_size: int) -> None:
    """Refuses a TensorProto whose declared shape or carried values exceed what is valid, before any array exists.

    `declared` is the proto's shape, `max_elements` the most a full batch of the input holds (max_input_elements).
    """
    if any(d < 0 for d in declared):
        raise invalid_argument(f"Input {name} has shape {declared} with a negative dimension; give every size.")
    if declared:
        check_batch_size(declared[0], max_batch_size)
    elements = math.prod(declared)
    if elements > max_elements:
        raise invalid_argument(
            f"Input {name} has shape {declared} ({elements} elements), more than the {max_elements} the signature "
            f"allows for a batch of {max_batch_size}; send fewer or smaller examples."
        )
    check_tensor_value_count(name, tensor, elements)


def check_tensor_value_count(name: str, tensor, elements: int) -> None:
    """The values a TensorProto carries must fit its declared shape: TF pads fewer, but never takes more."""
    if tensor.tensor_content:
        itemsize = np.dtype(_numpy_dtype(tensor.dtype)).itemsize
        if len(tensor.tensor_content) != elements * itemsize:
            raise invalid_argument(
                f"Input {name} declares {elements} elements but its tensor_content holds "
                f"{len(tensor.tensor_content)} bytes, not {elements * itemsize}; make the shape match the data."
            )
        return
    field, per_element = VALUE_FIELD_BY_DTYPE.get(tensor.dtype, (None, 1))
    carried = len(getattr(tensor, field)) // per_element if field else 0
    if carried > elements:
        raise invalid_argument(
            f"Input {name} declares shape {[d.size for d in tensor.tensor_shape.dim]} ({elements} elements) but "
            f"carries {carried} values; make the shape match the values."
        )


def _numpy_dtype(dtype: int):
    import tensorflow as tf

    return tf.dtypes.as_dtype(dtype).as_numpy_dtype


# Wire format (protobuf encoding) of PredictRequest and TensorProto: the fields whose counts matter.
_PREDICT_INPUTS_FIELD = 2
_MAP_KEY_FIELD, _MAP_VALUE_FIELD = 1, 2
_TENSOR_DTYPE_FIELD, _TENSOR_CONTENT_FIELD = 1, 4
# TensorProto value fields: number -> bytes per value when packed (0: varints).
_PACKED_VALUE_FIELDS = {5: 4, 6: 8, 7: 0, 9: 4, 10: 0, 11: 0, 12: 8, 13: 0, 16: 0, 17: 0}
_ONE_VALUE_PER_FIELD = frozenset({8, 14, 15})  # string_val, resource_handle_val, variant_val
_VARINT_CONTINUATION_BYTES = bytes(range(128, 256))
_DTYPE_BYTES = {
    types_pb2.DT_FLOAT: 4, types_pb2.DT_DOUBLE: 8, types_pb2.DT_INT32: 4, types_pb2.DT_INT16: 2,
    types_pb2.DT_INT64: 8, types_pb2.DT_UINT16: 2, types_pb2.DT_UINT32: 4, types_pb2.DT_UINT64: 8,
    types_pb2.DT_HALF: 2, types_pb2.DT_BFLOAT16: 2, types_pb2.DT_COMPLEX64: 8, types_pb2.DT_COMPLEX128: 16,
}


class WireFormatError(ValueError):
    """Bytes that are not a protobuf message; the real parser would refuse them too."""


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise WireFormatError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireFormatError("varint longer than 10 bytes")


def wire_fields(data: bytes, start: int, end: int):
    """(field number, wire type, value start, value end or varint value) for each field in data[start:end]."""
    pos = start
    while pos < end:
        key, pos = _read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = _read_varint(data, pos)
            yield number, wire_type, value, pos
        elif wire_type == 1:
            pos += 8
            yield number, wire_type, pos - 8, pos
        elif wire_type == 2:
            length, pos = _read_varint(data, pos)
            if pos + length > end:
                raise WireFormatError("length-delimited field runs past its message")
            yield number, wire_type, pos, pos + length
            pos += length
        elif wire_type == 5:
            pos += 4
            yield number, wire_type, pos - 4, pos
        else:
            raise WireFormatError(f"unsupported wire type {wire_type}")
    if pos != end:
        raise WireFormatError("field runs past its message")


def tensor_wire_value_count(data: bytes, start: int, end: int, stop_above: int) -> int:
    """Values a serialized TensorProto carries (tensor_content as elements), stopping once over `stop_above`."""
    count = content_bytes = 0
    dtype = types_pb2.DT_INVALID
    for number, wire_type, value_start, value_end in wire_fields(data, start, end):
        if number == _TENSOR_DTYPE_FIELD and wire_type == 0:
            dtype = value_start  # a varint field yields its value here
        elif number == _TENSOR_CONTENT_FIELD and wire_type == 2:
            content_bytes += value_end - value_start
        elif number in _ONE_VALUE_PER_FIELD:
            count += 1
        elif number in _PACKED_VALUE_FIELDS:
            if wire_type != 2:
                count += 1  # one unpacked value
            elif _PACKED_VALUE_FIELDS[number]:
                count += (value_end - value_start) // _PACKED_VALUE_FIELDS[number]
            else:  # packed varints: one value ends at each byte below 0x80
                count += len(data[value_start:value_end].translate(None, _VARINT_CONTINUATION_BYTES))
        if count > stop_above:
            return count
    return count + content_bytes // _DTYPE_BYTES.get(dtype, 1)


def predict_request_input_counts(data: bytes, limits: Mapping[str, int]) -> dict[str, int]:
    """Value counts per input of a serialized PredictRequest, reading no further into an input than its limit."""
    counts: dict[str, int] = {}
    for number, wire_type, start, end in wire_fields(data, 0, len(data)):
        if number != _PREDICT_INPUTS_FIELD or wire_type != 2:
            continue
        name, value_range = None, None
        for entry_number, entry_type, entry_start, entry_end in wire_fields(data, start, end):
            if entry_number == _MAP_KEY_FIELD and entry_type == 2:
                name = data[entry_start:entry_end].decode("utf-8", errors="replace")
            elif entry_number == _MAP_VALUE_FIELD and entry_type == 2:
                value_range = (entry_start, entry_end)
        if name is None or value_range is None:
            continue
        if name not in limits:
            counts[name] = 0  # the parsed request is refused by name; nothing to count
            continue
        counts[name] = counts.get(name, 0) + tensor_wire_value_count(data, *value_range, stop_above=limits[name])
    return counts


def check_wire_value_counts(data: bytes, limits: Mapping[str, int]) -> None:
    """Refuses a serialized PredictRequest carrying more values for an input than a full batch holds."""
    try:
        counts = predict_request_input_counts(data, limits)
    except WireFormatError as e:
        raise invalid_argument(f"The PredictRequest is not a valid protobuf message ({e}).") from e
    for name, count in sorted(counts.items()):
        if name in limits and count > limits[name]:
            raise invalid_argument(
                f"Input {name} carries more than {limits[name]} values, the most a full batch of this signature "
                "holds; send fewer examples per request."
            )


# ------------------------------------------------------------------------------------------------ in flight
class AdmissionControl:
    """Counts requests (and their bytes) in flight over both transports; past either bound, UNAVAILABLE."""

    def __init__(self, max_requests: int, max_bytes: int) -> None:
        self.max_requests = max_requests
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self.requests = 0
        self.bytes = 0

    def admit(self, size: int) -> None:
        """Takes a slot for a request of `size` bytes, or raises UNAVAILABLE (HTTP 503) saying the server is full."""
        with self._lock:
            if self.requests >= self.max_requests:
                raise unavailable(
                    f"Server is overloaded: {self.requests} requests in flight, the limit is {self.max_requests}; "
                    "retry with backoff."
                )
            if self.requests and self.bytes + size > self.max_bytes:
                raise unavailable(
                    f"Server is overloaded: {self.bytes} request bytes in flight and this request adds {size}, "
                    f"over the limit of {self.max_bytes}; retry with backoff."
                )
            self.requests += 1
            self.bytes += size

    def grow(self, extra: int) -> None:
        """More bytes for an admitted request (a chunked body); UNAVAILABLE when they do not fit."""
        with self._lock:
            if self.requests > 1 and self.bytes + extra > self.max_bytes:
                raise unavailable(
                    f"Server is overloaded: {self.bytes} request bytes in flight; retry with backoff."
                )
            self.bytes += extra

    def release(self, size: int) -> None:
        with self._lock:
            self.requests -= 1
            self.bytes -= size
