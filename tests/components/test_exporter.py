"""Each converter on a small trained model: the artifact runs in its own runtime and agrees with the SavedModel;
an artifact that disagrees fails the gate."""
import dataclasses
import functools
import json
import pickle
import subprocess
import sys

import numpy as np
import onnx
import pytest
import tensorflow as tf
import tensorflow_transform as tft
from tensorflow_serving.apis import prediction_log_pb2

from components.calibration import Calibration, apply, fold, model_logits
from components.exporter import convert
from components.exporter.export import EvalData, ExportGateError, _representative, export_and_verify, verify
from components.exporter.preprocessing import build_spec, preprocess, save_spec
from components.exporter.runtimes import OnnxRunner, SavedModelRunner, TFLiteRunner, node_executable
from components.model import export_serving_model
from reports.records import CalibrationFigures, CalibrationRecord
from serving.server.warmup import WARMUP_FILE, load_and_warm_up, warm_up
from settings.config import ExportConfig
from tests.components.small_model import build_small_model


def options(**changes):
    return dataclasses.replace(ExportConfig(), **{"latency_rows": 20, **changes})


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return build_small_model(tmp_path_factory.mktemp("small_model"))


@pytest.fixture(scope="module")
def spec(small):
    return build_spec(small.transform_dir, small.layout)


def eval_data(small):
    return EvalData(small.columns, small.labels, small.train_columns)


