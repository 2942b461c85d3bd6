"""The Optimizer on a small model of synthetic data: pruning, distillation, the AUC gate and the executor glue."""
import dataclasses
import json
import os
from pathlib import Path

import apache_beam as beam
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_transform as tft
import tensorflow_transform.beam as tft_beam
from tensorflow_transform.tf_metadata import dataset_metadata, metadata_io, schema_utils
from tfx.types import Channel, artifact_utils, standard_artifacts
from tfx.utils import json_utils

from components.artifacts import CALIBRATION_REPORT_JSON, keras_model_path
from components.calibration import binary_figures
from components.features import FeatureLayout
from components.model import build_model, categorical_cardinalities, save_keras_model
from components.optimizer.component import Optimizer
from components.optimizer.executor import Executor
from components.optimizer.optimize import (
    OptimizationGateError,
    distill_model,
    evaluate,
    gzip_size,
    kernel_sparsity,
    optimize,
    prune_model,
)
from components.specs import (
    CODE_FINGERPRINT_KEY,
    EXAMPLES_KEY,
    MODEL_KEY,
    OPTIMIZE_KEY,
    OPTIMIZED_MODEL_KEY,
    OPTIMIZER_SECTIONS,
    TRAINING_KEY,
    TRANSFORM_GRAPH_KEY,
)
from components.transform import preprocessing_fn
from settings.config import (
    CalibrationConfig,
    DistillConfig,
    EvaluationConfig,
    OptimizeConfig,
    TrainingConfig,
    load_config,
    read_section,
)

NUMERIC = ["a_xf", "b_xf"]
CARDINALITIES = {"c1_xf": 6, "c2_xf": 5}
# Kernels of 6x32, 32x16 and 16x1 weights: half of each is a whole number, so 0.5 can be hit exactly.
HIDDEN = [32, 16]
STUDENT_HIDDEN = [8]
SEED = 7
REPORTS = Path(__file__).resolve().parents[1] / "fixtures" / "reports"


def training(**changes):
    return dataclasses.replace(TrainingConfig(), **changes)


def options(**changes):
    return dataclasses.replace(OptimizeConfig(), **changes)


