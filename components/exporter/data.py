"""Raw rows for the Exporter: eval rows in the request form with their labels, and training rows for int8."""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from components.artifacts import read_records
from components.exporter.export import EvalData
from settings.config import ExportConfig


def request_columns(serialized: list[bytes], raw_feature_spec: dict[str, Any], features: list[str]) -> dict[str, Any]:
    """One array per feature, as a serving request: a missing value is NaN, '' or -1 (see ServingModule)."""
    parsed = tf.io.parse_example(tf.constant(serialized), {k: raw_feature_spec[k] for k in features})
    columns = {}
    for key in features:
        value = parsed[key]
        dtype = raw_feature_spec[key].dtype
        missing = {tf.float32: np.nan, tf.int64: -1, tf.string: b""}[dtype]
        if isinstance(value, tf.SparseTensor):
            value = tf.sparse.to_dense(tf.sparse.reset_shape(value, [len(serialized), 1]), default_value=missing)
        array = value.numpy().reshape(-1)
        if dtype == tf.string:
            array = np.array([v.decode("utf-8") for v in array], dtype=object)
        columns[key] = array
    return columns


def load_eval_data(
    eval_dir: str,
    train_dir: str,
    serving_model_dir: str,
    raw_feature_spec: dict[str, Any],
    features: list[str],
    label_key: str,
    options: ExportConfig,
) -> EvalData:
    """Eval rows and their labels (computed by the SavedModel's own `transform_features`), plus training rows."""
    serialized = read_records(eval_dir, options.eval_rows)
    transform = tf.saved_model.load(serving_model_dir).signatures["transform_features"]
    labels = transform(examples=tf.constant(serialized))[label_key].numpy().reshape(-1)
    return EvalData(
        columns=request_columns(serialized, raw_feature_spec, features),
        labels=labels,
        representative=request_columns(
            read_records(train_dir, options.representative_rows), raw_feature_spec, features
        ),
    )
