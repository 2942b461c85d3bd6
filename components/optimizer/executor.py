"""Executor of the Optimizer: artifacts in, `optimize` then `calibrate`, a Model artifact laid out like the
Trainer's out."""
from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf
import tensorflow_transform as tft
from absl import logging
from tfx.dsl.components.base import base_executor
from tfx.types import artifact_utils

from components import artifacts
from components.calibration import calibrate, resolve_method
from components.features import FeatureLayout, transformed_name
from components.model import (
    build_model,
    categorical_cardinalities,
    class_weights,
    export_serving_model,
    load_keras_model,
    save_keras_model,
    task_loss,
)
from components.optimizer.optimize import OptimizationGateError, optimize
from components.specs import (
    CALIBRATION_KEY,
    DATA_KEY,
    EVALUATION_KEY,
    EXAMPLES_KEY,
    MODEL_KEY,
    OPTIMIZE_KEY,
    OPTIMIZED_MODEL_KEY,
    TRAINING_KEY,
    TRANSFORM_GRAPH_KEY,
)
from components.tasks import task_from_transform
from reports.records import OptimizationReport
from settings.config import (
    CalibrationConfig,
    DataConfig,
    EvaluationConfig,
    OptimizeConfig,
    TrainingConfig,
    read_section,
)

# Rows shuffled together when reading the training split; the split is re-read (and reshuffled) as it repeats.
SHUFFLE_BUFFER = 10_000


def transformed_dataset(
    split_uri: str,
    feature_spec: dict[str, Any],
    label_key: str,
    input_names: list[str],
    batch_size: int,
    *,
    repeat: bool,
    seed: int | None = None,
) -> tf.data.Dataset:
    """(features, label) batches of one split of the Transform's gzipped TFRecords, features shaped (batch, 1)
    like the Keras model's inputs; shuffled and repeated forever when `repeat`, else one pass in file order."""
    missing = [name for name in [*input_names, label_key] if name not in feature_spec]
    if missing:
        raise ValueError(f"the transformed examples lack {', '.join(missing)}, which the model needs; train the model "
                         "and the Transform with the same features.")
    spec = {name: feature_spec[name] for name in [*input_names, label_key]}
    dataset = artifacts.record_dataset(split_uri)
    if repeat:
        dataset = dataset.shuffle(SHUFFLE_BUFFER, seed=seed, reshuffle_each_iteration=True).repeat()

    def parse(serialized: tf.Tensor) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
        parsed = tf.io.parse_example(serialized, spec)
        label = parsed.pop(label_key)
        # Transform writes scalars per example, (batch,) once batched; the Keras inputs are (batch, 1).
        return {name: tf.reshape(value, [-1, 1]) for name, value in parsed.items()}, label

    return dataset.batch(batch_size).map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def _write_report(output_uri: str, report: OptimizationReport) -> None:
    artifacts.write_json(artifacts.join(output_uri, artifacts.OPTIMIZATION_REPORT_FILE), report.to_dict(), indent=2)


