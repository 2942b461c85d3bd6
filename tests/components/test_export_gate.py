"""The export gate at its thresholds, one format at a time: float formats by their largest probability difference
from the SavedModel (export.max_abs_diff), quantized TFLite variants by the eval AUC they lose
(export.max_quantized_degradation). Probabilities of a taxi-like model on 2,000 eval rows, perturbed as converters do:
float32 rounding noise for float formats, coarser scores for quantized ones."""
import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from components.exporter import export
from components.exporter.convert import export_tflite
from components.exporter.export import (
    FLOAT_ARTIFACTS,
    EvalData,
    ExportGateError,
    check_artifact,
    export_and_verify,
    gate_message,
    int8_clipped_rows,
    unrepresentable_int8,
    unrepresentable_variants,
    verify,
)
from components.exporter.runtimes import Runner, TFLiteRunner
from components.tasks import Task
from reports.model_reports import table_lines
from reports.records import ArtifactCheck, ArtifactRow, ExportReport, ExportTask, OptimizationReport
from settings.config import ExportConfig

QUANTIZED_ARTIFACTS = ("tflite/dynamic", "tflite/float16", "tflite/int8")
REPORTS = Path(__file__).resolve().parents[1] / "fixtures" / "reports"
# Non-default limits, so a gate that reads the default or the other format's limit fails these tests.
MAX_ABS_DIFF = 5e-5
MAX_AUC_DROP = 0.02


def options(**changes):
    settings = {"max_abs_diff": MAX_ABS_DIFF, "max_quantized_degradation": MAX_AUC_DROP, "latency_rows": 3}
    return dataclasses.replace(ExportConfig(), **{**settings, **changes})


@pytest.fixture(scope="module")
def eval_set():
    """Labels and the SavedModel's float32 probabilities for 2,000 rows: a logistic model with AUC near 0.9."""
    rng = np.random.default_rng(16)
    logits = rng.normal(0.0, 2.0, 2000)
    labels = (rng.random(2000) < 1 / (1 + np.exp(-logits))).astype(np.int64)
    reference = (1 / (1 + np.exp(-logits))).astype(np.float32)
    assert 0.8 < roc_auc_score(labels, reference) < 0.95
    return reference, labels


def float_noise(reference, largest, seed=0):
    """`reference` with float32-sized noise on every row, whose largest absolute value is `largest` (row 7)."""
    rng = np.random.default_rng(seed)
    noisy = reference + rng.uniform(-0.5, 0.5, reference.shape).astype(np.float32) * np.float32(largest)
    noisy[7] = reference[7] + np.float32(largest)
    return noisy.astype(np.float32)


def auc_drop(labels, reference, candidate):
    return roc_auc_score(labels, reference) - roc_auc_score(labels, candidate)


def with_auc_drop(reference, labels, low, high):
    """Scores that lose between `low` and `high` of AUC: the reference blended with noise, found by bisection."""
    noise = np.random.default_rng(1).normal(0.0, 0.3, reference.shape)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        weight = (lo + hi) / 2
        candidate = np.clip(reference + weight * noise, 0, 1).astype(np.float32)
        drop = auc_drop(labels, reference, candidate)
        if low < drop < high:
            return candidate
        lo, hi = (weight, hi) if drop <= low else (lo, weight)
    raise AssertionError(f"no blend loses between {low} and {high} of AUC")


def test_the_formats_split_into_float_and_quantized():
    assert set(FLOAT_ARTIFACTS) == {"saved_model", "tflite/float32", "onnx", "tfjs"}


@pytest.mark.parametrize("name", FLOAT_ARTIFACTS)
@pytest.mark.parametrize("largest, passes", [(0.98 * MAX_ABS_DIFF, True), (1.02 * MAX_ABS_DIFF, False)])
def test_float_format_at_max_abs_diff(eval_set, name, largest, passes):
    reference, labels = eval_set
    probabilities = float_noise(reference, largest)
    row = check_artifact(name, probabilities, reference, labels, options())
    assert row.max_abs_diff == pytest.approx(largest, rel=1e-3)
    assert row.metrics["auc"] == pytest.approx(roc_auc_score(labels, probabilities))
    assert row.check == ArtifactCheck(figure="max_abs_diff", value=row.max_abs_diff, threshold=MAX_ABS_DIFF,
                                      config_key="export.max_abs_diff", passed=passes)


