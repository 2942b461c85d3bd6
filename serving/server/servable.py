"""One loaded model version: its SavedModel signatures, ready to call from many threads at once."""
from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
from google.protobuf import message, text_format
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2
from tensorflow.python.distribute.distribute_utils import is_distributed_variable
from tensorflow.python.eager.polymorphic_function.concrete_function import ConcreteFunction
from tensorflow_serving.apis import get_model_metadata_pb2

from serving.server.errors import invalid_argument
from serving.server.limits import max_input_elements, signature_dims

DEFAULT_SIGNATURE = "serving_default"
# SignatureDefs that describe graph initialisation, not something a client can call.
INTERNAL_SIGNATURES = frozenset({"__saved_model_init_op"})


@dataclass(frozen=True)
class Signature:
    """A callable signature: the SignatureDef's tensor infos and the concrete function that runs it."""

    name: str
    inputs: Mapping[str, meta_graph_pb2.TensorInfo]
    outputs: Mapping[str, meta_graph_pb2.TensorInfo]
    function: Any

    @functools.cached_property
    def input_dtypes(self) -> dict[str, tf.DType]:
        return {name: tf.dtypes.as_dtype(info.dtype) for name, info in self.inputs.items()}

    @functools.cached_property
    def input_dtype_enums(self) -> dict[str, int]:
        """Each input's DataType enum, as a TensorProto's `dtype` holds it."""
        return {name: info.dtype for name, info in self.inputs.items()}

    @functools.cached_property
    def input_dims(self) -> dict[str, list[int] | None]:
        """Each input's declared shape (-1: any size; None: unknown rank), read from the protos once."""
        return {name: signature_dims(info) for name, info in self.inputs.items()}

    @functools.cached_property
    def input_shape_patterns(self) -> dict[str, tuple[int, tuple[tuple[int, int], ...]] | None]:
        """Each input's (rank, (axis, size) of its fixed dimensions); None for unknown rank."""
        return {name: None if dims is None else (len(dims), tuple((a, d) for a, d in enumerate(dims) if d >= 0))
                for name, dims in self.input_dims.items()}

    def max_input_elements(self, max_batch_size: int) -> dict[str, int]:
        """The most elements each input can hold in a full batch (see serving.server.limits.max_input_elements)."""
        cache = self.__dict__.setdefault("_max_elements", {})
        if max_batch_size not in cache:
            cache[max_batch_size] = {name: max_input_elements(info, max_batch_size)
                                     for name, info in self.inputs.items()}
        return cache[max_batch_size]

    @functools.cached_property
    def flat_call(self) -> tuple[tuple[str, ...], Callable[[list], Any]] | None:
        """The input names in the function's flat order and its flat call (see `flat_signature_call`)."""
        return flat_signature_call(self.function, self.inputs.keys())

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs for `inputs`, which the caller has checked against the signature (`check_inputs`)."""
        dtypes = self.input_dtypes
        try:
            if self.flat_call is not None:
                order, call = self.flat_call
                outputs = call([tf.constant(inputs[name], dtype=dtypes[name]) for name in order])
            else:
                outputs = self.function(**{name: tf.constant(value, dtype=dtypes[name])
                                           for name, value in inputs.items()})
        except (tf.errors.InvalidArgumentError, ValueError, TypeError) as e:
            # Inputs passed the signature checks but the graph rejected their values (e.g. a failed assert).
            raise invalid_argument(f"The model rejected the inputs: {kernel_message(e)}") from e
        return {name: tensor.numpy() for name, tensor in outputs.items()}


@dataclass(frozen=True)
class ServableVersion:
    """A loaded version of a model. Holding a reference keeps it usable even after it is unloaded."""

    model_name: str
    version: int
    path: str
    signature_def_map: get_model_metadata_pb2.SignatureDefMap
    signatures: Mapping[str, Signature]
    loaded_object: Any

    def signature(self, name: str) -> Signature:
        resolved = name or DEFAULT_SIGNATURE
        found = self.signatures.get(resolved)
        if found is None:
            raise invalid_argument(f'Serving signature name: "{resolved}" not found in signature def')
        return found


def flat_signature_call(function: Any, names: Iterable[str]) -> tuple[tuple[str, ...], Callable[[list], Any]] | None:
    """(input names in flat order, a call taking the input tensors in that order) for a SavedModel signature function.

    TF's public call binds the keyword arguments to the function's input structure on every call, and a loaded
    function then looks for distributed variables among its captures (76 in the taxi model): about 0.4 ms per call,
    all of it holding the GIL, as much as running the model on a small batch. The server checks every request
    against the signature before it gets here, so the tensors go straight to the flat call the public call ends
    with. None (then the public call is used) unless `function` is a concrete function of keyword tensors named
    `names` whose graph inputs are those tensors followed by its captures.
    """
    try:
        args, kwargs = function.structured_input_signature
        placeholders, captured = function.inputs, function.captured_inputs
    except (AttributeError, TypeError, ValueError):
        return None
    if not isinstance(function, ConcreteFunction) or args or set(kwargs) != set(names):
        return None
    if not all(isinstance(spec, tf.TensorSpec) for spec in kwargs.values()):
        return None
    order = tuple(tf.nest.flatten({name: name for name in kwargs}))  # the order TF flattens the arguments in
    if len(placeholders) != len(order) + len(captured):
        return None
    if [p.dtype for p in placeholders[:len(order)]] != [kwargs[name].dtype for name in order]:
        return None
    if any(is_distributed_variable(capture) for capture in captured):
        call_flat = function._call_flat  # a loaded function's own: it swaps those variables for their handles
    else:
        call_flat = functools.partial(ConcreteFunction._call_flat, function)
    return order, lambda tensors: call_flat(tensors, function.captured_inputs)


def dtype_label(dtype: tf.DType | int) -> str:
    """TF Serving's spelling of a dtype in messages: float, int64, string."""
    return types_pb2.DataType.Name(tf.dtypes.as_dtype(dtype).as_datatype_enum)[3:].lower()


