"""TF Serving's gRPC messages, stubs and tensors for the clients, without importing TensorFlow.

The tensorflow-serving-api modules (`tensorflow_serving.apis.*_pb2`) import `tensorflow.core.framework.*_pb2`, and
importing any module under `tensorflow` first runs `tensorflow/__init__.py`: all of TensorFlow, seconds before a
client's first request. The generated modules hold their `.proto` files as serialized FileDescriptorProtos; this
module reads those bytes from the installed files (parsed, never executed) into a descriptor pool of its own and
builds the message classes from it. The wire format comes from the descriptors alone, so a request serializes to the
same bytes as one built with the official modules, and `tensor_proto` and `tensor_values` do what TensorFlow's
`make_tensor_proto` and `make_ndarray` do for the dtypes a TF Serving signature uses.

    protos = serving_protos()
    request = protos.PredictRequest()
    request.inputs["fare"].CopyFrom(tensor_proto(np.array([12.5], np.float32), "DT_FLOAT", protos))
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

# The three services' messages: Predict and GetModelMetadata (PredictionService), GetModelStatus (ModelService).
SERVING_MODULES = (
    "tensorflow_serving.apis.predict_pb2",
    "tensorflow_serving.apis.get_model_metadata_pb2",
    "tensorflow_serving.apis.get_model_status_pb2",
)
PREDICT_METHOD = "/tensorflow.serving.PredictionService/Predict"
GET_MODEL_METADATA_METHOD = "/tensorflow.serving.PredictionService/GetModelMetadata"
GET_MODEL_STATUS_METHOD = "/tensorflow.serving.ModelService/GetModelStatus"

# dtype name -> (numpy dtype, the TensorProto field a small tensor's values go in, whether make_tensor_proto packs
# more than one value into tensor_content). DT_UINT16, DT_BOOL and DT_STRING are never packed (tensor_util.py).
_ENCODINGS: dict[str, tuple[Any, str, bool]] = {
    "DT_FLOAT": (np.float32, "float_val", True),
    "DT_DOUBLE": (np.float64, "double_val", True),
    "DT_HALF": (np.float16, "half_val", True),
    "DT_INT8": (np.int8, "int_val", True),
    "DT_INT16": (np.int16, "int_val", True),
    "DT_INT32": (np.int32, "int_val", True),
    "DT_INT64": (np.int64, "int64_val", True),
    "DT_UINT8": (np.uint8, "int_val", True),
    "DT_UINT16": (np.uint16, "int_val", False),
    "DT_UINT32": (np.uint32, "uint32_val", True),
    "DT_UINT64": (np.uint64, "uint64_val", True),
    "DT_BOOL": (np.bool_, "bool_val", False),
    "DT_STRING": (object, "string_val", False),
}

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServingProtos:
    """The message classes the clients use, and DataType's names and numbers."""

    PredictRequest: type
    PredictResponse: type
    GetModelMetadataRequest: type
    GetModelMetadataResponse: type
    SignatureDefMap: type
    GetModelStatusRequest: type
    GetModelStatusResponse: type
    TensorProto: type
    data_types: Mapping[str, int]
    official: bool  # built from the official modules (TensorFlow imported), not from their descriptors

    @cached_property
    def data_type_names(self) -> dict[int, str]:
        return {number: name for name, number in self.data_types.items()}


class PredictionServiceStub:
    """The PredictionService methods the clients call, named and built on a channel as the official stub does."""

    def __init__(self, channel: Any, protos: ServingProtos) -> None:
        self.Predict = channel.unary_unary(
            PREDICT_METHOD, request_serializer=protos.PredictRequest.SerializeToString,
            response_deserializer=protos.PredictResponse.FromString)
        self.GetModelMetadata = channel.unary_unary(
            GET_MODEL_METADATA_METHOD, request_serializer=protos.GetModelMetadataRequest.SerializeToString,
            response_deserializer=protos.GetModelMetadataResponse.FromString)


class ModelServiceStub:
    """The ModelService method the clients call."""

    def __init__(self, channel: Any, protos: ServingProtos) -> None:
        self.GetModelStatus = channel.unary_unary(
            GET_MODEL_STATUS_METHOD, request_serializer=protos.GetModelStatusRequest.SerializeToString,
            response_deserializer=protos.GetModelStatusResponse.FromString)


_lock = threading.Lock()
_protos: ServingProtos | None = None