@pytest.mark.parametrize("name", FLOAT_ARTIFACTS)
def test_float_format_is_judged_by_its_difference_not_by_auc(eval_set, name):
    reference, labels = eval_set
    # Rounding noise leaves AUC as it is; the quantized allowance, however generous or strict, does not apply.
    close, far = float_noise(reference, 0.5 * MAX_ABS_DIFF), float_noise(reference, 3 * MAX_ABS_DIFF)
    assert check_artifact(name, close, reference, labels, options(max_quantized_degradation=-0.5)).check.passed
    assert not check_artifact(name, far, reference, labels, options(max_quantized_degradation=0.5)).check.passed


@pytest.mark.parametrize("name", QUANTIZED_ARTIFACTS)
@pytest.mark.parametrize("low, high, passes", [(0.0190, 0.0199, True), (0.0201, 0.0210, False)])
def test_quantized_variant_at_max_quantized_degradation(eval_set, name, low, high, passes):
    reference, labels = eval_set
    quantized = with_auc_drop(reference, labels, low, high)
    row = check_artifact(name, quantized, reference, labels, options())
    assert low < row.check.value < high
    assert row.check.value == pytest.approx(auc_drop(labels, reference, quantized))
    assert row.check == ArtifactCheck(figure="auc_degradation", value=row.check.value, threshold=MAX_AUC_DROP,
                                      config_key="export.max_quantized_degradation", passed=passes)
    # Blending with noise moves probabilities far more than max_abs_diff: quantized variants are not held to it.
    assert row.max_abs_diff > 100 * MAX_ABS_DIFF


@pytest.mark.parametrize("name", QUANTIZED_ARTIFACTS)
def test_a_quantized_variant_that_gains_auc_passes(eval_set, name):
    reference, labels = eval_set
    # The SavedModel is the worse model here: the variant gains 0.02-0.03 of AUC, a drop of -0.02 or less.
    worse = with_auc_drop(reference, labels, 0.0201, 0.03)
    row = check_artifact(name, reference, worse, labels, options())
    assert row.check.value < -MAX_AUC_DROP
    assert row.check.passed


def test_figures_exactly_at_their_thresholds_pass(eval_set):
    reference, labels = eval_set
    probabilities = float_noise(reference, 0.7 * MAX_ABS_DIFF)
    diff = float(np.max(np.abs(probabilities - reference)))
    assert check_artifact("onnx", probabilities, reference, labels, options(max_abs_diff=diff)).check.passed
    quantized = with_auc_drop(reference, labels, 0.01, 0.02)
    drop = export._metrics(reference, labels)["auc"] - export._metrics(quantized, labels)["auc"]
    assert check_artifact("tflite/int8", quantized, reference, labels,
                          options(max_quantized_degradation=drop)).check.passed


def test_metrics_accuracy_counts_one_half_as_negative_and_auc_needs_both_classes():
    # As Keras' and TFMA's BinaryAccuracy, which the Trainer and the Evaluator report: positive above 0.5.
    probabilities = np.array([0.2, 0.5, 0.7, 0.4], dtype=np.float32)
    metrics = export._metrics(probabilities, np.array([0, 1, 1, 1]))
    log_loss = -np.mean(np.log([0.8, 0.5, 0.7, 0.4]))
    assert metrics == {"auc": 1.0, "accuracy": 0.5, "log_loss": pytest.approx(log_loss)}
    one_class = export._metrics(probabilities, np.array([0, 0, 0, 0]))
    assert np.isnan(one_class["auc"]) and one_class["accuracy"] == 0.75


class FixedRunner(Runner):
    """Stands in for a format's runtime: answers fixed probabilities (the rows' order is the request's)."""

    def __init__(self, probabilities):
        self.probabilities = probabilities

    def predict(self, columns):
        return self.probabilities[: len(columns["row"])]


def stand_in_artifacts(tmp_path, eval_set, onnx_diff, int8_drop):
    reference, labels = eval_set
    low, high = int8_drop
    outputs = {"saved_model": reference, "onnx": float_noise(reference, onnx_diff),
               "tflite/int8": with_auc_drop(reference, labels, low, high)}
    artifacts = {}
    tmp_path.mkdir(parents=True, exist_ok=True)
    for i, (name, probabilities) in enumerate(outputs.items()):
        path = tmp_path / f"model{i}.bin"
        path.write_bytes(b"\0" * (1000 * (i + 1)))
        artifacts[name] = (path, FixedRunner(probabilities))
    return artifacts, EvalData({"row": np.arange(len(labels))}, labels, {})


