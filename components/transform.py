"""The Transform component's `preprocessing_fn`: the graph that is baked into every exported model."""
from __future__ import annotations

from typing import Any

import tensorflow as tf
import tensorflow_transform as tft

from components.features import FeatureLayout, transformed_name
from pipeline.config import LabelConfig

# The vocabulary file holding every analyzer result that is not a vocabulary itself (see record_constants).
CONSTANTS_VOCABULARY = "transform_constants"
# A multiclass label's classes, in the order of the label ids and the model's probabilities.
CLASSES_VOCABULARY = "label_classes"
# The entry of the recorded constants holding a regression label's mean and standard deviation.
LABEL_CONSTANTS = "__label__"


def _dense_and_present(x: tf.Tensor | tf.SparseTensor, default: Any) -> tuple[tf.Tensor, tf.Tensor]:
    """Makes a [batch] dense tensor, filling missing cells with `default`, and a [batch] mask of present cells."""
    if isinstance(x, tf.SparseTensor):
        shape = [x.dense_shape[0], 1]
        dense = tf.sparse.to_dense(tf.SparseTensor(x.indices, x.values, shape), default_value=default)
        present = tf.sparse.to_dense(
            tf.SparseTensor(x.indices, tf.ones_like(x.values, dtype=tf.bool), shape), default_value=False
        )
        return tf.squeeze(dense, axis=1), tf.squeeze(present, axis=1)
    dense = tf.reshape(x, [-1])
    if dense.dtype.is_floating:
        # A serving request marks a missing float with NaN, also for features the CSV always fills.
        present = tf.logical_not(tf.math.is_nan(dense))
        return tf.where(present, dense, tf.cast(default, dense.dtype)), present
    return dense, tf.ones_like(dense, dtype=tf.bool)


def _present_values(x: tf.Tensor | tf.SparseTensor) -> tf.Tensor:
    if isinstance(x, tf.SparseTensor):
        return x.values
    values = tf.reshape(x, [-1])
    return tf.boolean_mask(values, tf.logical_not(tf.math.is_nan(values))) if values.dtype.is_floating else values


def _as_float(x: tf.Tensor | tf.SparseTensor) -> tf.Tensor | tf.SparseTensor:
    if isinstance(x, tf.SparseTensor):
        return tf.SparseTensor(x.indices, tf.cast(x.values, tf.float32), x.dense_shape)
    return tf.cast(x, tf.float32)


def _as_string(x: tf.Tensor | tf.SparseTensor) -> tf.Tensor | tf.SparseTensor:
    if x.dtype == tf.string:
        return x
    if isinstance(x, tf.SparseTensor):
        return tf.SparseTensor(x.indices, tf.strings.as_string(x.values), x.dense_shape)
    return tf.strings.as_string(x)


def compute_label(inputs: dict[str, Any], label: LabelConfig) -> tf.Tensor:
    """The binary label as int64 [batch]: column > threshold * relative_to, or column == positive_value."""
    if label.kind == "multiclass":
        return class_ids(inputs[label.column])
    if label.kind == "regression":
        return regression_label(inputs[label.column])
    if label.positive_value:
        column, present = _dense_and_present(_as_string(inputs[label.column]), "")
        return tf.cast(tf.logical_and(present, tf.equal(column, label.positive_value)), tf.int64)
    column, present = _dense_and_present(_as_float(inputs[label.column]), 0.0)
    threshold = tf.constant(label.threshold, tf.float32)
    if label.relative_to:
        base, base_present = _dense_and_present(_as_float(inputs[label.relative_to]), 0.0)
        present = tf.logical_and(present, base_present)
        threshold = threshold * base
    return tf.cast(tf.logical_and(present, column > threshold), tf.int64)


def class_ids(column: tf.Tensor | tf.SparseTensor) -> tf.Tensor:
    """A multiclass label as int64 class ids [batch]: the classes are a vocabulary of the column's values (its text
    for an integer column), ordered by their fingerprint, so the order depends only on which classes there are,
    not on how often each occurs. A missing value or a class the training split lacks gets -1."""
    text, present = _dense_and_present(_as_string(column), "")
    # A missing label is no class: the Trainer refuses such rows instead of learning an empty class name.
    classes = tft.vocabulary(tf.boolean_mask(text, present), vocab_filename=CLASSES_VOCABULARY,
                             fingerprint_shuffle=True)
    return tft.apply_vocabulary(text, classes, default_value=-1)


def regression_label(column: tf.Tensor | tf.SparseTensor) -> tf.Tensor:
    """A regression label as float32 [batch] (NaN where missing: the schema should require the column)."""
    values, _ = _dense_and_present(_as_float(column), float("nan"))
    return values


def label_constants(label: LabelConfig, values: tf.Tensor) -> dict[str, tf.Tensor]:
    """What the model needs to know about the label beyond its values: a regression label's mean and standard
    deviation over the training split (the model predicts z-scores and rescales them)."""
    if label.kind != "regression":
        return {}
    present = tf.boolean_mask(values, tf.logical_not(tf.math.is_nan(values)))
    return {LABEL_CONSTANTS: tf.stack([tft.mean(present), tf.sqrt(tft.var(present))])}


