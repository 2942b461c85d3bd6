"""The multiclass (iris) and regression (diabetes) examples end to end on their small bundled data: every stage
runs for the task kind, the blessed model is published with its task in the model repository, every exported format
agrees with the SavedModel, and the published version answers over REST and gRPC as the SavedModel does."""
import csv
import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from pipeline import cli
from pipeline.runner import run_local
from serving.clients import GrpcClient, RestClient, format_prediction
from serving.repository.local import ModelRepository
from settings.config import DEFAULT_CONFIG, load_config
from tests.browser import render
from tests.conftest import as_cli_flags
from tests.pipeline.test_report_page import report_problems

CONFIGS_DIR = DEFAULT_CONFIG.parent
FORMATS = {"saved_model", "tflite/float32", "tflite/dynamic", "tflite/float16", "tflite/int8", "onnx", "tfjs"}
# Few steps and no Transform statistics: these runs are about every stage handling the task kind, not the model.
SMALL = ["training.steps_per_epoch=50", "training.eval_steps=5", "optimize.fine_tune_steps=40",
         "transform.statistics=false", "export.latency_rows=10"]
KINDS = {
    "iris": ["training.train_steps=200"],
    "diabetes": ["training.train_steps=300"],
}


def overrides(name: str, output_root: Path) -> list[str]:
    return [f"output_root={output_root}", *SMALL, *KINDS[name]]