class ServableLoadError(Exception):
    """A version folder that could not be loaded; `code` is the canonical status name for model status."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def read_signature_defs(export_dir: Path) -> get_model_metadata_pb2.SignatureDefMap:
    """The SignatureDefs of the SavedModel's serving MetaGraph, as TF Serving reports them in metadata."""
    pb_path = export_dir / "saved_model.pb"
    saved_model = saved_model_pb2.SavedModel()
    try:
        if pb_path.is_file():
            saved_model.ParseFromString(pb_path.read_bytes())
        elif (export_dir / "saved_model.pbtxt").is_file():
            text_format.Parse((export_dir / "saved_model.pbtxt").read_text(), saved_model)
        else:
            saved_model = None
    except (message.DecodeError, text_format.ParseError, OSError, UnicodeDecodeError) as e:
        raise ServableLoadError("DATA_LOSS", f"The SavedModel at {export_dir} is corrupt: {_first_line(e)}") from e
    if saved_model is None:
        raise ServableLoadError(
            "NOT_FOUND",
            f"Could not find SavedModel .pb or .pbtxt at supplied export directory path: {export_dir}",
        )
    serving_graphs = [g for g in saved_model.meta_graphs if "serve" in g.meta_info_def.tags]
    if not serving_graphs:
        raise ServableLoadError("NOT_FOUND", f"SavedModel at {export_dir} has no MetaGraph tagged 'serve'.")
    signature_defs = get_model_metadata_pb2.SignatureDefMap()
    for name, signature_def in serving_graphs[0].signature_def.items():
        signature_defs.signature_def[name].CopyFrom(signature_def)
    return signature_defs


def load_servable_version(model_name: str, version: int, path: str | Path) -> ServableVersion:
    """Loads the SavedModel at `path`; raises ServableLoadError with a reason when it cannot be served."""
    export_dir = Path(path)
    signature_defs = read_signature_defs(export_dir)
    try:
        loaded = tf.saved_model.load(str(export_dir), tags=["serve"])
    except Exception as e:  # noqa: BLE001 - any loader failure is reported in model status, never raised to clients
        raise ServableLoadError(
            "INVALID_ARGUMENT", f"Loading the SavedModel at {export_dir} failed: {_first_line(e)}"
        ) from e
    signatures = {}
    for name, function in loaded.signatures.items():
        if name in INTERNAL_SIGNATURES or name not in signature_defs.signature_def:
            continue
        signature_def = signature_defs.signature_def[name]
        signatures[name] = Signature(name, dict(signature_def.inputs), dict(signature_def.outputs), function)
    if not signatures:
        raise ServableLoadError("INVALID_ARGUMENT", f"SavedModel at {export_dir} has no callable signatures.")
    return ServableVersion(model_name, version, str(export_dir), signature_defs, signatures, loaded)


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


# What TensorFlow's Python runtime puts before a kernel's error (tensorflow/python/eager/polymorphic_function/
# atomic_function.py, InterpolateRuntimeError.interpolate) and after it (the eager op's name).
_PREAMBLE = "Graph execution error:"
_DETECTED_AT = re.compile(r"^Detected at node .* defined at \(most recent call last\):$")
_FRAME = re.compile(r"^(  File |    |<stack traces unavailable>$)")
_OP_SUFFIX = re.compile(r"\s*\[Op:[^\]]*\]$")
# A gRPC error's message travels in the grpc-message trailer, within gRPC's default 8 KiB of metadata; REST gets the
# same message.
MAX_ERROR_CHARS = 4096


def kernel_message(error: Exception) -> str:
    """The failed kernel's whole message and the node it names, as TF Serving returns it: without the Python
    runtime's preamble and stack traces, which name this server's code, not the user's inputs; at most
    MAX_ERROR_CHARS characters and a count of the rest."""
    lines = str(error).strip().splitlines()
    if lines and lines[0].strip() == _PREAMBLE:
        lines = lines[1:]
        while lines and (not lines[0].strip() or _DETECTED_AT.match(lines[0]) or _FRAME.match(lines[0])):
            lines = lines[1:]
    text = _OP_SUFFIX.sub("", "\n".join(lines)).strip() or type(error).__name__
    if len(text) > MAX_ERROR_CHARS:
        cut = len(text) - MAX_ERROR_CHARS
        text = f"{text[:MAX_ERROR_CHARS]}... ({cut:,} more characters)"
    return text
