"""Model optimization behind the Optimizer component: distillation into a smaller student, magnitude pruning of
the Dense kernels, and the figures (the task's metrics, sparsity, compressed size) that show what each stage cost
and saved. Every task kind: binary, multiclass and regression models (components/tasks.py).

Plain functions over Keras models and tf.data datasets of (transformed features dict, label) batches; the
component's executor is the only caller that knows about artifacts.
"""
from __future__ import annotations

import dataclasses
import gzip
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_model_optimization as tfmot
from absl import logging

from components.tasks import describe_figures, task_metrics
from reports.records import ModelFigures, OptimizationReport, OptimizationSummary
from settings.config import OptimizeConfig, tolerance_note
from settings.tasks import TASK_METRICS, higher_is_better, task_metric

# Probabilities are clipped this far from 0 and 1 before turning them back into logits (float32-safe).
_PROB_EPSILON = 1e-7
# The fraction of the fine-tuning steps over which the sparsity ramps up; the rest trains at the final sparsity.
_RAMP_FRACTION = 0.7


class OptimizationGateError(ValueError):
    """Pruning worsened the eval metric more than optimize.max_degradation allows; `report` holds every figure."""

    def __init__(self, message: str, report: OptimizationReport):
        super().__init__(message)
        self.report = report


@dataclass
class OptimizationResult:
    model: tf.keras.Model
    report: OptimizationReport


def _dense_layers(model: tf.keras.Model) -> list[tf.keras.layers.Dense]:
    return [layer for layer in model.layers if isinstance(layer, tf.keras.layers.Dense)]


def kernel_sparsity(model: tf.keras.Model) -> dict[str, float]:
    """Fraction of exact zeros in each Dense kernel, by layer name."""
    return {layer.name: float(np.mean(layer.kernel.numpy() == 0)) for layer in _dense_layers(model)}


