"""Each exported format run in its own runtime on raw rows: TensorFlow, tf.lite.Interpreter, onnxruntime, Node.js.

Every runner takes the same request (one array per raw feature, as the SavedModel's serving_default) and returns
the model's numeric output: one probability or value per row ([rows]), or a probability per class ([rows, classes]);
`predict_and_time` also times rows sent one at a time, preprocessing included.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from components.exporter.preprocessing import preprocess
from components.model import SERVING_OUTPUT

Columns = dict[str, np.ndarray]


def as_rows(values: Any, rows: int) -> np.ndarray:
    """An output as [rows] (one number per row) or [rows, classes], whatever shape the runtime gave it."""
    values = np.asarray(values).reshape(rows, -1)
    return values.reshape(-1) if values.shape[1] == 1 else values


def spec_output(spec: dict[str, Any]) -> str:
    """The output name of the converted model a preprocessing spec belongs to."""
    return (spec.get("task") or {}).get("output", SERVING_OUTPUT)


def _row(columns: Columns, i: int) -> Columns:
    return {k: v[i : i + 1] for k, v in columns.items()}


def _rows(columns: Columns) -> int:
    return len(next(iter(columns.values())))


class Runner:
    name = ""
    # True for a runtime in a process of its own, which the verification runs beside the in-process ones.
    out_of_process = False

    def predict(self, columns: Columns) -> np.ndarray:
        raise NotImplementedError

    def output_range(self) -> tuple[float, float, float] | None:
        """(lowest, highest, step) of the output when it is dequantized from int8 (TFLiteRunner); None otherwise."""
        return None

    def predict_and_time(self, columns: Columns, timed_rows: int) -> tuple[np.ndarray, list[float]]:
        """Outputs for all rows, then the milliseconds of each of the first `timed_rows` rows sent alone."""
        outputs = self.predict(columns)
        times = []
        for i in range(min(timed_rows, _rows(columns))):
            one = _row(columns, i)
            start = time.perf_counter()
            self.predict(one)
            times.append((time.perf_counter() - start) * 1000)
        return outputs, times


class SavedModelRunner(Runner):
    """The SavedModel's serving_default, Transform graph included, in TensorFlow."""

    def __init__(self, export_dir: str, output_name: str = SERVING_OUTPUT):
        import tensorflow as tf

        self._tf = tf
        self._fn = tf.saved_model.load(export_dir).signatures["serving_default"]
        self._dtypes = {k: s.dtype for k, s in self._fn.structured_input_signature[1].items()}
        self._output = output_name

    def predict(self, columns: Columns) -> np.ndarray:
        tensors = {k: self._tf.constant(columns[k], dtype) for k, dtype in self._dtypes.items()}
        return as_rows(self._fn(**tensors)[self._output].numpy(), _rows(columns))


class TFLiteRunner(Runner):
    def __init__(self, path: str, spec: dict[str, Any]):
        import tensorflow as tf

        self._spec = spec
        self._interpreter = tf.lite.Interpreter(model_path=path)
        self._runner = self._interpreter.get_signature_runner("serving_default")

    def predict(self, columns: Columns) -> np.ndarray:
        return as_rows(self._runner(**preprocess(self._spec, columns))[spec_output(self._spec)], _rows(columns))

    def output_range(self) -> tuple[float, float, float] | None:
        """The range calibration gave the int8 tensor the float output is dequantized from, and its step."""
        output = self._runner.get_output_details()[spec_output(self._spec)]["index"]
        producer = next((op for op in self._interpreter._get_ops_details()  # TFLite has no public view of its ops
                         if op["op_name"] == "DEQUANTIZE" and output in op["outputs"]), None)
        if producer is None:
            return None
        quantized = next(t for t in self._interpreter.get_tensor_details() if t["index"] == producer["inputs"][0])
        scale, zero_point = quantized["quantization"]
        if quantized["dtype"] != np.int8 or not scale:
            return None
        return scale * (-128 - zero_point), scale * (127 - zero_point), scale


class OnnxRunner(Runner):
    def __init__(self, path: str, spec: dict[str, Any]):
        import onnxruntime as ort

        self._spec = spec
        options = ort.SessionOptions()
        options.log_severity_level = 3
        self._session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self._inputs = {i.name.split(":")[0]: i.name for i in self._session.get_inputs()}

    def predict(self, columns: Columns) -> np.ndarray:
        features = preprocess(self._spec, columns)
        feeds = {onnx_name: features[name] for name, onnx_name in self._inputs.items()}
        return as_rows(self._session.run(None, feeds)[0], _rows(columns))


def node_executable() -> str:
    node = shutil.which("node")
    if node is None:
        raise RuntimeError("Node.js is not installed: the TF.js artifact is verified in Node; install Node.js 18+ "
                           "or drop tfjs from export.formats.")
    return node


class TfjsRunner(Runner):
    """Node.js with @tensorflow/tfjs (installed by `make setup` from components/exporter/node/package-lock.json),
    one process per call."""

    out_of_process = True

    def __init__(self, export_dir: str, node_dir: Path, output_name: str = SERVING_OUTPUT):
        if not (node_dir / "node_modules" / "@tensorflow" / "tfjs").is_dir():
            raise RuntimeError(f"@tensorflow/tfjs is not installed in {node_dir}; run `make setup`.")
        self._dir = export_dir
        self._output = output_name
        # The repository's copy of the script shipped in export_dir: it finds @tensorflow/tfjs beside it.
        self._script = node_dir / "predict.mjs"

    def predict_and_time(self, columns: Columns, timed_rows: int) -> tuple[np.ndarray, list[float]]:
        with tempfile.TemporaryDirectory() as tmp:
            request = Path(tmp, "request.json")
            output = Path(tmp, "output.json")
            request.write_text(json.dumps({k: _json_values(v) for k, v in columns.items()}))
            result = subprocess.run(
                [node_executable(), str(self._script), self._dir, str(request), str(output), str(timed_rows)],
                capture_output=True, text=True, timeout=600,
            )
            if result.returncode != 0:
                raise RuntimeError(f"Node.js could not run the TF.js model: {result.stderr.strip()[-2000:]}")
            data = json.loads(output.read_text())
        return as_rows(np.array(data[self._output], dtype=np.float32), _rows(columns)), list(data["latency_ms"])

    def predict(self, columns: Columns) -> np.ndarray:
        return self.predict_and_time(columns, 0)[0]


def _json_values(values: np.ndarray) -> list[Any]:
    """JSON has no NaN: a missing float goes as null, which the JS preprocessing reads as missing."""
    if values.dtype.kind == "f":
        return [None if np.isnan(v) else float(v) for v in values]
    if values.dtype.kind in "iu":
        return [int(v) for v in values]
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]