def record_constants(constants: dict[str, tf.Tensor], like: tf.Tensor) -> None:
    """Writes analyzer results (feature name -> float32 tensor) to a file of the Transform output, so that runtimes
    without TF Transform (TFLite, ONNX, TF.js) repeat this step exactly (components/exporter/preprocessing.py).

    A vocabulary is the only analyzer result TF Transform writes as a file. Every row (shaped like `like`) carries
    the same token, `base64(name)=base64(serialized tensor)` pairs joined by commas, so the file holds that token.
    """
    pairs = [
        tf.strings.join([tf.io.encode_base64(name), "=", tf.io.encode_base64(tf.io.serialize_tensor(value))])
        for name, value in sorted(constants.items())
    ]
    token = tf.strings.reduce_join(tf.stack(pairs), separator=",")
    tft.vocabulary(tf.fill(tf.shape(like)[:1], token), vocab_filename=CONSTANTS_VOCABULARY)


def z_score(x: tf.Tensor, mean: tf.Tensor, std: tf.Tensor) -> tf.Tensor:
    return tf.where(std > 0, (x - mean) / tf.where(std > 0, std, 1.0), x - mean)


def bucket_ids(x: tf.Tensor, boundaries: tf.Tensor) -> tf.Tensor:
    """Bucket i holds boundaries[i-1] <= x < boundaries[i]: the number of boundaries at or below x."""
    return tf.reduce_sum(tf.cast(x[:, tf.newaxis] >= boundaries[tf.newaxis, :], tf.int64), axis=1)


def category_ids(x: tf.Tensor, largest_id: tf.Tensor) -> tf.Tensor:
    """Integer values used as ids: 0 to largest_id stay as they are; missing (filled with -1), negative and larger
    values get the one out-of-range id, largest_id + 1."""
    return tf.where(tf.logical_and(x >= 0, x <= largest_id), x, largest_id + 1)


def preprocessing_fn(inputs: dict[str, Any], custom_config: dict[str, Any]) -> dict[str, tf.Tensor]:
    """Numeric: missing -> mean, then z-score. Coordinates: quantile buckets plus one bucket for missing.
    Strings and ids: vocabulary of the top values plus OOV buckets, missing -> ''. Integer categories: the value
    is the id, up to the training split's largest, plus one id for anything else. Label: computed here, per
    label.kind (0/1, a class id, or the number)."""
    layout = FeatureLayout.from_properties(custom_config)
    options = layout.transform
    outputs, constants = {}, {}
    for key in layout.numeric:
        x = _as_float(inputs[key])
        present = _present_values(x)
        mean = tft.mean(present)
        filled, _ = _dense_and_present(x, mean)
        # Missing cells are filled with the mean: the mean stays, the variance shrinks by present / all rows.
        # Computed from the present values in one pass, so the constants need no second analysis phase.
        rows = tf.shape(x)[0] if isinstance(x, tf.Tensor) else x.dense_shape[0]
        share = tf.cast(tft.size(present), tf.float32) / tf.cast(tft.size(tf.ones([rows])), tf.float32)
        std = tf.sqrt(tft.var(present) * share)
        name = transformed_name(key)
        outputs[name] = z_score(filled, mean, std)
        constants[key] = tf.stack([mean, mean, std])
    for key in layout.bucket:
        x = _as_float(inputs[key])
        boundaries = tf.reshape(
            tft.quantiles(_present_values(x), num_buckets=options.bucket_count, epsilon=0.01), [-1]
        )
        filled, present = _dense_and_present(x, 0.0)
        name = transformed_name(key)
        outputs[name] = tf.where(present, bucket_ids(filled, boundaries), tf.cast(options.bucket_count, tf.int64))
        constants[key] = boundaries
    for key in layout.vocab:
        filled, _ = _dense_and_present(_as_string(inputs[key]), "")
        outputs[transformed_name(key)] = tft.compute_and_apply_vocabulary(
            filled, top_k=options.vocab_size, num_oov_buckets=options.oov_buckets, vocab_filename=key
        )
    for key in layout.category:
        values = tf.cast(_present_values(inputs[key]), tf.int64)
        # A combine analyzer, computed in the same pass as the means and quantiles: no vocabulary phase. The -1
        # keeps each batch non-empty; with no value of 0 or more in the training split, every row gets id 0.
        largest_id = tft.max(tf.concat([values, tf.constant([-1], tf.int64)], axis=0))
        filled, _ = _dense_and_present(inputs[key], tf.constant(-1, inputs[key].dtype))
        outputs[transformed_name(key)] = category_ids(tf.cast(filled, tf.int64), largest_id)
        constants[key] = tf.reshape(tf.cast(largest_id, tf.float32), [1])
    outputs[layout.label_key] = compute_label(inputs, layout.label)
    constants.update(label_constants(layout.label, outputs[layout.label_key]))
    if constants:
        record_constants(constants, outputs[layout.label_key])
    return outputs


def read_constants(tft_output: tft.TFTransformOutput) -> dict[str, list[float]]:
    """The analyzer results record_constants wrote into a Transform output, by feature name."""
    import base64

    try:
        (token,) = tft_output.vocabulary_by_name(CONSTANTS_VOCABULARY)
    except (ValueError, OSError):
        raise ValueError("the Transform output holds no transform_constants file: it was made by an older "
                         "preprocessing_fn; run the pipeline again with --set enable_cache=false.") from None
    recorded = {}
    for pair in token.split(b","):
        name, value = (base64.urlsafe_b64decode(part + b"=" * (-len(part) % 4)) for part in pair.split(b"="))
        recorded[name.decode("utf-8")] = tf.io.parse_tensor(value, tf.float32).numpy().reshape(-1).tolist()
    return recorded
