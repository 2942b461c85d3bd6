"""The label rule, in its two forms side by side: in TensorFlow (compute_label, run by Transform inside every exported
model's graph) and in Python over a tf.Example (label_class, with which ExampleGen puts each row in its class before
there is a graph). tests/components/test_label_rule.py runs both over the same rows."""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_transform as tft

from components.tensors import as_float, as_string, dense_and_present
from settings.config import LabelConfig

# A multiclass label's classes, in the order of the label ids and the model's probabilities.
CLASSES_VOCABULARY = "label_classes"


def compute_label(inputs: dict[str, Any], label: LabelConfig) -> tf.Tensor:
    """The binary label as int64 [batch]: column > threshold * relative_to, or column == positive_value."""
    if label.kind == "multiclass":
        return class_ids(inputs[label.column])
    if label.kind == "regression":
        return regression_label(inputs[label.column])
    if label.positive_value:
        column, present = dense_and_present(as_string(inputs[label.column]), "")
        return tf.cast(tf.logical_and(present, tf.equal(column, label.positive_value)), tf.int64)
    column, present = dense_and_present(as_float(inputs[label.column]), 0.0)
    threshold = tf.constant(label.threshold, tf.float32)
    if label.relative_to:
        base, base_present = dense_and_present(as_float(inputs[label.relative_to]), 0.0)
        present = tf.logical_and(present, base_present)
        threshold = threshold * base
    return tf.cast(tf.logical_and(present, column > threshold), tf.int64)


def class_texts(column: tf.Tensor | tf.SparseTensor) -> tuple[tf.Tensor, tf.Tensor]:
    """A multiclass label's class names [batch] (the text of an integer) and the mask of rows that hold one."""
    return dense_and_present(as_string(column), "")


def class_ids(column: tf.Tensor | tf.SparseTensor) -> tf.Tensor:
    """A multiclass label as int64 class ids [batch]: the classes are a vocabulary of the column's values (its text
    for an integer column), ordered by their fingerprint, so the order depends only on which classes there are,
    not on how often each occurs. A missing value or a class the training split lacks gets -1."""
    text, present = class_texts(column)
    # A missing label is no class: the Trainer refuses such rows instead of learning an empty class name.
    classes = tft.vocabulary(tf.boolean_mask(text, present), vocab_filename=CLASSES_VOCABULARY,
                             fingerprint_shuffle=True)
    return tft.apply_vocabulary(text, classes, default_value=-1)


def regression_label(column: tf.Tensor | tf.SparseTensor) -> tf.Tensor:
    """A regression label as float32 [batch] (NaN where missing: the schema should require the column)."""
    values, _ = dense_and_present(as_float(column), float("nan"))
    return values


def first_value(example: tf.train.Example, name: str) -> Any:
    """The first value of a feature, or None when the row has none."""
    if not name or name not in example.features.feature:
        return None
    feature = example.features.feature[name]
    kind = feature.WhichOneof("kind")
    values = getattr(feature, kind).value if kind else []
    return values[0] if len(values) else None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def label_class(example: tf.train.Example, label: LabelConfig) -> str:
    """The class of a row's label computed from its raw columns by compute_label's rule, in Python (float32, and a
    row missing a cell the rule reads is negative): "0"/"1" for binary, the label's value (class_texts) for
    multiclass."""
    value = first_value(example, label.column)
    if label.kind == "multiclass":
        return "" if value is None else _text(value)
    if label.positive_value:
        return "1" if value is not None and _text(value) == label.positive_value else "0"
    if value is None or isinstance(value, bytes):
        return "0"
    threshold = np.float32(label.threshold)
    if label.relative_to:
        base = first_value(example, label.relative_to)
        if base is None or isinstance(base, bytes):
            return "0"
        threshold = threshold * np.float32(base)
    return "1" if np.float32(value) > threshold else "0"