def serving_protos() -> ServingProtos:
    """The clients' message classes, built once per process from the installed modules' descriptors (the official
    modules, importing TensorFlow, where those files cannot be read that way)."""
    global _protos
    with _lock:  # one pool per process: a message from one pool cannot be serialized by another pool's class
        if _protos is None:
            try:
                _protos = _from_descriptors()
            except (OSError, SyntaxError, ValueError, TypeError, KeyError, AttributeError, ImportError) as e:
                _log.debug("reading TF Serving's descriptors failed (%s); importing the official modules", e)
                _protos = _from_official_modules()
        return _protos


def _from_descriptors() -> ServingProtos:
    from google.protobuf import descriptor_pool, message_factory

    # A pool of our own, not the default one: a later `import tensorflow` registers the same files there unharmed.
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()
    for module in SERVING_MODULES:
        _add_file(pool, module, added)

    def message(full_name: str) -> type:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(full_name))

    data_type = pool.FindEnumTypeByName("tensorflow.DataType")
    return ServingProtos(
        PredictRequest=message("tensorflow.serving.PredictRequest"),
        PredictResponse=message("tensorflow.serving.PredictResponse"),
        GetModelMetadataRequest=message("tensorflow.serving.GetModelMetadataRequest"),
        GetModelMetadataResponse=message("tensorflow.serving.GetModelMetadataResponse"),
        SignatureDefMap=message("tensorflow.serving.SignatureDefMap"),
        GetModelStatusRequest=message("tensorflow.serving.GetModelStatusRequest"),
        GetModelStatusResponse=message("tensorflow.serving.GetModelStatusResponse"),
        TensorProto=message("tensorflow.TensorProto"),
        data_types={value.name: value.number for value in data_type.values},
        official=False,
    )


def _add_file(pool: Any, module: str, added: set[str]) -> None:
    """Adds the .proto file of generated module `module` to `pool`, after the files it imports."""
    if module in added:
        return
    added.add(module)
    if module.startswith("google.protobuf."):
        # protobuf's own well-known types: importing them imports nothing else.
        pool.AddSerializedFile(importlib.import_module(module).DESCRIPTOR.serialized_pb)
        return
    dependencies, serialized = _read_generated_module(_source_file(module))
    for dependency in dependencies:
        _add_file(pool, dependency, added)
    pool.AddSerializedFile(serialized)


def _source_file(module: str) -> Path:
    """Where `module`'s source is, found without importing its packages (find_spec of a submodule would)."""
    top, _, rest = module.partition(".")
    spec = importlib.util.find_spec(top)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder, *rest.split(".")).with_suffix(".py")
        if path.is_file():
            return path
    raise ImportError(f"no source file for {module}")


def _read_generated_module(path: Path) -> tuple[list[str], bytes]:
    """The generated modules `path` imports, and its serialized FileDescriptorProto."""
    dependencies, serialized = [], None
    for node in ast.parse(path.read_bytes(), str(path)).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if alias.name.endswith("_pb2"):
                    dependencies.append(f"{node.module}.{alias.name}")
                elif alias.name == "*" and node.module.endswith("_pb2"):
                    dependencies.append(node.module)
        for call in ast.walk(node):
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "AddSerializedFile" and len(call.args) == 1):
                serialized = ast.literal_eval(call.args[0])
    if not isinstance(serialized, bytes):
        raise ValueError(f"{path} holds no serialized file descriptor")
    return dependencies, serialized


def _from_official_modules() -> ServingProtos:
    from tensorflow.core.framework import tensor_pb2, types_pb2
    from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2, predict_pb2

    return ServingProtos(
        PredictRequest=predict_pb2.PredictRequest,
        PredictResponse=predict_pb2.PredictResponse,
        GetModelMetadataRequest=get_model_metadata_pb2.GetModelMetadataRequest,
        GetModelMetadataResponse=get_model_metadata_pb2.GetModelMetadataResponse,
        SignatureDefMap=get_model_metadata_pb2.SignatureDefMap,
        GetModelStatusRequest=get_model_status_pb2.GetModelStatusRequest,
        GetModelStatusResponse=get_model_status_pb2.GetModelStatusResponse,
        TensorProto=tensor_pb2.TensorProto,
        data_types={value.name: value.number for value in types_pb2.DataType.DESCRIPTOR.values},
        official=True,
    )


def set_model_spec(spec: Any, model: str, version: int | None = None, label: str | None = None,
                   signature_name: str = "") -> None:
    """Fills a ModelSpec: the model, then a version number or a version label (neither: the latest version)."""
    spec.name = model
    if version is not None:
        spec.version.value = int(version)
    elif label:
        spec.version_label = label
    if signature_name:
        spec.signature_name = signature_name