def test_verify_reports_every_format_and_passes_only_when_each_does(tmp_path, eval_set):
    artifacts, data = stand_in_artifacts(tmp_path, eval_set, 0.9 * MAX_ABS_DIFF, (0.005, 0.015))
    result = verify(artifacts, data, options())
    assert result.passed and result.eval_rows == 2000
    assert result.reference == export._metrics(eval_set[0], eval_set[1])
    assert result.to_dict()["reference"] == {"artifact": "saved_model", **result.reference}
    rows = {row.artifact: row for row in result.artifacts}
    assert list(rows) == ["saved_model", "onnx", "tflite/int8"]
    assert rows["saved_model"].max_abs_diff == 0.0 and rows["saved_model"].size_bytes == 1000
    assert rows["onnx"].max_abs_diff == pytest.approx(0.9 * MAX_ABS_DIFF, rel=1e-3)
    assert rows["tflite/int8"].size_bytes == 3000 and rows["tflite/int8"].check.figure == "auc_degradation"
    for name, row in rows.items():
        assert row.path == str(artifacts[name][0]) and row.latency_ms_p50 > 0
        assert row.metrics["auc"] == pytest.approx(roc_auc_score(data.labels, artifacts[name][1].probabilities))
        assert row.check.passed

    for onnx_diff, int8_drop, failing in [(1.1 * MAX_ABS_DIFF, (0.005, 0.015), {"onnx"}),
                                          (0.9 * MAX_ABS_DIFF, (0.021, 0.03), {"tflite/int8"})]:
        artifacts, data = stand_in_artifacts(tmp_path / str(onnx_diff), eval_set, onnx_diff, int8_drop)
        result = verify(artifacts, data, options())
        assert not result.passed
        assert {row.artifact for row in result.failed} == failing


def test_verify_sizes_a_model_folder_without_what_lies_beside_it(tmp_path, eval_set):
    reference, labels = eval_set
    saved_model, tfjs = tmp_path / "version", tmp_path / "version" / "tfjs"
    files = {saved_model / "saved_model.pb": 100, saved_model / "variables" / "variables.data-00000-of-00001": 200,
             saved_model / "assets" / "vocab.txt": 50, saved_model / "export_report.json": 1000,
             tfjs / "model.json": 10, tfjs / "group1-shard1of1.bin": 20, tfjs / "preprocessing.mjs": 3000}
    for path, size in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\0" * size)
    artifacts = {"saved_model": (saved_model, FixedRunner(reference)), "tfjs": (tfjs, FixedRunner(reference))}
    result = verify(artifacts, EvalData({"row": np.arange(len(labels))}, labels, {}), options())
    assert [row.size_bytes for row in result.artifacts] == [350, 30]


def tiny_model():
    """A Keras model whose values every TFLite variant holds: the stand-in converters never read it."""
    import tensorflow as tf

    return tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(1)])


def checked_row(name, figure, value, threshold, config_key, passed):
    """An artifact row as the export report holds it, with only its check filled in."""
    return ArtifactRow(artifact=name, path=name, size_bytes=0, max_abs_diff=0.0, metrics={}, latency_ms_p50=0.0,
                       check=ArtifactCheck(figure, value, threshold, config_key, passed))