@pytest.fixture(scope="module", params=sorted(KINDS))
def run(request, tmp_path_factory):
    name = request.param
    output_root = tmp_path_factory.mktemp(name)
    config = load_config(str(CONFIGS_DIR / f"{name}.yaml"), overrides(name, output_root))
    summary = run_local(config)
    with open(Path(output_root, "data", name, "data.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    return config, summary, rows


def request_rows(config, rows: list[dict[str, str]], count: int) -> list[dict[str, object]]:
    """`count` rows spread over the data, as a client sends them: the features only, numbers as numbers."""
    picked = rows[:: max(1, len(rows) // count)][:count]
    return [{name: (row[name] if name in config.data.vocab_features else float(row[name]))
             for name in config.features} for row in picked]


def test_every_stage_ran_for_the_task_kind_and_the_model_is_blessed(run):
    config, summary, _ = run
    assert summary.blessed is True and summary.published_version == 1
    kind = config.label.kind
    if kind == "multiclass":
        assert set(summary.metrics) >= {"macro_auc", "accuracy", "log_loss", "example_count"}
        assert summary.metrics["macro_auc"] >= config.evaluation.lower_bound
        assert 0 < summary.metrics["log_loss"] < np.log(3)  # better than a uniform guess over three species
        for name in ("precision", "recall"):
            assert sorted(k for k in summary.metrics if k.startswith(f"{name}/")) == [
                f"{name}/classId:{i}" for i in range(3)]
        assert summary.optimization.metric == "macro_auc"
    else:
        assert set(summary.metrics) >= {"rmse", "mae", "r2", "example_count"}
        assert summary.metrics["rmse"] <= config.evaluation.upper_bound
        assert summary.metrics["mae"] <= summary.metrics["rmse"]
        assert 0.0 < summary.metrics["r2"] < 1.0
        assert summary.optimization.metric == "rmse"
    pruned = summary.optimization.pruned
    assert summary.optimization.stages == ("prune",) and pruned.degradation <= config.optimize.max_degradation


def test_every_format_agrees_with_the_saved_model_on_the_task_metric(run):
    config, summary, _ = run
    report = summary.export
    assert report.passed
    kind = config.label.kind
    assert report.task.kind == kind
    rows = {row.artifact: row for row in report.artifacts}
    assert set(rows) == FORMATS
    metric = report.task.metric
    for name in ("tflite/float32", "onnx", "tfjs"):
        assert rows[name].check.figure == "max_abs_diff" and rows[name].max_abs_diff <= 1e-4, name
    for name in ("tflite/dynamic", "tflite/float16", "tflite/int8"):
        assert rows[name].check.figure == f"{metric}_degradation", name
        assert rows[name].check.value <= config.export.max_quantized_degradation, name
        # The degradation runs the metric's way: lower AUC is worse, higher RMSE is worse.
        worse = rows[name].metrics[metric] - report.reference[metric]
        assert rows[name].check.value == pytest.approx(worse if kind == "regression" else -worse, abs=1e-9)
    # The Evaluator's figure on the whole eval split is the one the export table gives the SavedModel on it.
    assert report.eval_rows == summary.metrics["example_count"]
    assert summary.metrics[metric] == pytest.approx(report.reference[metric], rel=1e-6)
    if kind == "multiclass":
        assert report.task.classes == ("setosa", "versicolor", "virginica")
        for folder in ("tflite", "onnx", "tfjs"):
            shipped = json.loads((Path(summary.pushed_path) / folder / "preprocessing.json").read_text())
            assert shipped["task"] == {"kind": "multiclass", "output": "probabilities",
                                       "classes": ["setosa", "versicolor", "virginica"]}


def test_the_published_version_records_its_task(run):
    config, summary, _ = run
    publication = ModelRepository(config.serving_base_dir).publication(config.model_name, 1)
    task = publication["task"]
    assert task["kind"] == config.label.kind and task["metric"] == summary.export.task.metric
    assert task["eval"] == {"artifact": "saved_model", **summary.export.reference}


def test_the_published_model_answers_over_rest_and_grpc_as_the_saved_model_does(run, capsys):
    from serving.server.model_server import ModelServer

    config, summary, data = run
    rows = request_rows(config, data, 12)
    saved_model = tf.saved_model.load(summary.pushed_path).signatures["serving_default"]
    inputs = saved_model.structured_input_signature[1]
    expected = saved_model(**{k: tf.constant(np.array([row[k] for row in rows]).astype(spec.dtype.as_numpy_dtype))
                              if spec.dtype != tf.string else tf.constant([row[k] for row in rows])
                              for k, spec in inputs.items()})

    repository = ModelRepository(config.serving_base_dir)
    server = ModelServer(config_path=repository.config_path, rest_port=0, grpc_port=0, poll_seconds=0)
    assert server.start() == []
    try:
        server.wait_until_available(config.model_name, 1)
        with RestClient(server.rest_url) as rest, GrpcClient(server.grpc_target) as grpc:
            by_rest = rest.predict_outputs(rows, config.model_name, version=1)
            by_grpc = grpc.predict_outputs(rows, config.model_name, version=1)
        capsys.readouterr()
        for transport, address in (("--rest", server.rest_url), ("--grpc", server.grpc_target)):
            assert cli.main(["predict", transport, address, "--model", config.model_name,
                             "--json", json.dumps(rows[:2])]) == 0
            assert capsys.readouterr().out.splitlines() == [format_prediction(answer) for answer in by_rest[:2]]
    finally:
        server.stop()

    assert by_rest == by_grpc
    if config.label.kind == "multiclass":
        classes = ["setosa", "versicolor", "virginica"]
        probabilities = np.array([answer["probabilities"] for answer in by_rest])
        np.testing.assert_allclose(probabilities, expected["probabilities"].numpy(), atol=1e-6)
        np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
        assert [answer["classes"] for answer in by_rest] == [classes] * len(rows)
        assert [answer["class"] for answer in by_rest] == [classes[i] for i in probabilities.argmax(axis=1)]
        # Rows are spread over the data, which is sorted by species: the model tells the three apart.
        assert len({answer["class"] for answer in by_rest}) == 3
        line = format_prediction(by_rest[0])
        assert line.startswith(f"{by_rest[0]['class']}  setosa=")
    else:
        values = np.array([answer["value"] for answer in by_rest])
        assert set(by_rest[0]) == {"value"}
        np.testing.assert_allclose(values, expected["value"].numpy(), rtol=1e-6)
        assert values.std() > 1.0, "a regression model answers more than one value"


def test_run_then_serve_prints_the_task_kinds_prediction(run, capsys):
    config, _, _ = run
    name = config.name
    # Cached: every stage's result is reused, then the stable version is served and asked over both APIs.
    flags = as_cli_flags(overrides(name, Path(config.output_root)))
    assert cli.main(["run", "--config", str(CONFIGS_DIR / f"{name}.yaml"), "--serve-after", *flags]) == 0
    out = capsys.readouterr().out
    [rest] = [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("REST prediction: ")]
    [grpc] = [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("gRPC prediction: ")]
    assert rest == grpc
    if config.label.kind == "multiclass":
        predicted, probabilities = rest.split("  ", 1)
        assert predicted in {"setosa", "versicolor", "virginica"}
        assert [pair.split("=")[0] for pair in probabilities.split()] == ["setosa", "versicolor", "virginica"]
    else:
        assert float(rest) > 0


def test_the_shipped_tflite_and_tfjs_steps_answer_as_the_saved_model_does(run, tmp_path):
    """What a user copies out of a version folder: TFLite with the shipped preprocessing.py (preprocess, then
    postprocess), and TF.js with predict.mjs, give the SavedModel's outputs, class names included."""
    import importlib.util
    import subprocess

    from components.exporter.convert import NODE_DIR
    from components.exporter.runtimes import node_executable

    config, summary, data = run
    version = Path(summary.pushed_path)
    rows = request_rows(config, data, 9)
    saved_model = tf.saved_model.load(str(version)).signatures["serving_default"]
    inputs = saved_model.structured_input_signature[1]
    columns = {k: np.array([row[k] for row in rows]).astype(spec.dtype.as_numpy_dtype)
               if spec.dtype != tf.string else np.array([row[k] for row in rows], dtype=object)
               for k, spec in inputs.items()}
    expected = {k: v.numpy() for k, v in saved_model(**{k: tf.constant(v) for k, v in columns.items()}).items()}

    shipped = importlib.util.spec_from_file_location("shipped_preprocessing", version / "tflite" / "preprocessing.py")
    module = importlib.util.module_from_spec(shipped)
    shipped.loader.exec_module(module)
    spec = module.load_spec(str(version / "tflite" / "preprocessing.json"))
    interpreter = tf.lite.Interpreter(model_path=str(version / "tflite" / "model_float32.tflite"))
    [raw_output] = interpreter.get_signature_runner("serving_default")(**module.preprocess(spec, columns)).values()
    by_tflite = module.postprocess(spec, raw_output)

    request = tmp_path / "request.json"
    request.write_text(json.dumps({k: v.tolist() for k, v in columns.items()}))
    answer = subprocess.run([node_executable(), str(NODE_DIR / "predict.mjs"), str(version / "tfjs"), str(request)],
                            capture_output=True, text=True, timeout=300, check=True)
    by_tfjs = json.loads(answer.stdout)

    assert set(by_tflite) == set(expected) and set(by_tfjs) - {"latency_ms", "backend"} == set(expected)
    numeric = "probabilities" if config.label.kind == "multiclass" else "value"
    for outputs in (by_tflite, by_tfjs):
        np.testing.assert_allclose(np.asarray(outputs[numeric], dtype=np.float64), expected[numeric], rtol=1e-4,
                                   atol=1e-4)
    if config.label.kind == "multiclass":
        names = [name.decode() for name in expected["class"]]
        assert list(by_tflite["class"]) == names and by_tfjs["class"] == names
        assert by_tfjs["classes"] == [[c.decode() for c in row] for row in expected["classes"]]
        assert by_tflite["classes"].tolist() == by_tfjs["classes"]


def test_the_run_report_draws_what_fits_the_task_kind(run):
    config, summary, _ = run
    rendered = render(Path(config.output_root, "runs", summary.run_id, "summary.html"))
    assert report_problems(rendered, config.label.kind) == []
    if config.label.kind == "multiclass":
        for name in summary.export.task.classes:
            assert f">{name}</text>" in rendered.dom