@pytest.fixture(scope="module")
def exported(small, spec, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("version")
    result = export_and_verify(small.serving_model_dir, small.model, spec, eval_data(small), str(output_dir), options())
    return output_dir, result


def test_every_format_runs_in_its_runtime_and_agrees(exported):
    _, result = exported
    rows = {row.artifact: row for row in result.artifacts}
    assert set(rows) == {"saved_model", "tflite/float32", "tflite/dynamic", "tflite/float16", "tflite/int8", "onnx",
                         "tfjs"}
    assert result.passed and result.eval_rows == 1000
    assert result.reference["auc"] > 0.8  # the model learned something, so AUC comparisons mean something
    for name in ("tflite/float32", "onnx", "tfjs"):
        assert rows[name].max_abs_diff <= 1e-4, name
    for name in ("tflite/dynamic", "tflite/float16", "tflite/int8"):
        assert rows[name].metrics["auc"] >= result.reference["auc"] - 0.01, name
    for row in rows.values():
        assert row.size_bytes > 0 and row.latency_ms_p50 > 0 and row.check.passed
    assert rows["tflite/int8"].size_bytes < rows["tflite/float32"].size_bytes


def test_version_folder_holds_every_format_beside_the_saved_model(exported):
    output_dir, _ = exported
    for path in ["saved_model.pb", "variables/variables.index", "tflite/model_float32.tflite",
                 "tflite/model_int8.tflite", "tflite/preprocessing.json", "tflite/preprocessing.py", "onnx/model.onnx",
                 "onnx/preprocessing.json", "tfjs/model.json", "tfjs/preprocessing.json", "tfjs/preprocessing.mjs",
                 "tfjs/predict.mjs", "export_report.json", "export_report.html"]:
        assert (output_dir / path).is_file(), path
    report = json.loads((output_dir / "export_report.json").read_text())
    assert report["passed"]
    html = (output_dir / "export_report.html").read_text()
    assert "data:image/png;base64," in html and "tflite/int8" in html


def test_saved_model_with_the_other_formats_beside_it_still_loads(exported, small):
    # TF Serving reads saved_model.pb, variables/ and assets/ of a version folder; the subfolders are not its concern.
    output_dir, _ = exported
    serve = tf.saved_model.load(str(output_dir)).signatures["serving_default"]
    dtypes = {k: s.dtype for k, s in serve.structured_input_signature[1].items()}
    got = serve(**{k: tf.constant(small.columns[k][:50], dtype) for k, dtype in dtypes.items()})["probabilities"]
    original = tf.saved_model.load(small.serving_model_dir).signatures["serving_default"]
    want = original(**{k: tf.constant(small.columns[k][:50], dtype) for k, dtype in dtypes.items()})["probabilities"]
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_the_saved_model_carries_warm_up_requests_of_the_first_eval_rows_which_it_answers(exported, small):
    """TF Serving (and `mlops serve`) run assets.extra/tf_serving_warmup_requests before the version is AVAILABLE."""
    output_dir, _ = exported
    logs = [prediction_log_pb2.PredictionLog.FromString(record)
            for record in tf.data.TFRecordDataset(str(output_dir / WARMUP_FILE)).as_numpy_iterator()]
    assert [log.predict_log.request.inputs["fare"].tensor_shape.dim[0].size for log in logs] == [1, 8]
    serve = tf.saved_model.load(str(output_dir)).signatures["serving_default"]
    assert sorted(logs[1].predict_log.request.inputs) == sorted(serve.structured_input_signature[1])
    for name, tensor in logs[1].predict_log.request.inputs.items():
        sent, rows = tf.make_ndarray(tensor), small.columns[name][:8]
        if sent.dtype == object:
            assert list(sent) == [v.encode() if isinstance(v, str) else v for v in rows], name
        else:
            np.testing.assert_array_equal(sent, rows.astype(sent.dtype), err_msg=name)
    servable = load_and_warm_up("taxi", 1, output_dir)
    assert warm_up(servable) == 2


def test_onnx_model_passes_the_checker_with_a_recent_opset(exported):
    model = onnx.load(str(exported[0] / "onnx" / "model.onnx"))
    onnx.checker.check_model(model, full_check=True)
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 17


def test_int8_model_computes_in_integers(exported):
    interpreter = tf.lite.Interpreter(model_path=str(exported[0] / "tflite" / "model_int8.tflite"))
    dtypes = {d["dtype"] for d in interpreter.get_tensor_details()}
    assert np.int8 in dtypes
    float_ops = [d for d in interpreter._get_ops_details() if d["op_name"] == "FULLY_CONNECTED"]
    assert float_ops and all(interpreter.get_tensor_details()[d["inputs"][1]]["dtype"] == np.int8 for d in float_ops)


def test_javascript_preprocessing_equals_python(small, spec, tmp_path):
    spec_path, request_path = tmp_path / "spec.json", tmp_path / "request.json"
    save_spec(spec, str(spec_path))
    columns = {k: [None if isinstance(v, float) and np.isnan(v) else v for v in values.tolist()]
               for k, values in small.columns.items()}
    request_path.write_text(json.dumps(columns))
    script = (
        f"import {{ preprocess }} from '{convert.NODE_DIR / 'preprocessing.mjs'}';"
        "import { readFileSync } from 'node:fs';"
        f"const spec = JSON.parse(readFileSync('{spec_path}', 'utf8'));"
        f"const out = preprocess(spec, JSON.parse(readFileSync('{request_path}', 'utf8')));"
        "const arrays = Object.entries(out).map(([k, v]) => [k, Array.from(v.values)]);"
        "console.log(JSON.stringify(Object.fromEntries(arrays)));"
    )
    result = subprocess.run([node_executable(), "--input-type=module", "-e", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    javascript = json.loads(result.stdout)
    python = preprocess(spec, small.columns)
    assert sorted(javascript) == sorted(python)
    for name, values in python.items():
        # float32 in Python, float64 text of the same float32 in JavaScript: equal to the bit.
        np.testing.assert_array_equal(np.array(javascript[name], dtype=values.dtype), values.ravel(), err_msg=name)


def test_shipped_python_preprocessing_needs_only_numpy(exported, small, spec, tmp_path):
    """The copy in tflite/ with its preprocessing.json, TensorFlow blocked, gives what the repository's code gives."""
    request = tmp_path / "request.pkl"
    request.write_bytes(pickle.dumps(small.columns))
    code = ("import pickle, sys; sys.path.insert(0, '.'); sys.modules['tensorflow'] = None; import preprocessing;"
            "spec = preprocessing.load_spec('preprocessing.json');"
            f"out = preprocessing.preprocess(spec, pickle.load(open({str(request)!r}, 'rb')));"
            "sys.stdout.buffer.write(pickle.dumps(out))")
    result = subprocess.run([sys.executable, "-I", "-c", code], cwd=exported[0] / "tflite", capture_output=True)
    assert result.returncode == 0, result.stderr.decode()
    shipped, expected = pickle.loads(result.stdout), preprocess(spec, small.columns)
    assert sorted(shipped) == sorted(expected)
    for name, values in expected.items():
        np.testing.assert_array_equal(shipped[name], values, err_msg=name)


def perturbed_output_bias(model, shift):
    """A copy of `model` whose output bias moved by `shift`: every probability p moves by about p(1-p)*shift, a
    disagreement of the size a converter slip would cause."""
    copy = tf.keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    output = copy.get_layer("output")
    kernel, bias = output.get_weights()
    output.set_weights([kernel, bias + np.float32(shift)])
    return copy


def test_float_formats_are_held_to_max_abs_diff_on_their_own(small, spec, tmp_path):
    """The SavedModel of the small model against TFLite float32 and ONNX converted from a copy whose output bias moved
    by 3e-4: each float format disagrees by the same measured amount; a limit 5% above it passes, 5% below fails."""
    perturbed = perturbed_output_bias(small.model, 3e-4)
    features = preprocess(spec, small.columns)
    expected = float(np.max(np.abs(perturbed(features).numpy() - small.model(features).numpy())))
    assert 4e-5 < expected < 1e-4  # a small miss: below the default limit, above the one set here
    output_dir = tmp_path / "version"
    formats = options(formats=["saved_model", "tflite", "onnx"], tflite_variants=["float32"],
                      max_abs_diff=0.95 * expected)
    with pytest.raises(ExportGateError) as error:
        export_and_verify(small.serving_model_dir, perturbed, spec, eval_data(small), str(output_dir), formats)
    report = json.loads((output_dir / "export_report.json").read_text())
    assert not report["passed"]
    rows = {row["artifact"]: row for row in report["artifacts"]}
    for name in ("tflite/float32", "onnx"):
        assert rows[name]["max_abs_diff"] == pytest.approx(expected, rel=0.02), name
        assert rows[name]["check"] == {"figure": "max_abs_diff", "value": rows[name]["max_abs_diff"],
                                       "threshold": 0.95 * expected, "config_key": "export.max_abs_diff",
                                       "passed": False}
        assert f"{name}: max_abs_diff {rows[name]['max_abs_diff']:.6g} is above the threshold" in str(error.value)
    assert rows["saved_model"]["check"]["passed"]
    assert str(error.value).startswith("export verification failed, nothing is pushed: ")

    # The same artifacts, each on its own against the SavedModel, just inside a limit 5% above the measured figure.
    reference = (output_dir, SavedModelRunner(str(output_dir)))
    converted = {"tflite/float32": TFLiteRunner(str(output_dir / "tflite" / "model_float32.tflite"), spec),
                 "onnx": OnnxRunner(str(output_dir / "onnx" / "model.onnx"), spec)}
    for name, runner in converted.items():
        result = verify({"saved_model": reference, name: (output_dir, runner)}, eval_data(small),
                        options(max_abs_diff=1.05 * expected))
        assert result.passed, name


@pytest.fixture(scope="module")
def exported_saved_model(exported):
    return exported[0], SavedModelRunner(str(exported[0]))


@pytest.mark.parametrize("variant", ["dynamic", "float16", "int8"])
def test_quantized_variants_are_held_to_max_quantized_degradation_on_their_own(exported, exported_saved_model, small,
                                                                            spec, variant):
    """Each quantized variant's measured AUC drop against the SavedModel: a limit 1e-4 above it passes, 1e-4 below
    fails, and the float limit plays no part (0 here, which only the SavedModel itself meets)."""
    output_dir, result = exported
    rows = {row.artifact: row for row in result.artifacts}
    drop = rows[f"tflite/{variant}"].check.value
    assert drop == pytest.approx(result.reference["auc"] - rows[f"tflite/{variant}"].metrics["auc"], abs=1e-12)
    artifacts = {"saved_model": exported_saved_model,
                 f"tflite/{variant}": (output_dir, TFLiteRunner(
                     str(output_dir / "tflite" / f"model_{variant}.tflite"), spec))}
    for limit, passes in [(drop + 1e-4, True), (drop - 1e-4, False)]:
        checked = verify(artifacts, eval_data(small), options(max_quantized_degradation=limit, max_abs_diff=0.0))
        row = checked.artifacts[1]
        assert row.check.figure == "auc_degradation" and row.check.value == pytest.approx(drop, abs=1e-12)
        assert row.check.passed is passes and checked.passed is passes


def test_a_calibrated_model_exports_and_every_format_serves_its_calibrated_probabilities(small, spec, tmp_path):
    """Platt scaling folded into the small model's output layer: every float format agrees with the SavedModel
    within the default max_abs_diff, and each serves sigmoid(scale * logit + shift), not the raw probabilities."""
    calibration = Calibration("platt", scale=0.6, shift=-0.5)
    calibrated = fold(small.model, calibration)
    serving_dir = str(tmp_path / "calibrated_serving")
    tft_output = tft.TFTransformOutput(small.transform_dir)
    export_serving_model(calibrated, tft_output, small.layout, serving_dir, decision_threshold=0.37)
    output_dir = tmp_path / "version"
    figures = CalibrationFigures(calibration=1.0, ece=0.01, auc=0.9, precision=0.7, recall=0.8)
    record = CalibrationRecord(method="platt", fitted_on="the calibration split", rows=500,
                               measured_on="the eval split", measured_rows=500, objective="f1", threshold=0.37,
                               before=figures, after=figures, scale=0.6, shift=-0.5)
    result = export_and_verify(serving_dir, calibrated, spec, eval_data(small), str(output_dir),
                               options(tflite_variants=["float32"]), calibration=record)
    rows = {row.artifact: row for row in result.artifacts}
    assert result.passed and set(rows) == {"saved_model", "tflite/float32", "onnx", "tfjs"}
    for name in ("tflite/float32", "onnx", "tfjs"):
        assert rows[name].max_abs_diff <= 1e-4, name
    assert json.loads((output_dir / "export_report.json").read_text())["calibration"] == record.to_dict()

    features = preprocess(spec, small.columns)
    logits, _ = model_logits(small.model, tf.data.Dataset.from_tensors((features, small.labels)))
    served = SavedModelRunner(str(output_dir)).predict(small.columns)
    np.testing.assert_allclose(served, apply(calibration, logits), atol=1e-5)
    assert np.max(np.abs(served - small.model(features).numpy().reshape(-1))) > 0.05, "calibration changed them"
    assert tf.saved_model.load(str(output_dir)).decision_threshold.numpy() == pytest.approx(0.37)


def test_a_failing_tfjs_conversion_says_so_in_one_sentence(tmp_path):
    conversion = convert.TfjsConversion(str(tmp_path / "no_such_saved_model"), str(tmp_path / "tfjs"))
    with pytest.raises(RuntimeError, match="the tensorflowjs converter failed: .+"):
        conversion.wait()


def test_a_format_failing_during_the_tfjs_conversion_stops_the_converter(small, spec, tmp_path, monkeypatch):
    """The TF.js converter runs beside the in-process conversions; when one of those fails, no converter is left
    running (and writing) after the Exporter gave up."""
    from components.exporter import export

    started = []

    class Recorded(convert.TfjsConversion):
        def __init__(self, *args):
            super().__init__(*args)
            started.append(self._process)

    def broken(*_args):
        raise RuntimeError("the TFLite converter broke")

    monkeypatch.setattr(convert, "TfjsConversion", Recorded)
    monkeypatch.setattr(export, "_export_tflite_and_onnx", broken)
    with pytest.raises(RuntimeError, match="the TFLite converter broke"):
        export.export_formats(small.serving_model_dir, small.model, spec, str(tmp_path), options())
    (process,) = started
    assert process.returncode is not None


def test_one_tflite_converter_for_every_variant_gives_each_variant_s_own_model(small, spec, tmp_path):
    """The Exporter loads the SavedModel once for all variants: whatever the order, each flatbuffer is the one a
    converter of its own gives (no setting of one variant leaks into the next)."""
    core_dir = str(tmp_path / "core")
    convert.save_core_model(small.model, spec, core_dir)
    representative = functools.partial(_representative, spec, small.train_columns)
    order = ["int8", "float16", "dynamic", "float32"]
    shared = convert.tflite_converter(core_dir)
    for variant in order:
        convert.export_tflite(shared, variant, str(tmp_path / f"shared_{variant}.tflite"), representative)
    for variant in order:
        convert.export_tflite(core_dir, variant, str(tmp_path / f"own_{variant}.tflite"), representative)
        own = (tmp_path / f"own_{variant}.tflite").read_bytes()
        assert (tmp_path / f"shared_{variant}.tflite").read_bytes() == own, variant


def test_every_format_reads_the_training_csvs_markers_as_missing(exported, small):
    """The small model's data.missing_values are NA and -999 (ExampleGen read them as empty cells): a request that
    holds one gets the answer of the same row with the gap, from the SavedModel and from each converted format."""
    from components.exporter.preprocessing import load_spec
    from components.exporter.runtimes import TfjsRunner

    output_dir, _ = exported
    spec = load_spec(str(output_dir / "tflite" / "preprocessing.json"))
    assert spec["missing_values"] == ["NA", "-999"]
    rows = slice(0, 30)
    gaps = {name: np.array(values[rows], copy=True) for name, values in small.columns.items()}
    marked = {name: np.array(values, copy=True) for name, values in gaps.items()}
    # A float, an integer and a string column, each optional in the schema: ten rows each.
    gaps["trip_miles"][0:10], marked["trip_miles"][0:10] = np.nan, -999.0
    gaps["trip_seconds"][10:20], marked["trip_seconds"][10:20] = -1, -999
    gaps["payment_type"][20:30], marked["payment_type"][20:30] = "", " NA"
    runners = {"saved_model": SavedModelRunner(str(output_dir)),
               "tflite/float32": TFLiteRunner(str(output_dir / "tflite" / "model_float32.tflite"), spec),
               "onnx": OnnxRunner(str(output_dir / "onnx" / "model.onnx"), spec),
               "tfjs": TfjsRunner(str(output_dir / "tfjs"), convert.NODE_DIR, "probabilities")}
    for name, runner in runners.items():
        with_gaps, with_markers = runner.predict(gaps), runner.predict(marked)
        np.testing.assert_array_equal(with_markers, with_gaps, err_msg=name)
        # The markers are not read as values: -999 miles would move the answer.
        assert not np.array_equal(with_gaps, runner.predict({**gaps, "trip_miles": np.full(30, -998.0)})), name


def test_one_model_converts_to_the_same_onnx_and_tfjs_bytes_each_time(small, spec, tmp_path):
    """The publisher knows a model it already holds by its bytes: a second conversion (another trace with other op
    ids, another converter process with another map order) gives the same ONNX and TF.js files."""
    onnx_bytes, tfjs_bytes = [], []
    for run in ("first", "second"):
        core_dir = str(tmp_path / run / "core")
        module = convert.save_core_model(small.model, spec, core_dir)
        tfjs_dir = tmp_path / run / "tfjs"
        conversion = convert.TfjsConversion(core_dir, str(tfjs_dir))
        convert.export_onnx(module, spec, str(tmp_path / run / "model.onnx"), options().onnx_opset)
        conversion.wait()
        onnx_bytes.append((tmp_path / run / "model.onnx").read_bytes())
        tfjs_bytes.append((tfjs_dir / "model.json").read_bytes())
    assert onnx_bytes[0] == onnx_bytes[1]
    assert tfjs_bytes[0] == tfjs_bytes[1]


def test_the_same_weights_export_to_the_same_bytes_whatever_the_models_last_evaluation(small, tmp_path):
    """Keras keeps its metrics' running totals in the model; two exports of the same weights after different
    evaluations must still be byte for byte the same, or the Publisher takes a re-run's model for a new one."""
    from components.publisher.publish import source_manifest
    from serving.repository.base import content_digest

    tft_output = tft.TFTransformOutput(small.transform_dir)
    digests = []
    for total in (4.7e9, 4.8e9):
        for metric in small.model.metrics:
            for variable in metric.variables:
                variable.assign(tf.fill(variable.shape, tf.constant(total, variable.dtype)))
        folder = tmp_path / f"after_{total:.0e}"
        export_serving_model(small.model, tft_output, small.layout, str(folder))
        # saved_model.pb (and fingerprint.pb) name traced functions by a per-process counter: a second export in
        # one process differs there, a re-run's in its own process does not. The metrics live in variables/.
        digests.append(content_digest({name: entry for name, entry in source_manifest(str(folder)).items()
                                       if name.startswith("variables/")}))
    assert small.model.metrics, "the small model is compiled with metrics, as the Trainer's is"
    assert digests[0] == digests[1]