def test_gate_message_names_each_failing_format_its_figure_and_key():
    result = ExportReport(passed=False, artifacts=(
        checked_row("saved_model", "max_abs_diff", 0.0, 5e-5, "export.max_abs_diff", True),
        checked_row("onnx", "max_abs_diff", 5.1e-05, 5e-5, "export.max_abs_diff", False),
        checked_row("tflite/int8", "auc_degradation", 0.0203, 0.02, "export.max_quantized_degradation", False),
    ))
    assert gate_message(result) == (
        "onnx: max_abs_diff 5.1e-05 is above the threshold 5e-05 (export.max_abs_diff); "
        "tflite/int8: auc_degradation 0.0203 is above the threshold 0.02 (export.max_quantized_degradation) "
        "(the variant int8 cannot hold this model within that tolerance: leave it out of export.tflite_variants; "
        "raising export.max_quantized_degradation would publish it as far off; no TFLite variant would be left: then "
        "drop tflite from export.formats)"
    )
    regression = dataclasses.replace(result, task=ExportTask(kind="regression", metric="rmse"), artifacts=(
        *result.artifacts[:2],
        checked_row("tflite/float32", "max_abs_diff", 0.0, 5e-5, "export.max_abs_diff", True),
        checked_row("tflite/dynamic", "rmse_degradation", 1.0, 20.0, "export.max_quantized_degradation", True),
        checked_row("tflite/float16", "rmse_degradation", 55000.0, 20.0, "export.max_quantized_degradation", False),
        checked_row("tflite/int8", "rmse_degradation", 30.0, 20.0, "export.max_quantized_degradation", False)))
    message = gate_message(regression)
    # The advice never points at the tolerance, which would publish the broken variants.
    assert "raise" not in message and "leave them out of export.tflite_variants" in message
    assert message.endswith("tflite/float32, tflite/dynamic would still be published)")


@pytest.mark.parametrize("offset, skipped", [(65504.0, False), (65536.0, True), (-180000.0, True)])
def test_a_float16_variant_is_not_built_for_a_model_whose_values_float16_cannot_hold(offset, skipped):
    import tensorflow as tf

    inputs = tf.keras.Input((1,))
    z = tf.keras.layers.Dense(1, name="output")(inputs)
    model = tf.keras.Model(inputs, tf.keras.layers.Rescaling(2.0, offset=offset, name="label_scale")(z))
    found = unrepresentable_variants(model, ["float32", "float16", "int8"])
    assert unrepresentable_variants(model, ["float32", "int8"]) == {}
    if not skipped:
        assert found == {}
        return
    assert found == {"tflite/float16": f"not built: the label_scale.offset is {abs(offset):,.6g}, beyond float16's "
                                       "largest value 65,504, so the variant would hold infinity there"}
    report = ExportReport(passed=True, skipped=found)
    assert ExportReport.from_dict(report.to_dict()).skipped == found
    assert table_lines(report)[-1] == f"tflite/float16  {found['tflite/float16']}"


@pytest.mark.parametrize("onnx_diff, passes", [(0.9 * MAX_ABS_DIFF, True), (1.1 * MAX_ABS_DIFF, False)])
def test_export_and_verify_pushes_nothing_past_the_gate(tmp_path, eval_set, monkeypatch, onnx_diff, passes):
    """The Exporter's function with the converters stood in: the report lands either way; a miss raises."""
    _, data = stand_in_artifacts(tmp_path / "unused", eval_set, onnx_diff, (0.005, 0.015))
    data.representative = {"row": np.arange(10)}
    model, spec = tiny_model(), {"features": []}
    optimization = OptimizationReport(kind="binary", metric="auc", stages=("prune",))
    output_dir = tmp_path / "version"
    output_dir.mkdir()

    def export_formats(*args, warmup_rows):
        # The formats are built in a staging folder, then copied to the artifact's folder with the report.
        staging = Path(args[3])
        assert args[:3] + args[4:] == ("serving_model", model, spec, options(), data.representative)
        assert warmup_rows is data.columns
        assert staging != output_dir and staging.is_dir()
        return stand_in_artifacts(staging, eval_set, onnx_diff, (0.005, 0.015))[0]

    monkeypatch.setattr(export, "export_formats", export_formats)
    # The Exporter's clock reads 100.0 when it starts and 112.34 ever after: the report says 12.3 seconds.
    readings = iter([100.0])
    monkeypatch.setattr(export, "time", SimpleNamespace(perf_counter=lambda: next(readings, 112.34)))
    if passes:
        result = export_and_verify("serving_model", model, spec, data, str(output_dir), options(), optimization)
        assert result.passed and result.optimization == optimization and result.seconds == 12.3
    else:
        with pytest.raises(ExportGateError) as error:
            export_and_verify("serving_model", model, spec, data, str(output_dir), options(), optimization,
                              failure_dir=str(tmp_path / "kept"))
    report = json.loads((output_dir / "export_report.json").read_text())
    if not passes:
        read_back = ExportReport.from_dict(report)
        # TFX removes a failed component's output folder: the report cited lies where it stays.
        assert str(error.value) == (f"export verification failed, nothing is pushed: {gate_message(read_back)}. "
                                    f"Report: {tmp_path / 'kept' / 'export_report.html'}")
        assert json.loads((tmp_path / "kept" / "export_report.json").read_text()) == report
        assert gate_message(read_back).startswith("onnx: max_abs_diff ")
    assert report["passed"] is passes and report["optimization"] == optimization.to_dict()
    assert (output_dir / "export_report.html").is_file()


