"""TF Serving's REST JSON and tensors: the row (`instances`) and columnar (`inputs`) request formats to input arrays,
output arrays to `predictions` or `outputs`, checked against the signature's dtypes as TF Serving's own parser does."""
from __future__ import annotations

import base64
import binascii
import functools
import itertools
import json
import math
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2

from serving.server.errors import invalid_argument
from serving.server.limits import check_batch_size, check_float_range
from serving.server.servable import dtype_label

# Columns of at most this many values are range-checked in Python rather than numpy.
SMALL_COLUMN = 64


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