def gzip_size(model: tf.keras.Model) -> int:
    """Bytes of the model's weights saved as HDF5 and gzipped: zeroed weights compress, dense ones hardly do."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "weights.h5")
        model.save_weights(path)
        with open(path, "rb") as f:
            return len(gzip.compress(f.read(), compresslevel=9))


def nonzero_parameters(model: tf.keras.Model) -> int:
    return int(sum(np.count_nonzero(w) for w in model.get_weights()))


def evaluate(
    model: tf.keras.Model, dataset: tf.data.Dataset, steps: int | None = None, kind: str = "binary"
) -> dict[str, float]:
    """The task's eval metrics (binary: AUC and accuracy at 0.5; components/tasks.py for the others) over every row
    of `dataset`, or of its first `steps` batches, and the number of rows.

    `dataset` yields (features, label) batches and must be finite unless `steps` is given.
    """
    if steps is not None:
        dataset = dataset.take(steps)
    labels, outputs = [], []
    for features, label in dataset:
        prediction = model(features, training=False).numpy()
        outputs.append(prediction)
        labels.append(np.reshape(label.numpy(), -1))
    if not labels:
        raise ValueError("the evaluation data is empty; check the eval split of the transformed examples.")
    y = np.concatenate(labels)
    p = np.concatenate(outputs)
    if kind == "binary" and np.unique(y).size < 2:
        raise ValueError(f"the evaluation data holds only one class ({int(y.sum())} positives of {y.size} rows), "
                         "so AUC is undefined; check the eval split and the label settings.")
    if kind == "multiclass" and np.unique(y).size < 2:
        raise ValueError(f"the evaluation data holds only one class (id {int(y[0])}), so the macro AUC is undefined; "
                         "check the eval split and the label settings.")
    return {**task_metrics(kind, p, y), "rows": int(y.size)}


def pruning_gate(before: float, after: float, max_degradation: float, higher_is_better: bool = True
                 ) -> tuple[float, bool]:
    """The Optimizer's gate: how much worse pruning made the eval metric (a drop in AUC, a rise in RMSE; negative
    when it improved), and whether that is at most optimize.max_degradation."""
    worse = before - after if higher_is_better else after - before
    return worse, worse <= max_degradation


def _pruning_schedule(target_sparsity: float, steps: int) -> tfmot.sparsity.keras.PolynomialDecay:
    # Masks update every `frequency` steps only, so end_step must be a multiple of it for the last update to
    # land on the final target; the pruning step counts 1..steps, so end_step <= steps is always reached.
    frequency = max(1, steps // 20)
    end_step = min(steps, frequency * max(1, round(_RAMP_FRACTION * steps / frequency)))
    return tfmot.sparsity.keras.PolynomialDecay(
        initial_sparsity=0.0, final_sparsity=target_sparsity, begin_step=0, end_step=end_step, frequency=frequency
    )


def prune_model(
    model: tf.keras.Model,
    train: tf.data.Dataset,
    *,
    target_sparsity: float,
    steps: int,
    learning_rate: float,
    seed: int,
    class_weight: dict[int, float] | None = None,
    loss: tf.keras.losses.Loss | None = None,
) -> tf.keras.Model:
    """A copy of `model` whose Dense kernels are `target_sparsity` zeros, fine-tuned `steps` batches of `train` on
    `loss` (the task's training loss; binary cross-entropy by default).

    Embeddings stay dense: their tables are small and ids are few, so they could not hit the target exactly and
    zeroing rows would erase whole categories. The input model is left untouched; the result has its inputs and
    output (names, dtypes, shapes), so it exports like the Trainer's model.
    """
    if not 0.0 < target_sparsity < 1.0:
        raise ValueError(f"target_sparsity must be between 0 and 1, got {target_sparsity}.")
    if steps < 1:
        raise ValueError(f"pruning needs at least one fine-tuning step, got {steps}.")
    if not _dense_layers(model):
        raise ValueError("the model has no Dense layer to prune.")
    tf.keras.utils.set_random_seed(seed)
    # The wrappers below reuse the layers they wrap, so they wrap a copy: fine-tuning must not alter `model`.
    detached = tf.keras.models.clone_model(model)
    detached.set_weights(model.get_weights())
    schedule = _pruning_schedule(target_sparsity, steps)

    def wrap_dense(layer: tf.keras.layers.Layer) -> tf.keras.layers.Layer:
        if isinstance(layer, tf.keras.layers.Dense):
            return tfmot.sparsity.keras.prune_low_magnitude(layer, pruning_schedule=schedule)
        return layer

    wrapped = tf.keras.models.clone_model(detached, clone_function=wrap_dense)
    wrapped.compile(optimizer=tf.keras.optimizers.Adam(learning_rate),
                    loss=loss or tf.keras.losses.BinaryCrossentropy())
    logging.info("pruning: %d fine-tuning steps, sparsity 0 -> %.2f by step %d (mask update every %d steps)",
                 steps, target_sparsity, schedule.end_step, schedule.frequency)
    history = wrapped.fit(
        train,
        epochs=1,
        steps_per_epoch=steps,
        class_weight=class_weight,
        # Advances the schedule every batch and re-applies the masks at the end, after the last weight update.
        callbacks=[tfmot.sparsity.keras.UpdatePruningStep()],
        verbose=0,
    )
    logging.info("pruning: fine-tuning loss %.4f", history.history["loss"][-1])
    return tfmot.sparsity.keras.strip_pruning(wrapped)


def _logit(probability: tf.Tensor) -> tf.Tensor:
    p = tf.clip_by_value(tf.cast(probability, tf.float32), _PROB_EPSILON, 1.0 - _PROB_EPSILON)
    return tf.math.log(p) - tf.math.log1p(-p)


def _log_probabilities(probability: tf.Tensor) -> tf.Tensor:
    """Logits of a softmax output, up to a constant per row (which softmax ignores)."""
    return tf.math.log(tf.clip_by_value(tf.cast(probability, tf.float32), _PROB_EPSILON, 1.0))


def distillation_loss(kind: str, labels: tf.Tensor, teacher: tf.Tensor, student: tf.Tensor, temperature: tf.Tensor,
                      alpha: float) -> tf.Tensor:
    """Per-example loss of the student: alpha * (its loss on the labels) + (1 - alpha) * (its loss on the teacher's
    predictions). Classifiers match the teacher's probabilities softened by the temperature T (sigmoid or softmax of
    logits / T), scaled by T^2 to keep the soft term's gradients comparable across temperatures; a regression
    student matches the teacher's values (squared error; T plays no part)."""
    if kind == "regression":
        labels = tf.cast(tf.reshape(labels, [-1]), tf.float32)
        student, teacher = tf.reshape(student, [-1]), tf.reshape(teacher, [-1])
        return alpha * tf.square(student - labels) + (1.0 - alpha) * tf.square(student - teacher)
    if kind == "multiclass":
        ids = tf.cast(tf.reshape(labels, [-1]), tf.int32)
        hard = tf.keras.losses.sparse_categorical_crossentropy(ids, student)
        soft_targets = tf.nn.softmax(_log_probabilities(teacher) / temperature)
        soft = tf.keras.losses.categorical_crossentropy(
            soft_targets, _log_probabilities(student) / temperature, from_logits=True)
        return alpha * hard + (1.0 - alpha) * temperature**2 * soft
    labels = tf.cast(tf.reshape(labels, [-1, 1]), tf.float32)
    soft_targets = tf.sigmoid(_logit(teacher) / temperature)
    hard = tf.keras.losses.binary_crossentropy(labels, student)
    soft = tf.keras.losses.binary_crossentropy(soft_targets, _logit(student) / temperature, from_logits=True)
    return alpha * hard + (1.0 - alpha) * temperature**2 * soft


