"""Exports every configured format into one version folder, runs each in its runtime, and gates on agreement.

The converters and runtimes work on local files, so everything is built and verified in a local staging folder and
then copied to `output_dir`, which may be on any file system (components/artifacts.py).

Layout of `output_dir` (what the Pusher copies to <serving base>/<version>/):
  saved_model.pb, variables/, assets/   the SavedModel TF Serving loads (raw features in)
  tflite/model_<variant>.tflite         + preprocessing.json, preprocessing.py
  onnx/model.onnx                       + preprocessing.json, preprocessing.py
  tfjs/model.json, group1-shard*.bin    + preprocessing.json, preprocessing.mjs, predict.mjs
  export_report.json, export_report.html  (the calibration record and decision threshold inside the JSON)
"""
from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
from absl import logging

from components import artifacts
from components.exporter import convert, report
from components.exporter.preprocessing import SPEC_FILE, preprocess, save_spec
from components.exporter.runtimes import OnnxRunner, Runner, SavedModelRunner, TfjsRunner, TFLiteRunner
from components.tasks import (
    Task,
    degradation_gate,
    describe_figures,
    max_output_difference,
    no_skill_figures,
    task_metrics,
)
from reports.records import (
    ArtifactCheck,
    ArtifactRow,
    CalibrationRecord,
    ExportReport,
    ExportTask,
    OptimizationReport,
    RequestEncoding,
)
from serving.server.warmup import write_warmup_requests
from settings.config import ExportConfig
from settings.tasks import task_metric

FLOAT_ARTIFACTS = ("saved_model", "tflite/float32", "onnx", "tfjs")


class ExportGateError(RuntimeError):
    """An exported format disagrees with the SavedModel beyond its threshold; nothing may be pushed."""


@dataclass
class EvalData:
    """Raw eval rows in the request form, their labels (0/1, class ids or numbers, as the Transform computes
    them), and raw training rows for int8 calibration."""
    columns: dict[str, np.ndarray]
    labels: np.ndarray
    representative: dict[str, np.ndarray]


def _model_size(name: str, path: Path) -> int:
    """Bytes of the model itself: the SavedModel without the other formats beside it, TF.js without its scripts."""
    if path.is_file():
        return path.stat().st_size
    if name == "saved_model":
        files = [path / "saved_model.pb", *(path / "variables").rglob("*"), *(path / "assets").rglob("*")]
    else:
        files = [path / "model.json", *path.glob("*.bin")]
    return sum(f.stat().st_size for f in files if f.is_file())


def _metrics(outputs: np.ndarray, labels: np.ndarray, kind: str = "binary") -> dict[str, float]:
    return task_metrics(kind, outputs, labels)


def spec_task(spec: dict[str, Any]) -> Task:
    """The task a preprocessing spec describes (a binary one for a spec written before task kinds)."""
    return convert.core_task(spec)


