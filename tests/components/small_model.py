"""A small end-to-end model built in-process: synthetic raw rows, TF Transform, a trained Keras model and the
SavedModel exactly as the Trainer exports it. For tests of what comes after the Trainer."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf
import tensorflow_transform as tft
import tensorflow_transform.beam as tft_beam
from tensorflow_transform.tf_metadata import dataset_metadata, metadata_io, schema_utils

from components.features import FeatureLayout, transformed_name
from components.model import build_model, categorical_cardinalities, export_serving_model
from components.transform import preprocessing_fn
from settings.config import TrainingConfig

CUSTOM_CONFIG = {
    "data": {
        "numeric_features": ["fare", "trip_miles", "trip_seconds"],
        "bucket_features": ["lat"],
        "vocab_features": ["payment_type", "tract"],
        "category_features": ["hour", "area"],
        # The training CSV's markers: a request holding one is read as missing by every format.
        "missing_values": ["NA", "-999"],
    },
    "label": {"name": "big_tipper", "column": "tips", "threshold": 0.2, "relative_to": "fare", "positive_value": ""},
    "transform": {"bucket_count": 5, "vocab_size": 100, "oov_buckets": 1},
}
FEATURE_SPEC = {
    "fare": tf.io.FixedLenFeature([1], tf.float32),
    "trip_miles": tf.io.VarLenFeature(tf.float32),
    "trip_seconds": tf.io.VarLenFeature(tf.int64),
    "lat": tf.io.VarLenFeature(tf.float32),
    "payment_type": tf.io.VarLenFeature(tf.string),
    "hour": tf.io.FixedLenFeature([1], tf.int64),
    "tract": tf.io.VarLenFeature(tf.int64),
    "area": tf.io.VarLenFeature(tf.int64),
    "tips": tf.io.FixedLenFeature([1], tf.float32),
}
MISSING = {tf.float32: np.nan, tf.int64: -1, tf.string: ""}


@dataclass
class SmallModel:
    layout: FeatureLayout
    transform_dir: str
    serving_model_dir: str
    model: tf.keras.Model
    columns: dict[str, np.ndarray]  # eval rows as a serving request
    labels: np.ndarray
    train_columns: dict[str, np.ndarray]


def synthetic_rows(n: int, seed: int) -> list[dict]:
    """Taxi-like rows where tipping depends on the payment type, the hour and the fare, with missing values."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        payment = rng.choice(["Credit Card", "Cash", "Mobile", "Unknown"], p=[0.5, 0.35, 0.1, 0.05])
        fare = float(np.float32(rng.gamma(2.0, 6.0) + 3))
        hour = int(rng.integers(0, 24))
        rate = {"Credit Card": 0.25, "Mobile": 0.22, "Cash": 0.02, "Unknown": 0.1}[payment] + 0.004 * (hour - 12)
        row = {
            "fare": [fare],
            "trip_miles": [float(np.float32(fare / 3 + rng.normal()))] if rng.random() > 0.1 else [],
            "trip_seconds": [int(fare * 60 + rng.integers(0, 300))] if rng.random() > 0.1 else [],
            "lat": [float(np.float32(41.8 + rng.normal(0, 0.05)))] if rng.random() > 0.1 else [],
            "payment_type": [payment.encode()] if rng.random() > 0.05 else [],
            "hour": [hour],
            "tract": [int(17031000000 + rng.integers(0, 40) * 100)] if rng.random() > 0.2 else [],
            "area": [int(rng.integers(1, 78))] if rng.random() > 0.1 else [],
            "tips": [float(np.float32(max(0.0, fare * (rate + rng.normal(0, 0.05)))))],
        }
        rows.append(row)
    return rows


def request_columns(rows: list[dict]) -> dict[str, np.ndarray]:
    columns = {}
    for key in FeatureLayout.from_properties(CUSTOM_CONFIG).raw_features:
        dtype = FEATURE_SPEC[key].dtype
        values = [row[key][0] if row[key] else MISSING[dtype] for row in rows]
        if dtype == tf.string:
            columns[key] = np.array([v.decode() if isinstance(v, bytes) else v for v in values], dtype=object)
        else:
            columns[key] = np.array(values, dtype=np.float32 if dtype == tf.float32 else np.int64)
    return columns


def build_small_model(folder: Path, train_rows: int = 3000, eval_rows: int = 1000) -> SmallModel:
    layout = FeatureLayout.from_properties(CUSTOM_CONFIG)
    train, evaluation = synthetic_rows(train_rows, seed=1), synthetic_rows(eval_rows, seed=2)
    # Areas the training split never holds, so every format meets the category's out-of-range id.
    for i, row in enumerate(evaluation[::25]):
        row["area"] = [[78, 200, -3, 0][i % 4]]
    metadata = dataset_metadata.DatasetMetadata(schema_utils.schema_from_feature_spec(FEATURE_SPEC))
    transform_dir = str(folder / "transform")
    with tft_beam.Context(temp_dir=str(folder / "tft_tmp"), force_tf_compat_v1=False):
        (transformed, _), transform_fn = (train, metadata) | tft_beam.AnalyzeAndTransformDataset(
            lambda inputs: preprocessing_fn(inputs, CUSTOM_CONFIG)
        )
        _ = transform_fn | tft_beam.WriteTransformFn(transform_dir)
    metadata_io.write_metadata(metadata, f"{transform_dir}/metadata")
    tft_output = tft.TFTransformOutput(transform_dir)

    training = dataclasses.replace(TrainingConfig(), hidden_units=[32, 16], learning_rate=0.01)
    tf.keras.utils.set_random_seed(0)
    model = build_model([transformed_name(k) for k in layout.numeric], categorical_cardinalities(layout, tft_output),
                        training)
    features = {name: np.array([[row[name]] for row in transformed]) for name in model.input_names}
    labels = np.array([row[layout.label_key] for row in transformed])
    model.fit(features, labels, batch_size=128, epochs=8, verbose=0)
    serving_model_dir = str(folder / "serving_model")
    export_serving_model(model, tft_output, layout, serving_model_dir)
    fares = np.array([row["fare"][0] for row in evaluation])
    tips = np.array([row["tips"][0] for row in evaluation])
    return SmallModel(
        layout=layout,
        transform_dir=transform_dir,
        serving_model_dir=serving_model_dir,
        model=model,
        columns=request_columns(evaluation),
        labels=(tips > np.float32(0.2) * fares).astype(np.int64),
        train_columns=request_columns(train[:300]),
    )
