"""The Keras model and the Trainer's `run_fn`: training under MultiWorkerMirroredStrategy, then export."""
from __future__ import annotations

import dataclasses
import math
import os
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_transform as tft
from absl import logging
from tfx.components.trainer.fn_args_utils import DataAccessor, FnArgs
from tfx_bsl.tfxio import dataset_options

from components import artifacts
from components.compat import skip_autograph_for_tf_keras
from components.distributed.cluster import worker_role
from components.features import FeatureLayout, transformed_name
from components.specs import TRAINING_KEY
from components.tasks import Task, task_from_transform
from components.transform import read_constants
from settings.config import TrainingConfig, read_section

skip_autograph_for_tf_keras()

# The output a binary model answers with; settings.tasks.OUTPUT_NAMES has every kind's.
SERVING_OUTPUT = "probabilities"
BINARY = Task("binary")
# A category feature's embedding has a row per id up to its largest value; beyond this many (11-digit census tracts,
# say), a vocabulary of the values seen is the smaller table.
MAX_CATEGORY_IDS = 100_000


@tf.keras.utils.register_keras_serializable(package="mlops")
class SparseMacroAUC(tf.keras.metrics.AUC):
    """One-vs-rest AUC of each class, averaged, for integer labels and a softmax output: Keras' multi-label AUC over
    the one-hot labels."""

    def __init__(self, num_labels: int, name: str = "auc", **kwargs: Any):
        kwargs.pop("multi_label", None)
        super().__init__(name=name, multi_label=True, num_labels=num_labels, **kwargs)

    def update_state(self, y_true: tf.Tensor, y_pred: tf.Tensor, sample_weight: tf.Tensor | None = None):
        one_hot = tf.one_hot(tf.cast(tf.reshape(y_true, [-1]), tf.int32), self.num_labels)
        return super().update_state(one_hot, y_pred, sample_weight)


def output_layer(task: Task, x: tf.Tensor) -> tf.Tensor:
    """The model's last layer per task kind, float32 under mixed precision so the output and the loss are stable:
    a sigmoid probability, a softmax over the classes, or a z-score rescaled to the label's units."""
    if task.kind == "multiclass":
        return tf.keras.layers.Dense(task.units, activation="softmax", dtype="float32", name="output")(x)
    if task.kind == "regression":
        z = tf.keras.layers.Dense(1, dtype="float32", name="output")(x)
        # Fixed constants from the Transform: the Dense layer learns z-scores, whatever the label's units.
        return tf.keras.layers.Rescaling(task.label_std, offset=task.label_mean, dtype="float32",
                                         name="label_scale")(z)
    return tf.keras.layers.Dense(1, activation="sigmoid", dtype="float32", name="output")(x)


def task_loss(task: Task) -> tf.keras.losses.Loss:
    if task.kind == "multiclass":
        return tf.keras.losses.SparseCategoricalCrossentropy()
    if task.kind == "regression":
        return tf.keras.losses.MeanSquaredError()
    return tf.keras.losses.BinaryCrossentropy()


