"""A raw column as Transform gets it (a dense [batch] or [batch, 1] tensor, or a SparseTensor with no entry for a
missing cell) made dense, with its mask of present cells, or cast."""
from __future__ import annotations

from typing import Any

import tensorflow as tf


def dense_and_present(x: tf.Tensor | tf.SparseTensor, default: Any) -> tuple[tf.Tensor, tf.Tensor]:
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


def present_values(x: tf.Tensor | tf.SparseTensor) -> tf.Tensor:
    if isinstance(x, tf.SparseTensor):
        return x.values
    values = tf.reshape(x, [-1])
    return tf.boolean_mask(values, tf.logical_not(tf.math.is_nan(values))) if values.dtype.is_floating else values


def as_float(x: tf.Tensor | tf.SparseTensor) -> tf.Tensor | tf.SparseTensor:
    if isinstance(x, tf.SparseTensor):
        return tf.SparseTensor(x.indices, tf.cast(x.values, tf.float32), x.dense_shape)
    return tf.cast(x, tf.float32)


def as_string(x: tf.Tensor | tf.SparseTensor) -> tf.Tensor | tf.SparseTensor:
    if x.dtype == tf.string:
        return x
    if isinstance(x, tf.SparseTensor):
        return tf.SparseTensor(x.indices, tf.strings.as_string(x.values), x.dense_shape)
    return tf.strings.as_string(x)
