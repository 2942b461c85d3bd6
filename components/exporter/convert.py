"""Converters from the trained Keras model to TFLite, ONNX and TF.js, and the SavedModel as pushed.

The SavedModel carries the Transform graph and takes raw features. The other formats hold the model over
transformed features (the `<name>_xf` tensors of preprocessing.py, float32 values and int32 ids, each [rows, 1]),
because none of their runtimes runs TF Transform's vocabulary tables; preprocessing.json, shipped beside each,
holds the Transform constants and preprocessing.py / preprocessing.mjs apply them.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
from absl import logging

from components import artifacts
from components.exporter.preprocessing import transformed_inputs
from components.model import model_output
from components.tasks import Task

NODE_DIR = Path(__file__).parent / "node"
# What each exported folder holds beside the model, so that it can be copied out and used alone.
PYTHON_PREPROCESSING = Path(__file__).parent / "preprocessing.py"
JS_FILES = (NODE_DIR / "preprocessing.mjs", NODE_DIR / "predict.mjs")


def core_input_specs(spec: dict[str, Any]) -> list[tf.TensorSpec]:
    """The transformed inputs, in the order of the preprocessing spec."""
    return [tf.TensorSpec([None, 1], tf.as_dtype(dtype), name=name) for name, dtype in transformed_inputs(spec)]


def core_task(spec: dict[str, Any]) -> Task:
    described = spec.get("task") or {"kind": "binary"}
    return Task(described["kind"], classes=tuple(described.get("classes", ())))


class CoreModule(tf.Module):
    """The Keras model over transformed features with a signature every converter reads. Its one output is the
    model's numeric output (settings.tasks.OUTPUT_NAMES): probabilities [rows] or [rows, classes], or values [rows]; the
    class names of a multiclass model travel in preprocessing.json, and the shipped postprocess step applies them."""

    def __init__(self, model: tf.keras.Model, spec: dict[str, Any]):
        super().__init__()
        self.model = model
        self._task = core_task(spec)
        self._names = [s.name for s in core_input_specs(spec)]
        # Plain tensor code: AutoGraph's source conversion of the Keras call chain would cost seconds per export.
        self.serve = tf.function(self._serve, input_signature=core_input_specs(spec), autograph=False)

    def _serve(self, *tensors: tf.Tensor) -> dict[str, tf.Tensor]:
        features = {}
        for name, tensor in zip(self._names, tensors, strict=True):
            dtype = self.model.get_layer(name).dtype if name in self.model.input_names else tensor.dtype
            features[name] = tf.cast(tensor, dtype) if tensor.dtype != dtype else tensor
        return {self._task.output_name: model_output(self._task, self.model(features))}


def save_core_model(model: tf.keras.Model, spec: dict[str, Any], export_dir: str) -> CoreModule:
    """A SavedModel of the model over transformed features: what TFLite and TF.js convert from."""
    module = CoreModule(model, spec)
    tf.saved_model.save(module, export_dir, signatures={"serving_default": module.serve.get_concrete_function()})
    return module


def export_saved_model(serving_model_dir: str, export_dir: str) -> None:
    """The SavedModel as TF Serving loads it (raw features in, Transform graph inside), copied unchanged from the
    Model artifact (any file system) into `export_dir`."""
    artifacts.copy_tree(serving_model_dir, export_dir)


@contextlib.contextmanager
def _converter_output_to_log() -> Iterator[None]:
    """The TFLite converter's C++ code writes to file descriptor 2 directly; its lines go to the run's log instead
    of the console."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            text = captured.read().decode(errors="replace").strip()
            if text:
                logging.info("TFLite converter:\n%s", text)


def tflite_converter(core_saved_model: str) -> tf.lite.TFLiteConverter:
    """One converter for every variant: it loads the SavedModel once (seconds per load), and export_tflite sets
    each variant's settings afresh (the flatbuffers are byte for byte those of a converter per variant)."""
    return tf.lite.TFLiteConverter.from_saved_model(core_saved_model)


def export_tflite(
    source: str | tf.lite.TFLiteConverter,
    variant: str,
    path: str,
    representative_inputs: Callable[[], Iterator[dict[str, np.ndarray]]] | None = None,
) -> None:
    """float32: as trained. dynamic: int8 weights, float activations. float16: float16 weights.
    int8: int8 weights and activations, ranges calibrated on `representative_inputs` (transformed training rows);
    the inputs and the output stay float32 / int32 so the request does not change. `source`: a SavedModel folder,
    or a tflite_converter to share between variants."""
    converter = tflite_converter(source) if isinstance(source, str) else source
    if variant == "int8" and representative_inputs is None:
        raise ValueError("int8 quantization needs representative inputs to calibrate its ranges.")
    converter.optimizations = [tf.lite.Optimize.DEFAULT] if variant in ("dynamic", "float16", "int8") else []
    converter.target_spec.supported_types = [tf.float16] if variant == "float16" else []
    converter.target_spec.supported_ops = [
        tf.lite.OpsSet.TFLITE_BUILTINS_INT8 if variant == "int8" else tf.lite.OpsSet.TFLITE_BUILTINS]
    converter.representative_dataset = representative_inputs if variant == "int8" else None
    with _converter_output_to_log():
        flatbuffer = converter.convert()
    Path(path).write_bytes(flatbuffer)