def run_optimizer(
    model_uri: str,
    transform_graph_uri: str,
    train_uri: str,
    eval_uri: str,
    output_uri: str,
    layout: FeatureLayout,
    training: TrainingConfig,
    options: OptimizeConfig,
    metric: str = "auto",
    calibration_uri: str | None = None,
    calibration: CalibrationConfig | None = None,
) -> OptimizationReport:
    """Optimizes the Keras model of the Model artifact at `model_uri`, then calibrates it on the transformed
    split at `calibration_uri` (none: no calibration), and writes a full Model artifact to `output_uri`; returns the
    optimization report also written there (artifacts.OPTIMIZATION_REPORT_FILE), the calibration record beside it
    (artifacts.CALIBRATION_REPORT_JSON, measured on the eval split). `metric` is evaluation.metric, the one the
    pruning gate watches."""
    seed = training.seed
    tft_output = tft.TFTransformOutput(transform_graph_uri)
    task = task_from_transform(layout.label, tft_output)
    model = load_keras_model(model_uri)
    feature_spec = tft_output.transformed_feature_spec()
    input_names = list(model.input_names)

    def dataset(split_uri: str, repeat: bool) -> tf.data.Dataset:
        return transformed_dataset(split_uri, feature_spec, layout.label_key, input_names, options.batch_size,
                                   repeat=repeat, seed=seed)

    weights = None
    if training.class_weights and task.kind != "regression" and (options.prune or options.distill.enabled):
        # The Trainer balanced the classes; fine-tuning without the same weights would shift the scores.
        weights = class_weights(dataset(train_uri, repeat=False), task)
        logging.info("optimizer: class weights %s", weights)

    def build_student() -> tf.keras.Model:
        student_training = dataclasses.replace(training, hidden_units=list(options.distill.hidden_units))
        return build_model([transformed_name(k) for k in layout.model_numeric],
                           categorical_cardinalities(layout, tft_output), student_training, task)

    try:
        result = optimize(model, dataset(train_uri, repeat=True), dataset(eval_uri, repeat=False), options,
                          build_student, seed=seed, class_weight=weights, kind=task.kind, metric=metric,
                          loss=task_loss(task), label_std=task.label_std if task.kind == "regression" else None)
    except OptimizationGateError as e:
        # The run stops here; the figures stay where the message's reader can look them up.
        _write_report(output_uri, e.report)
        logging.error("optimizer: %s (report: %s)", e,
                      artifacts.join(output_uri, artifacts.OPTIMIZATION_REPORT_FILE))
        raise

    final, threshold = result.model, None
    calibration = calibration or CalibrationConfig(method="none")
    method = resolve_method(calibration, task.kind, calibration_uri is not None)
    if method != "none":
        final, record = calibrate(
            result.model, dataset(calibration_uri, repeat=False), dataset(eval_uri, repeat=False), method,
            calibration, fitted_on=f"the '{artifacts.CALIBRATION_SPLIT}' split (data.calibration_buckets): rows the "
            "model did not train on and the Evaluator does not measure", measured_on="the eval split")
        threshold = record.threshold
        artifacts.write_json(artifacts.join(output_uri, artifacts.CALIBRATION_REPORT_JSON), record.to_dict(), indent=2)
        logging.info("calibration: %s on %d rows, threshold %s (%s); eval calibration %.4f -> %.4f, AUC %.4f -> "
                     "%.4f", method, record.rows, threshold, record.objective, record.before.calibration,
                     record.after.calibration, record.before.auc, record.after.auc)
    else:
        logging.info("calibration: none (%s model, calibration.method %s, calibration split %s)", task.kind,
                     calibration.method, "present" if calibration_uri else "absent")

    if final is model:
        # Nothing was done: downstream still reads this component's output, a copy of the Trainer's.
        artifacts.copy_tree(model_uri, output_uri)
        logging.info("optimizer: copied %s to %s unchanged", model_uri, output_uri)
    else:
        serving_dir = artifacts.serving_model_dir(output_uri)
        export_serving_model(final, tft_output, layout, serving_dir, task, decision_threshold=threshold)
        keras_path = save_keras_model(final, output_uri)
        logging.info("optimizer: wrote %s and %s (stages: %s%s)", serving_dir, keras_path,
                     ", ".join(result.report.stages) or "none", f", calibrate ({method})" if method != "none"
                     else "")
    _write_report(output_uri, result.report)
    return result.report


class Executor(base_executor.BaseExecutor):
    def Do(self, input_dict: dict[str, list[Any]], output_dict: dict[str, list[Any]], exec_properties: dict) -> None:
        examples = artifact_utils.get_single_uri(input_dict[EXAMPLES_KEY])
        # No calibration split (data.calibration_buckets: 0): nothing to calibrate on.
        calibrating = read_section(exec_properties, DATA_KEY, DataConfig).calibration_buckets > 0
        run_optimizer(
            model_uri=artifact_utils.get_single_uri(input_dict[MODEL_KEY]),
            transform_graph_uri=artifact_utils.get_single_uri(input_dict[TRANSFORM_GRAPH_KEY]),
            train_uri=artifacts.split_uri(examples, "train"),
            eval_uri=artifacts.split_uri(examples, "eval"),
            output_uri=artifact_utils.get_single_uri(output_dict[OPTIMIZED_MODEL_KEY]),
            layout=FeatureLayout.from_properties(exec_properties),
            training=read_section(exec_properties, TRAINING_KEY, TrainingConfig),
            options=read_section(exec_properties, OPTIMIZE_KEY, OptimizeConfig),
            metric=read_section(exec_properties, EVALUATION_KEY, EvaluationConfig).metric,
            calibration_uri=artifacts.split_uri(examples, artifacts.CALIBRATION_SPLIT) if calibrating else None,
            calibration=read_section(exec_properties, CALIBRATION_KEY, CalibrationConfig) if calibrating else None,
        )