def distill_model(
    teacher: tf.keras.Model,
    train: tf.data.Dataset,
    *,
    build_student: Callable[[], tf.keras.Model],
    temperature: float,
    alpha: float,
    steps: int,
    learning_rate: float,
    seed: int,
    class_weight: dict[int, float] | None = None,
    kind: str = "binary",
) -> tf.keras.Model:
    """A student from `build_student()` trained `steps` batches on the labels and on the frozen teacher's
    predictions (distillation_loss): for a binary model alpha * BCE(label, student) + (1 - alpha) * T^2 *
    BCE(teacher_T, student_T), where x_T = sigmoid(logit(x) / T)."""
    if steps < 1 or temperature <= 0 or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"distillation needs steps >= 1, temperature > 0 and alpha in [0, 1]; got steps={steps}, "
                         f"temperature={temperature}, alpha={alpha}.")
    tf.keras.utils.set_random_seed(seed)
    student = build_student()
    optimizer = tf.keras.optimizers.Adam(learning_rate)
    weights = None if not class_weight else tf.constant([class_weight[c] for c in sorted(class_weight)], tf.float32)
    temperature_t = tf.constant(temperature, tf.float32)

    @tf.function(reduce_retracing=True)
    def train_step(features: dict[str, tf.Tensor], labels: tf.Tensor) -> tf.Tensor:
        teacher_out = teacher(features, training=False)
        with tf.GradientTape() as tape:
            student_out = tf.cast(student(features, training=True), tf.float32)
            per_example = distillation_loss(kind, labels, teacher_out, student_out, temperature_t, alpha)
            if weights is not None:
                # Like Keras' class_weight in the Trainer: each example's loss scaled by its class's weight.
                per_example *= tf.gather(weights, tf.cast(tf.reshape(labels, [-1]), tf.int32))
            loss = tf.reduce_mean(per_example)
            if student.losses:
                loss += tf.add_n(student.losses)
        variables = student.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        return loss

    log_every = max(1, steps // 5)
    done = 0
    for features, labels in train.take(steps):
        loss = train_step(features, labels)
        done += 1
        if done % log_every == 0 or done == steps:
            logging.info("distillation: step %d of %d, loss %.4f", done, steps, float(loss))
    if done < steps:
        logging.warning("distillation: the training data ran out after %d of %d steps", done, steps)
    return student


def _describe(model: tf.keras.Model, metrics: dict[str, float], **pruning: Any) -> ModelFigures:
    """The model's figures: `metrics` as `evaluate` returns them (the task's metrics and the rows), its size and
    sparsity; `pruning`, the pruned model's pruned_from and degradation."""
    figures = dict(metrics)
    rows = int(figures.pop("rows"))
    return ModelFigures(
        metrics=figures,
        rows=rows,
        parameters=int(model.count_params()),
        nonzero_parameters=nonzero_parameters(model),
        gzip_bytes=gzip_size(model),
        dense_units=tuple(int(layer.units) for layer in _dense_layers(model)),
        kernel_sparsity=kernel_sparsity(model),
        **pruning,
    )


def optimize(
    model: tf.keras.Model,
    train: tf.data.Dataset,
    evaluation: tf.data.Dataset,
    options: OptimizeConfig,
    build_student: Callable[[], tf.keras.Model],
    *,
    seed: int = 42,
    class_weight: dict[int, float] | None = None,
    kind: str = "binary",
    metric: str = "auto",
    loss: tf.keras.losses.Loss | None = None,
    label_std: float | None = None,
) -> OptimizationResult:
    """Distils (when options.distill.enabled), then prunes (when options.prune) the trained `model` of the task
    `kind`, whose `loss` fine-tuning minimises and whose `metric` (evaluation.metric) the gate watches; a
    regression's `label_std` goes into the gate's message.

    `options` is the config's optimize section; `train` repeats, `evaluation` is finite. With nothing enabled the
    same model object comes back. Raises OptimizationGateError when pruning worsens the eval metric by more than
    options.max_degradation.
    """
    settings = dataclasses.asdict(options)
    distill = options.distill
    metric = task_metric(kind, metric)
    if not distill.enabled and not options.prune:
        logging.info("optimizer: nothing to do (optimize.prune is false, optimize.distill.enabled is false)")
        return OptimizationResult(model, OptimizationReport(
            kind=kind, metric=metric, settings=settings, summary=OptimizationSummary(output_stage="input"),
            note="nothing done: optimize.prune is false and optimize.distill.enabled is false, so the trained "
                 "model passes through unchanged."))

    report = OptimizationReport(kind=kind, metric=metric, settings=settings,
                                input=_describe(model, evaluate(model, evaluation, kind=kind)))
    logging.info("optimizer: input model eval %s, %d parameters, %d gzipped bytes",
                 describe_figures(report.input.metrics, kind), report.input.parameters, report.input.gzip_bytes)
    current, current_stage = model, "input"

    if distill.enabled:
        logging.info("optimizer: distilling into a student with hidden units %s", distill.hidden_units)
        current = distill_model(
            model, train, build_student=build_student, temperature=distill.temperature, alpha=distill.alpha,
            steps=distill.steps, learning_rate=distill.learning_rate, seed=seed, class_weight=class_weight,
            kind=kind,
        )
        current_stage = "distilled"
        report = dataclasses.replace(report, distilled=_describe(current, evaluate(current, evaluation, kind=kind)),
                                     stages=(*report.stages, "distill"))
        logging.info("optimizer: student eval %s %.4f (teacher %.4f), %d parameters (teacher %d)", metric,
                     report.distilled.metrics[metric], report.input.metrics[metric], report.distilled.parameters,
                     report.input.parameters)

    if options.prune:
        before = report.model(current_stage).metrics[metric]
        pruned_model = prune_model(
            current, train, target_sparsity=options.target_sparsity, steps=options.fine_tune_steps,
            learning_rate=options.learning_rate, seed=seed, class_weight=class_weight, loss=loss,
        )
        metrics = evaluate(pruned_model, evaluation, kind=kind)
        worse, passed = pruning_gate(before, metrics[metric], options.max_degradation,
                                     higher_is_better(kind, metric))
        pruned = _describe(pruned_model, metrics, pruned_from=current_stage, degradation=worse)
        report = dataclasses.replace(report, pruned=pruned, stages=(*report.stages, "prune"))
        after = pruned.metrics[metric]
        logging.info("optimizer: pruned eval %s %.4f (%.4f before pruning), kernel sparsity %s, %d -> %d gzipped "
                     "bytes", metric, after, before, pruned.kernel_sparsity,
                     report.model(current_stage).gzip_bytes, pruned.gzip_bytes)
        if not passed:
            report = dataclasses.replace(report, summary=_summary(report, "input", "pruned"))
            if not (math.isfinite(before) and math.isfinite(after)):
                # No tolerance passes a NaN: naming the limit would send the user to a dead end.
                raise OptimizationGateError(
                    f"the eval {metric} is {before} before pruning and {after} after, so no tolerance can "
                    "pass: the model or the eval rows hold a value that is not a number (a missing label, a NaN "
                    "training loss); check the label column and the Trainer's log.", report)
            raise OptimizationGateError(
                f"pruning to {options.target_sparsity:.0%} sparsity worsened the eval {metric} by "
                f"{worse:.4f} ({before:.4f} to {after:.4f}), more than "
                f"optimize.max_degradation={options.max_degradation}; allow more with optimize.max_degradation "
                "or fine-tune longer with optimize.fine_tune_steps ("
                f"{tolerance_note('optimize.max_degradation', kind, metric, label_std)}).",
                report,
            )
        current, current_stage = pruned_model, "pruned"

    return OptimizationResult(current, dataclasses.replace(report, summary=_summary(report, "input", current_stage)))


def _summary(report: OptimizationReport, first: str, last: str) -> OptimizationSummary:
    keys = (*TASK_METRICS[report.kind], "parameters", "nonzero_parameters", "gzip_bytes")
    return OptimizationSummary(output_stage=last, before={key: report.model(first).figure(key) for key in keys},
                               after={key: report.model(last).figure(key) for key in keys})