def _representative(spec: dict[str, Any], columns: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
    features = preprocess(spec, columns)
    for i in range(len(next(iter(features.values())))):
        yield {name: values[i : i + 1] for name, values in features.items()}


# The largest finite float16: a weight beyond it is stored as infinity in the float16 variant.
FLOAT16_MAX = float(np.finfo(np.float16).max)


def unrepresentable_variants(model: tf.keras.Model, variants: list[str]) -> dict[str, str]:
    """The TFLite variants that cannot hold this model's values, each with the reason: float16 when a weight (a
    regression's label scale or offset, for a label in the tens of thousands) lies beyond float16's range."""
    skipped = {}
    if "float16" not in variants:
        return skipped
    values = [(float(np.max(np.abs(w.numpy()))), f"weight {w.name}") for w in model.weights
              if w.shape.num_elements()]
    # A Rescaling layer's scale and offset are graph constants, not weights; the converter stores them as float16 too.
    values += [(float(np.max(np.abs(getattr(layer, attr)))), f"{layer.name}.{attr}") for layer in model.layers
               if isinstance(layer, tf.keras.layers.Rescaling) for attr in ("scale", "offset")]
    largest, name = max(values, default=(0.0, ""))
    if largest > FLOAT16_MAX:
        skipped["tflite/float16"] = (f"not built: the {name} is {largest:,.6g}, beyond float16's largest value "
                                     f"{FLOAT16_MAX:,.0f}, so the variant would hold infinity there")
    return skipped


def int8_clipped_rows(reference: np.ndarray, low: float, high: float, step: float) -> int:
    """Eval rows whose SavedModel output lies more than one quantization step outside int8's calibrated range, so
    the int8 variant clips it (within one step is rounding, which the degradation gate judges)."""
    values = np.asarray(reference, dtype=np.float64)
    beyond = np.maximum(values - high, low - values) > step
    return int(np.count_nonzero(beyond.reshape(len(values), -1).any(axis=1))) if values.size else 0


def unrepresentable_int8(built: dict[str, tuple[Path, Runner]], reference: np.ndarray, calibration_rows: int
                         ) -> dict[str, str]:
    """int8 when its ranges, calibrated on `calibration_rows` training rows, cannot hold the SavedModel's outputs on
    the eval rows: it would clip them whatever the tolerance, so it is dropped from `built`, not gated."""
    if "tflite/int8" not in built:
        return {}
    path, runner = built["tflite/int8"]
    calibrated = runner.output_range()
    if calibrated is None:
        return {}
    low, high, step = calibrated
    clipped = int8_clipped_rows(reference, low, high, step)
    if not clipped:
        return {}
    del built["tflite/int8"]
    path.unlink()
    values = np.asarray(reference, dtype=np.float64)
    return {"tflite/int8": (
        f"not published: its output range calibrated on {calibration_rows:,} training rows is "
        f"[{low:,.6g}, {high:,.6g}], and {clipped:,} of {len(values):,} eval rows' outputs lie beyond it "
        f"(from {values.min():,.6g} to {values.max():,.6g}), where int8 would clip them; raise "
        f"export.representative_rows or leave int8 out of export.tflite_variants")}


def export_formats(
    serving_model_dir: str,
    model: tf.keras.Model,
    spec: dict[str, Any],
    output_dir: str,
    options: ExportConfig,
    representative: dict[str, np.ndarray] | None = None,
    warmup_rows: dict[str, np.ndarray] | None = None,
) -> dict[str, tuple[Path, Runner]]:
    """Writes every configured format under the local folder `output_dir`; returns each artifact's path and a
    runner for it. `representative`: raw training rows (request form) that int8 quantization calibrates on;
    `warmup_rows`: raw eval rows whose first ones become the SavedModel's warm-up requests."""
    out = Path(output_dir)
    convert.export_saved_model(serving_model_dir, output_dir)
    if warmup_rows:
        # TF Serving and `mlops serve` run these before the version takes traffic (serving/server/warmup.py).
        write_warmup_requests(output_dir, warmup_rows)
    output_name = spec_task(spec).output_name
    built: dict[str, tuple[Path, Runner]] = {"saved_model": (out, SavedModelRunner(output_dir, output_name))}
    with tempfile.TemporaryDirectory() as tmp:
        spec_path = os.path.join(tmp, SPEC_FILE)
        save_spec(spec, spec_path)
        core_dir = os.path.join(tmp, "core")
        module = convert.save_core_model(model, spec, core_dir)
        folder = out / artifacts.FORMAT_DIRS["tfjs"]
        tfjs = convert.TfjsConversion(core_dir, str(folder)) if "tfjs" in options.formats else None
        try:
            _export_tflite_and_onnx(spec, spec_path, core_dir, module, out, options, representative, built)
            if tfjs is not None:
                tfjs.wait()
                tfjs = None
                convert.ship_preprocessing(spec_path, str(folder), "javascript")
                built["tfjs"] = (folder, TfjsRunner(str(folder), convert.NODE_DIR, output_name))
                logging.info("TF.js graph model: %d bytes", _model_size("tfjs", folder))
        finally:
            if tfjs is not None:
                tfjs.cancel()
    return built


def _export_tflite_and_onnx(
    spec: dict[str, Any], spec_path: str, core_dir: str, module: convert.CoreModule, out: Path,
    options: ExportConfig, representative: dict[str, np.ndarray] | None, built: dict[str, tuple[Path, Runner]],
) -> None:
    """The in-process conversions, while the TF.js converter runs in its own process."""
    formats, variants = options.formats, options.tflite_variants
    if "tflite" in formats:
        folder = out / artifacts.FORMAT_DIRS["tflite"]
        folder.mkdir(parents=True, exist_ok=True)
        convert.ship_preprocessing(spec_path, str(folder), "python")
        converter = convert.tflite_converter(core_dir)
        skipped = unrepresentable_variants(module.model, variants)
        for variant in (v for v in variants if f"tflite/{v}" not in skipped):
            started = time.perf_counter()
            path = folder / f"model_{variant}.tflite"
            calibration = (lambda: _representative(spec, representative)) if representative is not None else None
            convert.export_tflite(converter, variant, str(path), calibration)
            built[f"tflite/{variant}"] = (path, TFLiteRunner(str(path), spec))
            logging.info("TFLite %s: %d bytes in %.1fs", variant, path.stat().st_size,
                         time.perf_counter() - started)
    if "onnx" in formats:
        folder = out / artifacts.FORMAT_DIRS["onnx"]
        folder.mkdir(parents=True, exist_ok=True)
        convert.ship_preprocessing(spec_path, str(folder), "python")
        path = folder / "model.onnx"
        convert.export_onnx(module, spec, str(path), options.onnx_opset)
        built["onnx"] = (path, OnnxRunner(str(path), spec))
        logging.info("ONNX (opset %d): %d bytes", options.onnx_opset, path.stat().st_size)


# SavedModel predictions and labels of a regression that the export report keeps for the run report's chart.
PREDICTED_ACTUAL_ROWS = 300


@dataclass(frozen=True)
class ArtifactFigures:
    """What check_artifact measured of one format: its largest output difference from the SavedModel, the task's
    metrics on the eval rows, and its check."""
    max_abs_diff: float
    metrics: dict[str, float]
    check: ArtifactCheck


def check_artifact(
    name: str, outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray, options: ExportConfig,
    kind: str = "binary", metric: str = "auto",
) -> ArtifactFigures:
    """The gate on one artifact: its figures against the SavedModel's `reference` outputs on the same rows
    (probabilities [rows] or [rows, classes], or regression values [rows]).

    Float formats (FLOAT_ARTIFACTS) must give every output within export.max_abs_diff of the SavedModel's
    (tasks.max_output_difference); quantized TFLite variants may be at most export.max_quantized_degradation worse on
    the task's eval `metric` (an improvement always passes).
    """
    metric = task_metric(kind, metric)
    metrics = _metrics(outputs, labels, kind)
    diff = max_output_difference(kind, outputs, reference)
    if name in FLOAT_ARTIFACTS:
        check = ArtifactCheck(figure="max_abs_diff", value=diff, threshold=options.max_abs_diff,
                              config_key="export.max_abs_diff", passed=bool(diff <= options.max_abs_diff))
    else:
        worse, passed = degradation_gate(kind, metric, _metrics(reference, labels, kind)[metric], metrics[metric],
                                         options.max_quantized_degradation)
        check = ArtifactCheck(figure=f"{metric}_degradation", value=worse,
                              threshold=options.max_quantized_degradation,
                              config_key="export.max_quantized_degradation", passed=passed)
    return ArtifactFigures(diff, metrics, check)


def verify(
    built: dict[str, tuple[Path, Runner]], data: EvalData, options: ExportConfig, root: Path | None = None,
    task: Task | None = None, metric: str = "auto",
) -> ExportReport:
    """Runs every artifact on the eval rows against the SavedModel; returns the report, `passed` included.
    Each row's `path` is relative to `root` (the version folder) when given. `task` (binary by default) says what
    the outputs are, `metric` (evaluation.metric) what the quantized variants are judged by."""
    task = task or Task()
    metric = task_metric(task.kind, metric)
    with ThreadPoolExecutor(max_workers=1) as pool:
        # A runtime in a process of its own (Node.js) starts first and runs beside the in-process ones.
        pending = {name: pool.submit(runner.predict_and_time, data.columns, options.latency_rows)
                   for name, (_, runner) in built.items() if runner.out_of_process}
        reference = built["saved_model"][1].predict(data.columns)
        rows = tuple(_verify_artifact(name, path, runner, pending.get(name), reference, data, options, root, task,
                                      metric)
                     for name, (path, runner) in built.items())
    class_shares = predicted_actual = None
    if task.kind == "multiclass" and len(data.labels):
        # A class whose precision is below its share is answered worse than by guessing it: the console warns.
        counts = np.bincount(np.asarray(data.labels, dtype=np.int64).reshape(-1), minlength=len(task.classes))
        class_shares = tuple(float(c) for c in counts / counts.sum())
    if task.kind == "regression" and len(data.labels):
        # The run report draws predicted against actual from these rows (TFMA has no such plot for a regression).
        picked = np.unique(np.linspace(0, len(data.labels) - 1, min(PREDICTED_ACTUAL_ROWS, len(data.labels))
                                       ).astype(int))
        values = np.asarray(reference).reshape(-1)
        predicted_actual = tuple((float(values[i]), float(data.labels[i])) for i in picked)
    return ExportReport(
        task=ExportTask(kind=task.kind, output=task.output_name, classes=task.classes, metric=metric),
        eval_rows=int(len(data.labels)),
        reference=_metrics(reference, data.labels, task.kind),
        # Beside the model's figures: what ignoring the features scores on the same rows.
        no_skill=no_skill_figures(task.kind, data.labels, len(task.classes)),
        artifacts=rows,
        passed=all(row.check.passed for row in rows),
        class_shares=class_shares,
        predicted_actual=predicted_actual,
    )


def _verify_artifact(
    name: str, path: Path, runner: Runner, pending: Future | None, reference: np.ndarray, data: EvalData,
    options: ExportConfig, root: Path | None, task: Task, metric: str,
) -> ArtifactRow:
    """One artifact's row of the export report; `pending`: its outputs and latencies, already under way."""
    started = time.perf_counter()
    outputs, latency = pending.result() if pending else runner.predict_and_time(data.columns, options.latency_rows)
    figures = check_artifact(name, outputs, reference, data.labels, options, task.kind, metric)
    relative = path.relative_to(root) if root is not None else path
    row = ArtifactRow(artifact=name, path=str(relative), size_bytes=_model_size(name, path),
                      max_abs_diff=figures.max_abs_diff, metrics=figures.metrics,
                      latency_ms_p50=float(np.median(latency)), check=figures.check)
    logging.info("verified %s in %.1fs: max |diff| %.2e, %s, p50 %.3f ms", name, time.perf_counter() - started,
                 row.max_abs_diff, describe_figures(row.metrics, task.kind), row.latency_ms_p50)
    return row


def gate_message(result: ExportReport) -> str:
    failures, keys = [], set()
    for row in result.failed:
        check = row.check
        failures.append(f"{row.artifact}: {check.figure} {check.value:.6g} is above the threshold "
                        f"{check.threshold:g} ({check.config_key})")
        keys.add(check.config_key)
    message = "; ".join(failures)
    quantized = [row.artifact.split("/")[1] for row in result.failed
                 if row.check.config_key == "export.max_quantized_degradation"]
    if quantized:
        # Raising the tolerance would publish a variant this far off: the fix is to leave the variant out.
        kept = [row.artifact for row in result.artifacts if row.artifact.startswith("tflite/") and row.check.passed]
        message += (f" (the variant{'s' * (len(quantized) > 1)} {', '.join(quantized)} cannot hold this model "
                    f"within that tolerance: leave {'them' if len(quantized) > 1 else 'it'} out of "
                    f"export.tflite_variants; raising export.max_quantized_degradation would publish "
                    f"{'them' if len(quantized) > 1 else 'it'} as far off; "
                    + (f"{', '.join(kept)} would still be published)" if kept else
                       "no TFLite variant would be left: then drop tflite from export.formats)"))
    return message


def export_and_verify(
    serving_model_dir: str,
    model: tf.keras.Model,
    spec: dict[str, Any],
    data: EvalData,
    output_dir: str,
    options: ExportConfig,
    optimization: OptimizationReport | None = None,
    metric: str = "auto",
    calibration: CalibrationRecord | None = None,
    request: RequestEncoding | None = None,
    failure_dir: str = "",
) -> ExportReport:
    """The Exporter's work: every format under `output_dir` (any file system), verified, with the export report
    beside them. The task is the one `spec` records; `metric` (evaluation.metric) judges quantized variants;
    `optimization` (the Optimizer's report), `calibration` (the model's calibration record, with its decision
    threshold) and `request` (how the training CSV encodes a row: its missing-value markers and label columns, for
    `mlops predict --csv`) go into the report as they are.
    Raises ExportGateError, naming each format that missed its threshold, after writing the report (also to
    `failure_dir`, a folder that outlives the failed component's outputs, when given)."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="export-") as staging:
        built = export_formats(serving_model_dir, model, spec, staging, options, data.representative,
                               warmup_rows=data.columns)
        skipped = unrepresentable_variants(model, options.tflite_variants) if "tflite" in options.formats else {}
        if "tflite/int8" in built:
            calibration_rows = len(next(iter(data.representative.values()))) if data.representative else 0
            skipped |= unrepresentable_int8(built, built["saved_model"][1].predict(data.columns), calibration_rows)
        for name, reason in skipped.items():
            logging.warning("TFLite %s %s", name.split("/")[1], reason)
        result = dataclasses.replace(
            verify(built, data, options, root=Path(staging), task=spec_task(spec), metric=metric),
            optimization=optimization, calibration=calibration, request=request, skipped=skipped,
            seconds=round(time.perf_counter() - started, 1))
        report.write(result, staging)
        artifacts.copy_tree(staging, output_dir)
        if not result.passed and failure_dir:
            # TFX removes a failed component's output folder: the report the message cites must live elsewhere.
            report.write(result, failure_dir)
    if not result.passed:
        cited = failure_dir or output_dir
        raise ExportGateError(f"export verification failed, nothing is pushed: {gate_message(result)}. "
                              f"Report: {artifacts.join(cited, artifacts.EXPORT_REPORT_HTML)}")
    return result