def regression_artifacts(folder):
    """A regression's SavedModel values and an int8 variant 0.25 off on every row, as files under `folder`."""
    labels = np.array([1.0, 2.0, 4.0, 8.0])
    outputs = {"saved_model": np.array([1.5, 2.0, 3.0, 8.5]), "tflite/int8": np.array([1.75, 2.25, 3.25, 8.75])}
    built = {}
    for i, (name, values) in enumerate(outputs.items()):
        (folder / f"model{i}.bin").write_bytes(b"\0" * 10)
        built[name] = (folder / f"model{i}.bin", FixedRunner(values))
    return built, EvalData({"row": np.arange(4)}, labels, {})


def test_verify_judges_by_the_task_and_metric_it_is_given(tmp_path):
    built, data = regression_artifacts(tmp_path)
    task = Task("regression", label_mean=3.0, label_std=2.0)
    result = verify(built, data, options(max_quantized_degradation=0.3), root=tmp_path, task=task, metric="mae")
    assert result.task == ExportTask(kind="regression", output=task.output_name, metric="mae")
    assert result.to_dict()["task"] == {**task.describe(), "metric": "mae"}
    assert set(result.reference) == {"rmse", "mae", "r2"}
    rows = {row.artifact: row for row in result.artifacts}
    # MAE 0.5 -> 0.625 on these rows: 0.125 worse, within 0.3; and the paths are relative to the version folder.
    assert rows["tflite/int8"].check.figure == "mae_degradation"
    assert rows["tflite/int8"].check.value == pytest.approx(0.125)
    assert [row.path for row in result.artifacts] == ["model0.bin", "model1.bin"]


def test_export_and_verify_stages_under_its_own_name_and_records_the_task_of_the_spec(tmp_path, monkeypatch):
    spec = {"features": [], "task": {"kind": "regression"}}
    output_dir = tmp_path / "version"
    output_dir.mkdir()

    def export_formats(serving_model_dir, model, spec, staging, options, representative, warmup_rows):
        assert Path(staging).name.startswith("export-")
        return regression_artifacts(Path(staging))[0]

    monkeypatch.setattr(export, "export_formats", export_formats)
    _, data = regression_artifacts(tmp_path)
    result = export_and_verify("serving_model", tiny_model(), spec, data, str(output_dir),
                               options(max_quantized_degradation=0.3), metric="mae")
    report = json.loads((output_dir / "export_report.json").read_text())
    assert report["task"]["kind"] == "regression" and report["task"]["metric"] == "mae"
    assert [row["path"] for row in report["artifacts"]] == ["model0.bin", "model1.bin"]
    # The layout of the report a regression run of the pipeline wrote before the typed records.
    written = json.loads((REPORTS / "diabetes" / "export_report.json").read_text())
    assert list(report) == list(written) and list(report["task"]) == list(written["task"])
    assert [list(row) for row in report["artifacts"]] == [list(row) for row in written["artifacts"][:2]]
    assert result.passed and (output_dir / "model1.bin").is_file()


@pytest.mark.parametrize("value, clipped", [(12.0, 0), (12.01, 1), (-2.0, 0), (-2.01, 1)])
def test_an_output_more_than_one_step_beyond_int8s_calibrated_range_counts_as_clipped(value, clipped):
    # Range [0, 10], step 2: up to one step beyond is rounding, which the degradation gate judges.
    reference = np.array([0.0, 5.0, 10.0, value])
    assert int8_clipped_rows(reference, 0.0, 10.0, 2.0) == clipped
    # A multiclass row counts once, however many of its probabilities lie beyond.
    assert int8_clipped_rows(np.array([[value, value], [1.0, 1.0]]), 0.0, 10.0, 2.0) == clipped