def predict_request(protos: ServingProtos, model: str, columns: Mapping[str, np.ndarray], dtypes: Mapping[str, str],
                    version: int | None = None, label: str | None = None,
                    signature_name: str = "serving_default") -> Any:
    """A PredictRequest with one tensor per column, each of its dtype (a DataType name), in the columns' order."""
    request = protos.PredictRequest()
    set_model_spec(request.model_spec, model, version, label, signature_name)
    for name, values in columns.items():
        request.inputs[name].CopyFrom(tensor_proto(values, dtypes[name], protos))
    return request


def metadata_request(protos: ServingProtos, model: str, version: int | None = None, label: str | None = None) -> Any:
    """A GetModelMetadataRequest for the signatures."""
    request = protos.GetModelMetadataRequest(metadata_field=["signature_def"])
    set_model_spec(request.model_spec, model, version, label)
    return request


def status_request(protos: ServingProtos, model: str, version: int | None = None, label: str | None = None) -> Any:
    """A GetModelStatusRequest."""
    request = protos.GetModelStatusRequest()
    set_model_spec(request.model_spec, model, version, label)
    return request


def tensor_proto(values: np.ndarray, dtype: str, protos: ServingProtos) -> Any:
    """`values` as a TensorProto of `dtype` (a DataType name), as `tf.make_tensor_proto(values, dtype=...)` makes
    it; dtypes this module does not encode are left to TensorFlow."""
    encoding = _ENCODINGS.get(dtype)
    if encoding is None:
        return _tensorflow_tensor_proto(values, dtype, protos)
    numpy_dtype, field, packed = encoding
    array = np.asarray(values).astype(numpy_dtype)
    tensor = protos.TensorProto(dtype=protos.data_types[dtype])
    tensor.tensor_shape.SetInParent()  # make_tensor_proto sets the shape even for a scalar
    for size in array.shape:
        tensor.tensor_shape.dim.add(size=size)
    if packed and array.size > 1:
        tensor.tensor_content = array.tobytes()
        return tensor
    flat = array.ravel()
    if dtype == "DT_STRING":
        getattr(tensor, field).extend(_as_bytes(value) for value in flat)
    elif dtype == "DT_HALF":
        getattr(tensor, field).extend(flat.view(np.uint16).tolist())  # half_val holds the 16 bits
    else:
        getattr(tensor, field).extend(flat.tolist())
    return tensor


def tensor_values(tensor: Any, protos: ServingProtos) -> np.ndarray:
    """A TensorProto's values as an array, as `tf.make_ndarray` gives them (strings as bytes)."""
    dtype = protos.data_type_names.get(tensor.dtype, "")
    encoding = _ENCODINGS.get(dtype)
    if encoding is None:
        return _tensorflow_values(tensor)
    numpy_dtype, field, _ = encoding
    shape = [dim.size for dim in tensor.tensor_shape.dim]
    count = int(np.prod(shape, dtype=np.int64))
    if tensor.tensor_content:
        return np.frombuffer(tensor.tensor_content, dtype=numpy_dtype).copy().reshape(shape)
    if dtype == "DT_STRING":
        strings = list(tensor.string_val)
        # A shorter list stands for its last value repeated (TensorFlow's constant folding writes them so).
        strings.extend([strings[-1] if strings else b""] * (count - len(strings)))
        return np.array(strings, dtype=object).reshape(shape)
    if dtype == "DT_HALF":
        values = np.fromiter(tensor.half_val, dtype=np.uint16).view(np.float16)
    else:
        values = np.fromiter(getattr(tensor, field), dtype=numpy_dtype)
    if values.size == 0:
        return np.zeros(shape, numpy_dtype)
    if values.size != count:
        values = np.pad(values, (0, count - values.size), "edge")
    return values.reshape(shape)


def _as_bytes(value: Any) -> bytes:
    """TensorFlow's compat.as_bytes: text as UTF-8, bytes as they are."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    raise TypeError(f"Expected a string or bytes for a DT_STRING tensor, got {value!r} ({type(value).__name__}).")


def _tensorflow_tensor_proto(values: np.ndarray, dtype: str, protos: ServingProtos) -> Any:
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2

    made = tf.make_tensor_proto(values, dtype=tf.dtypes.as_dtype(types_pb2.DataType.Value(dtype)))
    return made if protos.official else protos.TensorProto.FromString(made.SerializeToString())


def _tensorflow_values(tensor: Any) -> np.ndarray:
    import tensorflow as tf
    from tensorflow.core.framework import tensor_pb2

    return tf.make_ndarray(tensor_pb2.TensorProto.FromString(tensor.SerializeToString()))