def export_onnx(module: CoreModule, spec: dict[str, Any], path: str, opset: int) -> None:
    """tf2onnx from the model's function; `onnx.checker` must accept the result."""
    import onnx
    import tf2onnx

    model_proto, _ = tf2onnx.convert.from_function(module.serve, input_signature=core_input_specs(spec), opset=opset)
    stable_onnx_names(model_proto.graph)
    onnx.checker.check_model(model_proto, full_check=True)
    onnx.save(model_proto, path)


# The numbers in names that depend on what ran before in the process: TensorFlow's op ids
# (`embedding_lookup/10192:0`) and tf2onnx's own name counter (`const_fold_opt__15`).
_PROCESS_NUMBER = re.compile(r"(?:(?<=/)|(?<=__))\d+(?=[:/]|$)")


def stable_onnx_names(graph: Any) -> None:
    """Renumbers those numbers in graph order, so that one model converts to the same bytes in any process and the
    publisher recognises a model it already holds; the graph's inputs and outputs keep their names."""
    kept = {value.name for value in [*graph.input, *graph.output]}
    numbers: dict[tuple[str, str], str] = {}

    def renumber(match: re.Match[str]) -> str:
        prefix = match.string[:match.start()]
        same_prefix = sum(1 for known in numbers if known[0] == prefix)
        return numbers.setdefault((prefix, match.group(0)), str(same_prefix))

    def stable(name: str) -> str:
        return name if name in kept else _PROCESS_NUMBER.sub(renumber, name)

    for node in graph.node:
        node.name = stable(node.name)
        for field in (node.input, node.output):
            names = [stable(name) for name in field]
            del field[:]
            field.extend(names)
    for named in [*graph.initializer, *graph.value_info]:
        named.name = stable(named.name)
    for value in [*graph.input, *graph.output, *graph.value_info]:  # unknown dimensions are named `unk__18`
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param"):
                dim.dim_param = _PROCESS_NUMBER.sub(renumber, dim.dim_param)
    # tf2onnx lists the initializers in the order of their old names.
    initializers = [type(tensor)() for tensor in graph.initializer]
    for copy, tensor in zip(initializers, sorted(graph.initializer, key=lambda tensor: tensor.name), strict=True):
        copy.CopyFrom(tensor)
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    graph.doc_string = "converted by tf2onnx from the model's serving function"  # it named the function's trace


class TfjsConversion:
    """The tensorflowjs converter, run as its command (as a user would) in a process of its own, so that its
    TensorFlow import and conversion overlap the TFLite and ONNX conversions on another core."""

    def __init__(self, core_saved_model: str, export_dir: str):
        command = [
            sys.executable, "-m", "tensorflowjs.converters.converter",
            "--input_format=tf_saved_model", "--output_format=tfjs_graph_model",
            "--signature_name=serving_default", "--saved_model_tags=serve",
            core_saved_model, export_dir,
        ]
        self._export_dir = export_dir
        # A file, not a pipe: nobody reads a pipe until wait(), and a full one would stall the converter.
        self._log = tempfile.TemporaryFile(mode="w+")
        self._process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, text=True,
                                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})

    def wait(self) -> None:
        """Waits for the converter; raises RuntimeError with its last output when it failed."""
        with self._log:
            returncode = self._process.wait()
            self._log.seek(0)
            output = self._log.read().strip()
        if returncode != 0:
            # The whole output goes to the log; the error names its last line, the exception the converter raised.
            logging.error("the tensorflowjs converter failed with exit status %d:\n%s", returncode, output)
            last = next((line.strip() for line in reversed(output.splitlines()) if line.strip()), "")
            raise RuntimeError(f"the tensorflowjs converter failed: {last or f'exit status {returncode}, no output'}")
        # The converter writes protobuf maps (a node's attrs) in an order that differs between processes; sorted
        # keys make one model's model.json the same bytes each time (the weights' order lives in lists, kept).
        model_json = Path(self._export_dir) / "model.json"
        model_json.write_text(json.dumps(json.loads(model_json.read_text()), sort_keys=True))
        for path in JS_FILES:
            shutil.copy(path, self._export_dir)

    def cancel(self) -> None:
        """Stops a converter whose result is no longer wanted (an earlier format failed)."""
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()
        self._log.close()


def ship_preprocessing(spec_path: str, folder: str, language: str) -> None:
    """Copies the spec (and, for Python runtimes, preprocessing.py) into an exported folder."""
    shutil.copy(spec_path, folder)
    if language == "python":
        shutil.copy(PYTHON_PREPROCESSING, folder)