def synthetic(n, seed):
    """Two numeric and two categorical features; the label follows a noisy linear rule of all four."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=n), rng.normal(size=n)
    c1, c2 = rng.integers(0, 6, n), rng.integers(0, 5, n)
    score = 2.0 * a - 1.5 * b + np.linspace(-1.5, 1.5, 6)[c1] + np.array([0.8, -0.8, 0.0, 0.4, -0.4])[c2]
    labels = (score + 0.7 * rng.logistic(size=n) > 0.3).astype(np.int64)
    features = {"a_xf": a[:, None].astype(np.float32), "b_xf": b[:, None].astype(np.float32),
                "c1_xf": c1[:, None].astype(np.int64), "c2_xf": c2[:, None].astype(np.int64)}
    return features, labels


def datasets():
    """Fresh (train, eval) datasets: a new shuffle order state each time, so two runs see the same batches."""
    train_x, train_y = synthetic(3000, seed=0)
    eval_x, eval_y = synthetic(1000, seed=1)
    train = tf.data.Dataset.from_tensor_slices((train_x, train_y)).shuffle(3000, seed=SEED).repeat().batch(64)
    evaluation = tf.data.Dataset.from_tensor_slices((eval_x, eval_y)).batch(256)
    return train, evaluation


@pytest.fixture(scope="module")
def data():
    return datasets()


def build_student():
    return build_model(NUMERIC, CARDINALITIES, training(hidden_units=STUDENT_HIDDEN))


@pytest.fixture(scope="module")
def teacher(data):
    tf.keras.utils.set_random_seed(SEED)
    model = build_model(NUMERIC, CARDINALITIES, training(hidden_units=HIDDEN))
    model.fit(data[0], epochs=1, steps_per_epoch=300, verbose=0)
    return model


@pytest.fixture(scope="module")
def teacher_auc(teacher, data):
    return evaluate(teacher, data[1])["auc"]


@pytest.fixture(scope="module")
def pruned(teacher, data):
    return prune_model(teacher, data[0], target_sparsity=0.5, steps=200, learning_rate=0.001, seed=SEED)


@pytest.fixture(scope="module")
def student(teacher, data):
    return distill_model(teacher, data[0], build_student=build_student, temperature=4.0, alpha=0.3, steps=300,
                         learning_rate=0.005, seed=SEED)


def test_the_teacher_learned_the_rule(teacher_auc):
    assert teacher_auc > 0.9


def test_pruning_reaches_the_target_on_every_dense_kernel(pruned):
    sparsity = kernel_sparsity(pruned)
    assert sorted(sparsity) == ["dense_0", "dense_1", "output"]
    for name, fraction in sparsity.items():
        assert fraction == pytest.approx(0.5, abs=0.01), name


def test_untouched_model_has_no_zeros_and_pruning_leaves_it_and_the_embeddings_alone(teacher, pruned):
    assert max(kernel_sparsity(teacher).values()) < 0.01
    for name in CARDINALITIES:
        table = pruned.get_layer(f"{name}_embedding").embeddings.numpy()
        assert np.mean(table == 0) < 0.01


def test_pruned_model_keeps_inputs_and_output(teacher, pruned, tmp_path):
    assert pruned.input_names == teacher.input_names
    assert [(i.dtype, tuple(i.shape)) for i in pruned.inputs] == [(i.dtype, tuple(i.shape)) for i in teacher.inputs]
    assert pruned.output_names == teacher.output_names == ["output"]
    assert tuple(pruned.output.shape) == (None, 1)
    # The Exporter reloads the Keras file: zeros and predictions survive the round trip.
    path = str(tmp_path / "model.keras")
    pruned.save(path)
    reloaded = tf.keras.models.load_model(path, compile=False)
    assert kernel_sparsity(reloaded) == kernel_sparsity(pruned)
    batch = synthetic(32, seed=5)[0]
    np.testing.assert_allclose(reloaded(batch).numpy(), pruned(batch).numpy(), atol=1e-6)


def test_pruned_auc_stays_close(pruned, teacher_auc, data):
    assert evaluate(pruned, data[1])["auc"] >= teacher_auc - 0.02


def test_pruning_shrinks_the_gzipped_weights(teacher, pruned):
    assert gzip_size(pruned) < 0.85 * gzip_size(teacher)


def test_distilled_student_is_smaller_and_close_to_the_teacher(teacher, student, teacher_auc, data):
    dense = [layer.units for layer in student.layers if isinstance(layer, tf.keras.layers.Dense)]
    assert dense == [*STUDENT_HIDDEN, 1]
    assert student.count_params() < teacher.count_params() / 2
    auc = evaluate(student, data[1])["auc"]
    assert auc > 0.85
    assert auc >= teacher_auc - 0.03


def test_student_learns_from_the_teacher_alone(teacher, teacher_auc, data):
    # alpha=0: no labels at all, so only a working soft-target loss can teach the rule.
    student = distill_model(teacher, data[0], build_student=build_student, temperature=2.0, alpha=0.0, steps=200,
                            learning_rate=0.01, seed=SEED)
    assert evaluate(student, data[1])["auc"] >= teacher_auc - 0.05


def test_nothing_enabled_returns_the_same_model(teacher, data):
    settings = options(prune=False)
    result = optimize(teacher, data[0], data[1], settings, build_student)
    assert result.model is teacher
    assert result.report.stages == ()
    assert "nothing done" in result.report.note
    # What the Optimizer wrote in this case before its report was a record (tests/fixtures/reports).
    written = json.loads((REPORTS / "optimization_report_nothing_done.json").read_text())
    assert result.report.to_dict() == {**written, "kind": "binary", "metric": "auc",
                                       "settings": dataclasses.asdict(settings)}


def test_auc_gate_just_inside_and_just_outside_the_measured_drop(teacher):
    """Pruning to 75% for 20 steps costs the teacher some AUC; the gate passes a limit 1e-4 above that cost and
    fails one 1e-4 below it, with a message naming the figures and the keys to change."""
    def run(max_degradation):
        train, evaluation = datasets()
        settings = options(prune=True, target_sparsity=0.75, fine_tune_steps=20, max_degradation=max_degradation)
        return optimize(teacher, train, evaluation, settings, build_student, seed=SEED)

    measured = run(1.0).report
    # The layout a taxi run's Optimizer wrote before its report was a record, less the distilled model.
    written = json.loads((REPORTS / "taxi" / "optimization_report.json").read_text())
    layout = {key: sorted(value) if isinstance(value, dict) else None for key, value in written.items()
              if key != "distilled"}
    assert {key: sorted(value) if isinstance(value, dict) else None
            for key, value in measured.to_dict().items()} == layout
    drop = measured.pruned.degradation
    assert drop == pytest.approx(measured.input.metrics["auc"] - measured.pruned.metrics["auc"], abs=1e-12)
    assert measured.pruned.kernel_sparsity["dense_1"] == pytest.approx(0.75, abs=0.01)

    inside = run(drop + 1e-4)
    assert inside.report.pruned.degradation == pytest.approx(drop, abs=2e-5)
    assert inside.report.summary.output_stage == "pruned"
    with pytest.raises(OptimizationGateError) as caught:
        run(drop - 1e-4)
    assert isinstance(caught.value, ValueError)
    report = caught.value.report
    assert report.pruned.degradation == pytest.approx(drop, abs=2e-5)
    assert report.summary.output_stage == "pruned"
    assert str(caught.value) == (
        f"pruning to 75% sparsity worsened the eval auc by {report.pruned.degradation:.4f} "
        f"({report.input.metrics['auc']:.4f} to {report.pruned.metrics['auc']:.4f}), more than "
        f"optimize.max_degradation={drop - 1e-4}; allow more with optimize.max_degradation or fine-tune longer "
        "with optimize.fine_tune_steps (export.max_quantized_degradation and evaluation.max_degradation limit the "
        "same eval auc in the same units, so raise them alike)."
    )


def test_a_nan_metric_fails_the_gate_with_its_cause_not_a_tolerance_to_raise():
    from components.tasks import Task

    task = Task("regression", label_mean=0.0, label_std=1.0)
    model = build_model(NUMERIC, CARDINALITIES, training(hidden_units=[4]), task)
    features, _ = synthetic(64, seed=2)
    values = np.arange(64, dtype=np.float32)
    values[5] = np.nan  # a missing regression label, as the Transform made it before ExampleGen left such rows out
    train = tf.data.Dataset.from_tensor_slices((features, np.arange(64, dtype=np.float32))).repeat().batch(16)
    evaluation = tf.data.Dataset.from_tensor_slices((features, values)).batch(32)
    with pytest.raises(OptimizationGateError) as caught:
        optimize(model, train, evaluation, options(fine_tune_steps=4, max_degradation=1000.0), build_student,
                 seed=SEED, kind="regression", loss=tf.keras.losses.MeanSquaredError(), label_std=1.0)
    message = str(caught.value)
    assert message.startswith("the eval rmse is nan before pruning and nan after, so no tolerance can pass")
    assert "max_degradation" not in message and "missing label" in message


# --- The executor on a real transform graph (TFT's Beam analysis of a few rows) and gzipped TFRecords. ---

CUSTOM_CONFIG = {
    "data": {"numeric_features": ["a", "b"], "bucket_features": [], "vocab_features": ["c"]},
    "label": {"name": "label", "column": "t", "threshold": 0.0, "relative_to": "", "positive_value": ""},
    "transform": {"bucket_count": 10, "vocab_size": 100, "oov_buckets": 1},
    "training": dataclasses.asdict(training(hidden_units=[16, 8], seed=SEED)),
    # The pruning gate watches evaluation.metric (auto: AUC for this binary label).
    "evaluation": dataclasses.asdict(EvaluationConfig()),
}
RAW_SPEC = {
    "a": tf.io.FixedLenFeature([1], tf.float32),
    "b": tf.io.FixedLenFeature([1], tf.float32),
    "c": tf.io.FixedLenFeature([1], tf.string),
    "t": tf.io.FixedLenFeature([1], tf.float32),
}


def raw_rows(n, seed):
    rng = np.random.default_rng(seed)
    a, b, c = rng.normal(size=n), rng.normal(size=n), rng.integers(0, 5, n)
    t = 2.0 * a - b + 0.8 * (c - 2) + 0.5 * rng.logistic(size=n)
    return {"a": a.astype(np.float32), "b": b.astype(np.float32),
            "c": np.array([f"v{i}".encode() for i in c]), "t": t.astype(np.float32)}


def write_split(folder, transformed):
    os.makedirs(folder)
    with tf.io.TFRecordWriter(os.path.join(folder, "part-00000.gz"), options="GZIP") as writer:
        for i in range(len(transformed["label"])):
            feature = {}
            for name, values in transformed.items():
                value = values[i]
                if values.dtype.kind == "f":
                    feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
                else:
                    feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """A transform graph, transformed train/eval splits and a trained model artifact, as the pipeline has them."""
    root = tmp_path_factory.mktemp("optimizer")
    graph = str(root / "transform_graph")
    sample = raw_rows(200, seed=10)
    rows = [{k: [v[i]] for k, v in sample.items()} for i in range(200)]
    metadata = dataset_metadata.DatasetMetadata(schema_utils.schema_from_feature_spec(RAW_SPEC))
    with beam.Pipeline() as pipeline, tft_beam.Context(temp_dir=str(root / "tmp"), force_tf_compat_v1=False):
        transform_fn = (pipeline | beam.Create(rows), metadata) | tft_beam.AnalyzeDataset(
            lambda inputs: preprocessing_fn(inputs, CUSTOM_CONFIG)
        )
        _ = transform_fn | tft_beam.WriteTransformFn(graph)
    # TFX's Transform also writes the raw schema there; the serving signatures are built from it.
    metadata_io.write_metadata(metadata, os.path.join(graph, tft.TFTransformOutput.RAW_METADATA_DIR))

    tft_output = tft.TFTransformOutput(graph)
    layer = tft_output.transform_features_layer()
    examples = root / "transformed_examples"
    splits = {}
    for split, n, seed in (("train", 2000, 11), ("eval", 600, 12), ("calibration", 600, 13)):
        raw = raw_rows(n, seed)
        transformed = {k: v.numpy().reshape(-1) for k, v in layer({k: v[:, None] for k, v in raw.items()}).items()}
        write_split(str(examples / f"Split-{split}"), transformed)
        splits[split] = (raw, transformed)

    train = splits["train"][1]
    inputs = {k: v[:, None] for k, v in train.items() if k != "label"}
    tf.keras.utils.set_random_seed(SEED)
    model = build_model(["a_xf", "b_xf"],
                        categorical_cardinalities(FeatureLayout.from_properties(CUSTOM_CONFIG), tft_output),
                        training(hidden_units=[16, 8], seed=SEED))
    model.fit(inputs, train["label"], batch_size=64, epochs=2, verbose=0)
    model_uri = root / "model"
    (model_uri / "Format-Serving").mkdir(parents=True)
    (model_uri / "Format-Serving" / "saved_model.pb").write_bytes(b"stand-in for the Trainer's SavedModel")
    save_keras_model(model, str(model_uri))
    return {"root": root, "graph": graph, "examples": str(examples), "model": str(model_uri), "eval": splits["eval"]}


def run_executor(artifacts, output_name, optimize_settings, **sections):
    model, graph, examples, output = (standard_artifacts.Model(), standard_artifacts.TransformGraph(),
                                      standard_artifacts.Examples(), standard_artifacts.Model())
    model.uri, graph.uri, examples.uri = artifacts["model"], artifacts["graph"], artifacts["examples"]
    examples.split_names = artifact_utils.encode_split_names(["train", "eval"])
    output.uri = str(artifacts["root"] / output_name)
    os.makedirs(output.uri)
    properties = {key: json_utils.dumps(value) for key, value in CUSTOM_CONFIG.items()}
    properties[OPTIMIZE_KEY] = json_utils.dumps(dataclasses.asdict(optimize_settings))
    properties.update({key: json_utils.dumps(value) for key, value in sections.items()})
    Executor().Do({MODEL_KEY: [model], TRANSFORM_GRAPH_KEY: [graph], EXAMPLES_KEY: [examples]},
                  {OPTIMIZED_MODEL_KEY: [output]}, properties)
    with open(os.path.join(output.uri, "optimization_report.json")) as f:
        return output.uri, json.loads(f.read())


def test_executor_distils_prunes_and_exports_like_the_trainer(artifacts):
    # 0.25, not 0.5: a schedule that pruned to 1 - target would be caught.
    settings = options(prune=True, target_sparsity=0.25, fine_tune_steps=60, batch_size=64, max_degradation=0.05,
                       distill=DistillConfig(enabled=True, hidden_units=[8], steps=100))
    uri, report = run_executor(artifacts, "optimized", settings)
    assert report["stages"] == ["distill", "prune"]
    assert report["distilled"]["dense_units"] == [8, 1]
    assert report["summary"]["auc_after"] > 0.85
    assert report["summary"]["gzip_bytes_after"] < report["summary"]["gzip_bytes_before"]

    model = tf.keras.models.load_model(keras_model_path(uri), compile=False)
    assert all(s == pytest.approx(0.25, abs=0.01) for s in kernel_sparsity(model).values())
    # The SavedModel serves raw features through the Transform graph and agrees with the Keras model.
    raw, transformed = artifacts["eval"]
    served = tf.saved_model.load(os.path.join(uri, "Format-Serving"))
    probabilities = served.signatures["serving_default"](
        **{k: tf.constant(raw[k][:50]) for k in ("a", "b", "c")}
    )["probabilities"].numpy()
    expected = model({k: v[:50, None] for k, v in transformed.items() if k != "label"}).numpy().reshape(-1)
    np.testing.assert_allclose(probabilities, expected, atol=1e-5)


def test_executor_with_nothing_to_do_copies_the_trainers_artifact(artifacts):
    uri, report = run_executor(artifacts, "copied", options(prune=False))
    assert report["stages"] == []
    with open(os.path.join(uri, "Format-Serving", "saved_model.pb"), "rb") as f:
        assert f.read() == b"stand-in for the Trainer's SavedModel"
    assert os.path.exists(keras_model_path(uri))


def test_executor_writes_the_report_when_the_gate_fails(artifacts):
    # Zeroing 95% of every kernel with 10 steps to recover costs more AUC than the default allowance of 0.01.
    settings = options(prune=True, target_sparsity=0.95, fine_tune_steps=10, batch_size=64)
    with pytest.raises(OptimizationGateError, match=r"more than optimize.max_degradation=0.01;"):
        run_executor(artifacts, "gated", settings)
    with open(artifacts["root"] / "gated" / "optimization_report.json") as f:
        report = json.load(f)
    assert report["stages"] == ["prune"] and report["pruned"]["degradation"] > 0.01
    assert report["summary"]["auc_before"] - report["summary"]["auc_after"] == report["pruned"]["degradation"]


def test_component_carries_each_config_section_it_reads_typed():
    config = load_config(None, ["optimize.target_sparsity=0.7", "training.seed=3"])
    component = Optimizer(
        model=Channel(type=standard_artifacts.Model),
        transform_graph=Channel(type=standard_artifacts.TransformGraph),
        examples=Channel(type=standard_artifacts.Examples),
        sections=config.sections(*OPTIMIZER_SECTIONS),
        code_fingerprint="abc",
    )
    properties = component.exec_properties
    assert sorted(properties) == sorted([*OPTIMIZER_SECTIONS, CODE_FINGERPRINT_KEY])
    assert read_section(properties, OPTIMIZE_KEY, OptimizeConfig) == config.optimize
    assert read_section(properties, TRAINING_KEY, TrainingConfig) == config.training
    assert FeatureLayout.from_properties(properties).data == config.data
    assert component.outputs[OPTIMIZED_MODEL_KEY].type == standard_artifacts.Model


def test_executor_calibrates_on_the_calibration_split_and_serves_the_calibrated_model(artifacts, tmp_path):
    """A model whose output bias was pushed up (over-predicting, as class weights make it): the Optimizer's output
    serves calibrated probabilities, records the fit and the threshold, and keeps the ranking."""
    model = tf.keras.models.load_model(keras_model_path(artifacts["model"]), compile=False)
    output = model.get_layer("output")
    kernel, bias = output.get_weights()
    output.set_weights([kernel, bias + 1.5])
    shifted = {**artifacts, "model": str(tmp_path / "shifted")}
    save_keras_model(model, shifted["model"])
    data = {**CUSTOM_CONFIG["data"], "calibration_buckets": 1}
    calibration = dataclasses.asdict(CalibrationConfig(threshold_objective="min_precision", min_precision=0.9))
    uri, report = run_executor(shifted, "calibrated", options(prune=False), data=data, calibration=calibration)
    assert report["stages"] == []
    with open(os.path.join(uri, CALIBRATION_REPORT_JSON)) as f:
        record = json.load(f)
    assert record["method"] == "platt" and "calibration" in record["fitted_on"] and record["rows"] == 600
    assert record["objective"] == "min_precision" and record["min_precision"] == 0.9
    assert record["before"]["calibration"] > 1.2
    assert record["after"]["calibration"] == pytest.approx(1.0, abs=0.08)
    assert record["after"]["auc"] == pytest.approx(record["before"]["auc"], abs=1e-6)
    assert record["after"]["precision"] >= 0.85 and set(record["after"]) == {"calibration", "ece", "auc", "precision",
                                                                            "recall"}

    raw, transformed = artifacts["eval"]
    served = tf.saved_model.load(os.path.join(uri, "Format-Serving"))
    probabilities = served.signatures["serving_default"](
        **{k: tf.constant(raw[k]) for k in ("a", "b", "c")})["probabilities"].numpy()
    assert served.decision_threshold.numpy() == pytest.approx(record["threshold"])
    labels = transformed["label"]
    assert binary_figures(probabilities, labels, record["threshold"]).to_dict() == pytest.approx(record["after"],
                                                                                                abs=1e-4)
    calibrated = tf.keras.models.load_model(keras_model_path(uri), compile=False)
    expected = calibrated({k: v[:, None] for k, v in transformed.items() if k != "label"}).numpy().reshape(-1)
    np.testing.assert_allclose(probabilities, expected, atol=1e-5)


def test_executor_without_a_calibration_split_writes_no_calibration_record(artifacts):
    uri, _ = run_executor(artifacts, "uncalibrated", options(prune=False))
    assert not os.path.exists(os.path.join(uri, CALIBRATION_REPORT_JSON))