def int8_regression(folder: Path, calibration_inputs: np.ndarray) -> Path:
    """A regression (value = 1000 x + 5000, as a label scale puts a price in dollars) converted to int8 with its
    ranges calibrated on `calibration_inputs`."""
    import tensorflow as tf

    class Regression(tf.Module):
        def __init__(self):
            self.weight, self.bias = tf.Variable([[1000.0]]), tf.Variable([5000.0])

        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
        def serve(self, x):
            return {"value": tf.matmul(x, self.weight) + self.bias}

    module = Regression()
    tf.saved_model.save(module, str(folder / "core"), signatures={"serving_default": module.serve})
    path = folder / "model_int8.tflite"
    rows = calibration_inputs.astype(np.float32).reshape(-1, 1, 1)
    export_tflite(str(folder / "core"), "int8", str(path), lambda: ({"x": row} for row in rows))
    return path


def test_an_int8_variant_whose_calibration_cannot_hold_the_eval_outputs_is_not_published(tmp_path):
    path = int8_regression(tmp_path, np.linspace(0.0, 1.0, 50))
    runner = TFLiteRunner(str(path), {"features": [], "task": {"kind": "regression", "output": "value"}})
    low, high, step = runner.output_range()
    # Calibrated on x in [0, 1]: outputs up to 6,000, in a range TFLite widens to hold zero, 255 steps of about 24.
    assert low == pytest.approx(0, abs=step) and high == pytest.approx(6000, abs=2 * step)
    assert step == pytest.approx(6000 / 255, rel=0.05)
    built = {"saved_model": (tmp_path, None), "tflite/int8": (path, runner)}
    inside = np.array([5000.0, 5500.0, high + step])
    assert unrepresentable_int8(built, inside, 1000) == {} and path.is_file()
    # Eval rows reach x = 3 (8,000), beyond what 1,000 training rows calibrated: int8 would answer about 6,000.
    skipped = unrepresentable_int8(built, np.array([5000.0, 5500.0, 8000.0]), 1000)
    assert skipped == {"tflite/int8": (
        f"not published: its output range calibrated on 1,000 training rows is [{low:,.6g}, {high:,.6g}], and 1 of "
        "3 eval rows' outputs lie beyond it (from 5,000 to 8,000), where int8 would clip them; raise "
        "export.representative_rows or leave int8 out of export.tflite_variants")}
    assert "tflite/int8" not in built and not path.exists()


def test_only_an_output_dequantized_from_int8_has_a_calibrated_range(tmp_path):
    path = int8_regression(tmp_path, np.linspace(0.0, 1.0, 50))
    export_tflite(str(tmp_path / "core"), "float32", str(tmp_path / "float32.tflite"))
    spec = {"features": [], "task": {"kind": "regression", "output": "value"}}
    assert TFLiteRunner(str(tmp_path / "float32.tflite"), spec).output_range() is None
    assert TFLiteRunner(str(path), spec).output_range() is not None
    assert FixedRunner(np.zeros(3)).output_range() is None


def test_export_and_verify_publishes_without_an_int8_variant_that_clips_and_says_why(tmp_path, eval_set, monkeypatch):
    class ClippingRunner(FixedRunner):
        def output_range(self):
            return 0.0, 0.5, 0.01  # calibrated on rows whose scores stayed below one half

    output_dir = tmp_path / "version"
    output_dir.mkdir()
    _, data = stand_in_artifacts(tmp_path / "unused", eval_set, 0.9 * MAX_ABS_DIFF, (0.021, 0.03))
    data.representative = {"row": np.arange(10)}

    def export_formats(*args, warmup_rows):
        built = stand_in_artifacts(Path(args[3]), eval_set, 0.9 * MAX_ABS_DIFF, (0.021, 0.03))[0]
        path, runner = built["tflite/int8"]
        built["tflite/int8"] = (path, ClippingRunner(runner.probabilities))
        return built

    monkeypatch.setattr(export, "export_formats", export_formats)
    result = export_and_verify("serving_model", tiny_model(), {"features": []}, data, str(output_dir), options())
    # Its AUC drop (0.021 or more) would have failed the gate: it is left out with the reason instead.
    clipped = int(np.count_nonzero(eval_set[0] > 0.51))
    assert result.passed and [row.artifact for row in result.artifacts] == ["saved_model", "onnx"]
    assert result.skipped["tflite/int8"].startswith(
        f"not published: its output range calibrated on 10 training rows is [0, 0.5], and {clipped:,} of 2,000 eval "
        "rows' outputs lie beyond it")
    assert not (output_dir / "model2.bin").exists()
    assert json.loads((output_dir / "export_report.json").read_text())["skipped"] == result.skipped
