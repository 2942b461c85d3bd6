"""TensorProto <-> numpy array conversions for the gRPC API and the request logs, the common dtypes without
tf.make_ndarray's and tf.make_tensor_proto's per-call overhead."""
from __future__ import annotations

import math

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import types_pb2


def _filled_vector(tensor, dtype: int, most: int) -> np.ndarray | None:
    """What clients send, converted at once: a rank-1 TensorProto of at most `most` elements whose values are as many
    as its shape says, in its dtype's value field. Every check of `check_tensor_proto` passes for such a tensor, and
    reading the proto once here rather than in each check and in `tensor_proto_to_array` is most of a gRPC request's
    own cost. None for any other tensor: `_prepare` then checks and converts it in full."""
    fast = _FAST_DTYPES.get(dtype)
    if fast is None:
        return None
    dims = tensor.tensor_shape.dim
    if len(dims) != 1:
        return None
    size = dims[0].size
    values = getattr(tensor, fast[0])
    if len(values) != size or size > most or tensor.tensor_content:
        return None
    return np.array(list(values), dtype=fast[1])  # from a list: numpy reads a repeated field value by value


def tensor_proto_to_array(tensor, declared: list[int]) -> np.ndarray:
    """The TensorProto (of shape `declared`) as an array; the common case (one value per element in the dtype's
    field) without tf.make_ndarray's per-call overhead."""
    fast = _FAST_DTYPES.get(tensor.dtype)
    if fast is not None and not tensor.tensor_content:
        field, numpy_dtype = fast
        values = getattr(tensor, field)
        if len(values) == math.prod(declared):
            # From a list: numpy reads a protobuf repeated field value by value, three times slower.
            array = np.array(list(values), dtype=numpy_dtype)
            return array if len(declared) == 1 else array.reshape(declared)
    return tf.make_ndarray(tensor)


def array_to_tensor_proto(value: np.ndarray, proto) -> None:
    """Fills `proto` as tf.make_tensor_proto would (values in the dtype's field, as TF Serving answers), faster."""
    native = _NATIVE_FIELDS.get(value.dtype)
    if native is not None:  # the common dtypes in this machine's byte order: one dict lookup
        proto.dtype = native[0]
        dims = proto.tensor_shape.dim
        for size in value.shape:
            dims.add(size=size)
        getattr(proto, native[1]).extend(value.ravel().tolist())
        return
    if value.dtype == object:
        items = value.ravel().tolist()
        if all(type(item) is bytes for item in items):  # strings: what make_tensor_proto fills, at a tenth the cost
            proto.dtype = types_pb2.DT_STRING
            proto.tensor_shape.SetInParent()  # a scalar's shape is there, empty, as make_tensor_proto writes it
            for size in value.shape:
                proto.tensor_shape.dim.add().size = size
            proto.string_val.extend(items)
            return
    field = _FAST_FIELDS.get(value.dtype.kind + str(value.dtype.itemsize))
    if field is None or value.dtype == object:
        proto.CopyFrom(tf.make_tensor_proto(value))
        return
    dtype_enum, name = field
    proto.dtype = dtype_enum
    for size in value.shape:
        proto.tensor_shape.dim.add().size = size
    getattr(proto, name).extend(value.ravel().tolist())


_FAST_FIELDS = {
    "f4": (types_pb2.DT_FLOAT, "float_val"), "f8": (types_pb2.DT_DOUBLE, "double_val"),
    "i4": (types_pb2.DT_INT32, "int_val"), "i8": (types_pb2.DT_INT64, "int64_val"),
    "b1": (types_pb2.DT_BOOL, "bool_val"),
}
_NATIVE_FIELDS = {np.dtype(np.float32): _FAST_FIELDS["f4"], np.dtype(np.float64): _FAST_FIELDS["f8"],
                  np.dtype(np.int32): _FAST_FIELDS["i4"], np.dtype(np.int64): _FAST_FIELDS["i8"],
                  np.dtype(np.bool_): _FAST_FIELDS["b1"]}
_FAST_DTYPES = {
    types_pb2.DT_FLOAT: ("float_val", np.float32), types_pb2.DT_DOUBLE: ("double_val", np.float64),
    types_pb2.DT_INT32: ("int_val", np.int32), types_pb2.DT_INT64: ("int64_val", np.int64),
    types_pb2.DT_BOOL: ("bool_val", np.bool_), types_pb2.DT_STRING: ("string_val", object),
}