def task_keras_metrics(task: Task) -> list[tf.keras.metrics.Metric]:
    if task.kind == "multiclass":
        return [SparseMacroAUC(task.units), tf.keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
    if task.kind == "regression":
        return [tf.keras.metrics.RootMeanSquaredError(name="rmse"), tf.keras.metrics.MeanAbsoluteError(name="mae")]
    return [tf.keras.metrics.AUC(name="auc"), tf.keras.metrics.BinaryAccuracy(name="accuracy")]


def training_objective(task: Task) -> tuple[str, str]:
    """The validation figure early stopping and the Tuner follow: (Keras log name, "max" or "min")."""
    return ("val_rmse", "min") if task.kind == "regression" else ("val_auc", "max")


def save_keras_model(model: tf.keras.Model, model_uri: str) -> str:
    """Saves the Keras model beside the SavedModel of the Model artifact at `model_uri` (any file system); returns
    its path. The file is written locally and copied: tf_keras 2.16 saves a gs:// path to a temporary file only."""
    path = artifacts.keras_model_path(model_uri)
    with tempfile.TemporaryDirectory(prefix="keras-") as folder:
        local = os.path.join(folder, os.path.basename(path))
        model.save(local)
        artifacts.write_bytes(path, artifacts.read_bytes(local))
    return path


def load_keras_model(model_uri: str) -> tf.keras.Model:
    """The Keras model a Trainer or Optimizer wrote into the Model artifact at `model_uri`, uncompiled."""
    path = artifacts.keras_model_path(model_uri)
    if not artifacts.exists(path):
        raise FileNotFoundError(f"{path} is missing: the model was written by an older Trainer; run the pipeline "
                                "again without the cache (--set enable_cache=false).")
    with tempfile.TemporaryDirectory(prefix="keras-") as folder:
        local = os.path.join(folder, os.path.basename(path))
        with open(local, "wb") as f:
            f.write(artifacts.read_bytes(path))
        return tf.keras.models.load_model(local, compile=False)


def categorical_cardinalities(layout: FeatureLayout, tft_output: tft.TFTransformOutput) -> dict[str, int]:
    """Number of distinct ids each categorical input can take (vocabulary + OOV, buckets + missing, or a category's
    0 to its largest id + out of range)."""
    sizes = {transformed_name(k): layout.transform.bucket_count + 1 for k in layout.bucket}
    sizes.update(layout.datetime_cardinalities())
    for key in layout.vocab:
        sizes[transformed_name(key)] = tft_output.vocabulary_size_by_name(key) + layout.transform.oov_buckets
    if layout.category:
        recorded = read_constants(tft_output)
        for key in layout.category:
            largest_id = int(recorded[key][0])
            if largest_id >= MAX_CATEGORY_IDS:
                raise ValueError(f"category feature '{key}' reaches {largest_id} on the training split, too large "
                                 f"for ids (at most {MAX_CATEGORY_IDS - 1}); list it under data.vocab_features.")
            sizes[transformed_name(key)] = largest_id + 2
    return sizes


def _learning_rate(training: TrainingConfig) -> float | tf.keras.optimizers.schedules.LearningRateSchedule:
    lr = training.learning_rate
    if training.lr_schedule == "exponential":
        return tf.keras.optimizers.schedules.ExponentialDecay(lr, training.decay_steps, training.decay_rate)
    if training.lr_schedule == "cosine":
        return tf.keras.optimizers.schedules.CosineDecay(lr, training.decay_steps)
    return lr


def make_optimizer(training: TrainingConfig) -> tf.keras.optimizers.Optimizer:
    lr = _learning_rate(training)
    clip = {"clipnorm": training.clipnorm} if training.clipnorm else {}
    if training.optimizer == "sgd":
        return tf.keras.optimizers.SGD(learning_rate=lr, momentum=training.momentum, **clip)
    return tf.keras.optimizers.Adam(learning_rate=lr, **clip)


def build_model(
    numeric: list[str], cardinalities: dict[str, int], training: TrainingConfig, task: Task = BINARY
) -> tf.keras.Model:
    """A compiled model over transformed features for the task (a binary classifier by default): embeddings for
    ids, an MLP on top, the task's output layer."""
    previous_policy = tf.keras.mixed_precision.global_policy()
    tf.keras.mixed_precision.set_global_policy(training.mixed_precision)
    try:
        inputs = {name: tf.keras.Input(shape=(1,), name=name, dtype=tf.float32) for name in numeric}
        # One numeric input goes in as it is: Keras unwraps a one-tensor list when it clones the model (the
        # Optimizer does), and Concatenate refuses a bare tensor.
        parts = list(inputs.values()) if len(numeric) < 2 else [
            tf.keras.layers.Concatenate(name="numeric")(list(inputs.values()))]
        for name, size in cardinalities.items():
            inputs[name] = tf.keras.Input(shape=(1,), name=name, dtype=tf.int64)
            dim = min(16, max(2, round(math.sqrt(size))))
            embedded = tf.keras.layers.Embedding(size, dim, name=f"{name}_embedding")(inputs[name])
            parts.append(tf.keras.layers.Flatten()(embedded))
        x = tf.keras.layers.Concatenate(name="features")(parts) if len(parts) > 1 else parts[0]
        regularizer = tf.keras.regularizers.L2(training.l2) if training.l2 else None
        for i, units in enumerate(training.hidden_units):
            x = tf.keras.layers.Dense(units, kernel_regularizer=regularizer, name=f"dense_{i}")(x)
            if training.batch_norm:
                x = tf.keras.layers.BatchNormalization(name=f"batch_norm_{i}")(x)
            x = tf.keras.layers.Activation(training.activation, name=f"activation_{i}")(x)
            if training.dropout:
                x = tf.keras.layers.Dropout(training.dropout, name=f"dropout_{i}")(x)
        model = tf.keras.Model(inputs=inputs, outputs=output_layer(task, x))
    finally:
        tf.keras.mixed_precision.set_global_policy(previous_policy)
    optimizer = make_optimizer(training)
    if training.mixed_precision == "mixed_float16":
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
    model.compile(
        optimizer=optimizer,
        loss=task_loss(task),
        metrics=task_keras_metrics(task),
        jit_compile=training.jit_compile,
    )
    return model


def input_fn(
    file_pattern: list[str],
    data_accessor: DataAccessor,
    tft_output: tft.TFTransformOutput,
    label_key: str,
    batch_size: int,
    num_epochs: int | None = None,
    seed: int | None = None,
) -> tf.data.Dataset:
    """(features, label) batches of the transformed examples; repeats forever unless num_epochs is given.

    Under several workers, `batch_size` is the global batch: the strategy splits each batch among the replicas.
    """
    dataset = data_accessor.tf_dataset_factory(
        file_pattern,
        dataset_options.TensorFlowDatasetOptions(
            batch_size=batch_size, label_key=label_key, num_epochs=num_epochs, shuffle_seed=seed
        ),
        tft_output.transformed_metadata.schema,
    )
    options = tf.data.Options()
    # DATA, not FILE: Transform writes few files (one for a small split), often fewer than workers, and FILE
    # sharding would leave workers without data or unbalanced. Under DATA every worker reads all files and keeps
    # its own slice of each global batch, so step k trains on global batch k of the unsharded order, as one worker
    # would. That holds only if every worker reads the same order: hence the shared shuffle seed.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)


def class_weights(dataset: tf.data.Dataset, task: Task = BINARY) -> dict[int, float]:
    """Weights that make every class count equally (total / (classes * rows of the class)), from one pass over
    the (features, label) dataset of a binary or multiclass task."""
    counts = np.zeros(task.units if task.kind == "multiclass" else 2, dtype=np.int64)
    for _, labels in dataset:
        ids = tf.reshape(tf.cast(labels, tf.int64), [-1]).numpy()
        if ids.size and (ids.min() < 0 or ids.max() >= counts.size):
            raise ValueError(f"the training split holds {int(np.sum((ids < 0) | (ids >= counts.size)))} rows without "
                             "a known class (a missing label); make the schema require the label column.")
        counts += np.bincount(ids, minlength=counts.size)
    total = int(counts.sum())
    if task.kind != "multiclass" and (counts == 0).any():
        raise ValueError(f"the training split holds only one class ({counts[1]} positives of {total}); "
                         "check the label settings.")
    if (counts == 0).any():
        empty = [task.classes[i] for i in np.flatnonzero(counts == 0)]
        raise ValueError(f"the training split holds no row of class(es) {', '.join(empty)}; check the label column.")
    return {i: total / (counts.size * float(count)) for i, count in enumerate(counts)}


def _raw_input_specs(tft_output: tft.TFTransformOutput, layout: FeatureLayout) -> dict[str, tf.TensorSpec]:
    raw_spec = tft_output.raw_feature_spec()
    return {key: tf.TensorSpec([None], raw_spec[key].dtype, name=key) for key in layout.raw_features}


def raw_tensors_to_parsed(
    tensors: dict[str, tf.Tensor], tft_output: tft.TFTransformOutput, missing_values: Sequence[str] = ()
) -> dict[str, tf.Tensor | tf.SparseTensor]:
    """Turns one value per feature into what tf.Example parsing would give. Optional features become sparse,
    and a missing value is NaN for floats, '' for strings and -1 for integers, or one of `missing_values` (the
    training CSV's markers, which ExampleGen read as empty cells)."""
    from components.exporter.preprocessing import marker_numbers

    markers = [m.strip() for m in missing_values if m.strip()]
    raw_spec = tft_output.raw_feature_spec()
    parsed = {}
    for key, value in tensors.items():
        spec = raw_spec[key]
        if isinstance(spec, tf.io.FixedLenFeature):
            parsed[key] = tf.reshape(value, [-1, 1])
            continue
        if value.dtype == tf.string:
            present = tf.not_equal(value, "")
            gaps = [tf.equal(tf.strings.strip(value), marker) for marker in markers]
        elif value.dtype.is_floating:
            present = tf.logical_not(tf.math.is_nan(value))
            gaps = [tf.equal(value, tf.constant(n, value.dtype)) for n in marker_numbers(markers, integer=False)]
        else:
            present = tf.not_equal(value, -1)
            gaps = [tf.equal(value, tf.constant(int(n), value.dtype)) for n in marker_numbers(markers, integer=True)]
        for gap in gaps:
            present = tf.logical_and(present, tf.logical_not(gap))
        rows = tf.where(present)
        indices = tf.concat([rows, tf.zeros_like(rows)], axis=1)
        parsed[key] = tf.SparseTensor(indices, tf.boolean_mask(value, present), [tf.shape(value, tf.int64)[0], 1])
    return parsed


def model_output(task: Task, output: tf.Tensor) -> tf.Tensor:
    """The Keras model's output as every format answers it: [rows] (binary, regression) or [rows, classes]."""
    return tf.reshape(output, [-1, task.units] if task.kind == "multiclass" else [-1])


def serving_outputs(task: Task, prediction: tf.Tensor) -> dict[str, tf.Tensor]:
    """The SavedModel's outputs from `prediction` (model_output): binary `probabilities` [rows]; multiclass
    `probabilities` [rows, classes], the predicted `class` name [rows] and the `classes` names [rows, classes] that
    the probabilities belong to; regression `value` [rows]."""
    if task.kind != "multiclass":
        return {task.output_name: prediction}
    classes = tf.constant(list(task.classes))
    return {
        task.output_name: prediction,
        "class": tf.gather(classes, tf.argmax(prediction, axis=1)),
        "classes": tf.tile(classes[tf.newaxis, :], [tf.shape(prediction)[0], 1]),
    }


class ServingModule(tf.Module):
    """Holds the model and the Transform layer so that both are saved with the signatures."""

    def __init__(self, model: tf.keras.Model, tft_output: tft.TFTransformOutput, layout: FeatureLayout,
                 task: Task = BINARY, decision_threshold: float | None = None):
        super().__init__()
        self.model = model
        if decision_threshold is not None:
            # Saved with the model: tf.saved_model.load(path).decision_threshold (components/calibration.py).
            self.decision_threshold = tf.Variable(decision_threshold, trainable=False, dtype=tf.float32,
                                                  name="decision_threshold")
        self.tft_layer = tft_output.transform_features_layer()
        self._tft_output = tft_output
        self._layout = layout
        self._task = task
        self._input_names = list(model.input_names)
        self._label_columns = set(layout.label_columns)

    def _predict(self, parsed: dict[str, Any]) -> tf.Tensor:
        transformed = self.tft_layer(parsed)
        features = {name: transformed[name] for name in self._input_names}
        return model_output(self._task, self.model(features))

    # The signatures are plain tensor code (Python branches only on settings and dtypes): without AutoGraph's source
    # conversion of the Keras and Transform call chain, the first export in a process takes seconds less.
    def serving_default(self) -> tf.types.experimental.ConcreteFunction:
        @tf.function(autograph=False, input_signature=[_raw_input_specs(self._tft_output, self._layout)])
        def serve_raw(features):
            return serving_outputs(self._task, self._predict(
                raw_tensors_to_parsed(features, self._tft_output, self._layout.data.missing_values)))

        return serve_raw.get_concrete_function()

    def serving_examples(self) -> tf.types.experimental.ConcreteFunction:
        """TFMA's signature: the numeric output alone (probabilities or value)."""
        raw_spec = {k: v for k, v in self._tft_output.raw_feature_spec().items() if k not in self._label_columns}

        @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
        def serve_examples(serialized):
            return {self._task.output_name: self._predict(tf.io.parse_example(serialized, raw_spec))}

        return serve_examples.get_concrete_function()

    def transform_features(self) -> tf.types.experimental.ConcreteFunction:
        raw_spec = self._tft_output.raw_feature_spec()

        @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
        def transform(serialized):
            return self.tft_layer(tf.io.parse_example(serialized, raw_spec))

        return transform.get_concrete_function()


def export_serving_model(
    model: tf.keras.Model, tft_output: tft.TFTransformOutput, layout: FeatureLayout, export_dir: str,
    task: Task = BINARY, decision_threshold: float | None = None,
) -> None:
    """SavedModel with `serving_default` (raw named features), `serving_examples` (tf.Example, for TFMA)
    and `transform_features` (TFMA's preprocessing function); a binary model's chosen `decision_threshold`, when
    given, is saved as its `decision_threshold` variable."""
    # Keras saves its metrics' running totals with the model: zeroed, the same weights make the same bytes, which
    # is how the Publisher knows a re-run's model from a new one (serving.repository.base.content_digest).
    model.reset_metrics()
    module = ServingModule(model, tft_output, layout, task, decision_threshold)
    signatures = {
        "serving_default": module.serving_default(),
        "serving_examples": module.serving_examples(),
        "transform_features": module.transform_features(),
    }
    tf.saved_model.save(module, export_dir, signatures=signatures)


class ThroughputLogger(tf.keras.callbacks.Callback):
    """Logs each epoch's time (its training steps and the validation that ends it) and the global examples per
    second it trained, the figure benchmarks/distributed_training.py compares across worker counts."""

    def __init__(self, global_batch: int, steps_per_epoch: int):
        super().__init__()
        self._examples = global_batch * steps_per_epoch
        self._global_batch, self._steps = global_batch, steps_per_epoch
        self._started = 0.0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._started = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        seconds = time.perf_counter() - self._started
        logging.info("epoch %d: %d steps of %d examples in %.2fs, %.0f examples/s", epoch + 1, self._steps,
                     self._global_batch, seconds, self._examples / seconds)


class NonFiniteLoss(ValueError):
    """The training loss became NaN or infinite: the model learned nothing usable."""


def check_finite_loss(loss: Any, epoch: int, task: Task) -> None:
    """Raises NonFiniteLoss, in one sentence naming the likely cause, when the epoch's training loss is not
    finite."""
    if loss is None or math.isfinite(float(loss)):
        return
    cause = ("a missing or infinite label value (a regression label must be a number in every row)"
             if task.kind == "regression" else "an infinite feature value or too high a learning rate")
    raise NonFiniteLoss(f"the training loss is {float(loss)} after epoch {epoch + 1}, so the model learned nothing; "
                        f"the likely cause is {cause}: check the label and feature columns, or lower "
                        "training.learning_rate (training.clipnorm caps the steps).")


class FiniteLossCheck(tf.keras.callbacks.Callback):
    """Stops training at the first epoch whose loss is NaN or infinite, instead of reporting a useless model as
    trained."""

    def __init__(self, task: Task):
        super().__init__()
        self._task = task

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        check_finite_loss((logs or {}).get("loss"), epoch, self._task)


def apply_hyperparameters(training: TrainingConfig, hyperparameters: dict[str, Any] | None) -> TrainingConfig:
    """Training settings with the Tuner's best values (layer width, depth, learning rate) put in."""
    if not hyperparameters:
        return training
    import keras_tuner

    values = keras_tuner.HyperParameters.from_config(hyperparameters).values
    return dataclasses.replace(
        training,
        hidden_units=[int(values["units"] * 0.5**i) or 1 for i in range(int(values["depth"]))],
        learning_rate=float(values["learning_rate"]),
    )


def write_training_history(model_uri: str, history: tf.keras.callbacks.History, training: TrainingConfig,
                           task: Task) -> str:
    """The per-epoch figures Keras logged (loss and the task's metrics, train and `val_`), the epochs' numbers (a
    worker group restarted by BackupAndRestore logs only the epochs after the last backup) and the settings the
    model trained with, as JSON at the root of the Model artifact at `model_uri`; returns its path."""
    monitor, mode = training_objective(task)
    path = artifacts.join(model_uri, artifacts.TRAINING_HISTORY_JSON)
    artifacts.write_json(path, {
        "epochs": {name: [float(v) for v in values] for name, values in history.history.items()},
        "epoch_numbers": [int(epoch) + 1 for epoch in history.epoch],
        "monitor": monitor,
        "mode": mode,
        "settings": {name: getattr(training, name) for name in (
            "hidden_units", "learning_rate", "lr_schedule", "optimizer", "batch_size", "train_steps",
            "steps_per_epoch", "dropout", "l2", "batch_norm", "activation", "class_weights")},
    })
    return path


def run_fn(fn_args: FnArgs) -> None:
    """TFX Trainer entry point; the same function runs in every worker of a multi-worker job.

    Only the chief writes the SavedModel and TensorBoard logs where TFX expects them; the other workers write
    theirs (saving runs collective ops, so every worker must save) to a temporary folder removed afterwards.
    """
    layout = FeatureLayout.from_properties(fn_args.custom_config)
    training = apply_hyperparameters(read_section(fn_args.custom_config, TRAINING_KEY, TrainingConfig),
                                     fn_args.hyperparameters)
    tft_output = tft.TFTransformOutput(fn_args.transform_output)
    task = task_from_transform(layout.label, tft_output)
    # TF_CONFIG is MultiWorkerMirroredStrategy's contract (set by the local launcher or the training operator),
    # the one environment variable module code reads; absent, this process is the only worker and the chief.
    role = worker_role(os.environ.get("TF_CONFIG"))
    # The same seed everywhere: initial weights (the chief's are broadcast anyway) and, above all, the input order.
    tf.keras.utils.set_random_seed(training.seed)

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    replicas = strategy.num_replicas_in_sync
    global_batch = training.batch_size
    if global_batch % replicas:
        raise ValueError(f"training.batch_size ({global_batch}) is the global batch and must be a multiple of the "
                         f"{replicas} replicas; change training.batch_size or training.workers.")
    # The learning rate and the number of steps are those of the global batch, whatever the number of workers.
    logging.info("worker %d of %d (chief: %s): %d replicas, global batch %d, %d per replica", role.index,
                 role.workers, role.is_chief, replicas, global_batch, global_batch // replicas)
    seed = training.seed
    train = input_fn(fn_args.train_files, fn_args.data_accessor, tft_output, layout.label_key, global_batch, seed=seed)
    evaluation = input_fn(
        fn_args.eval_files, fn_args.data_accessor, tft_output, layout.label_key, global_batch, seed=seed
    )
    weights = None
    if training.class_weights and task.kind != "regression":
        weights = class_weights(
            input_fn(fn_args.train_files, fn_args.data_accessor, tft_output, layout.label_key, 1024, num_epochs=1),
            task,
        )
        logging.info("class weights from the label distribution: %s", weights)

    with strategy.scope():
        model = build_model(
            [transformed_name(k) for k in layout.model_numeric], categorical_cardinalities(layout, tft_output),
            training, task,
        )
    model.summary(print_fn=logging.info)

    scratch = None if role.is_chief else artifacts.scratch_dir(fn_args.model_run_dir, role.index)
    try:
        steps_per_epoch = min(training.steps_per_epoch, fn_args.train_steps)
        monitor, mode = training_objective(task)
        epochs = max(1, math.ceil(fn_args.train_steps / steps_per_epoch))
        callbacks = [
            FiniteLossCheck(task),
            ThroughputLogger(global_batch, steps_per_epoch),
            # Every epoch end: a worker group that dies and restarts resumes from the last epoch, not from step 0.
            # All workers use the same folder; tf_keras lets only the chief write into it.
            tf.keras.callbacks.BackupAndRestore(backup_dir=artifacts.backup_dir(fn_args.model_run_dir)),
            tf.keras.callbacks.EarlyStopping(
                monitor=monitor, mode=mode, patience=training.early_stopping_patience, restore_best_weights=True
            ),
            tf.keras.callbacks.TensorBoard(
                log_dir=fn_args.model_run_dir if scratch is None else artifacts.join(scratch, "tensorboard"),
                update_freq="epoch",
            ),
        ]
        history = model.fit(
            train,
            epochs=epochs,
            steps_per_epoch=steps_per_epoch,
            validation_data=evaluation,
            validation_steps=fn_args.eval_steps,
            class_weight=weights,
            callbacks=callbacks,
            verbose=2,
        )
        export_dir = fn_args.serving_model_dir if scratch is None else artifacts.join(scratch, "model")
        export_serving_model(model, tft_output, layout, export_dir, task)
        # serving_model_dir is <model artifact>/Format-Serving; the Keras model goes beside it. Like the SavedModel,
        # every worker saves it (collective ops), the others into their scratch folder.
        save_keras_model(model, artifacts.parent(fn_args.serving_model_dir) if scratch is None else scratch)
        if scratch is None:
            write_training_history(artifacts.parent(fn_args.serving_model_dir), history,
                                   dataclasses.replace(training, train_steps=fn_args.train_steps), task)
            # Training ended normally: tf_keras emptied the backup; nothing is left to resume.
            artifacts.remove_tree(artifacts.backup_dir(fn_args.model_run_dir))
    finally:
        if scratch is not None:
            artifacts.remove_tree(scratch)
