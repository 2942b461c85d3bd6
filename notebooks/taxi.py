"""The taxi data the notebooks train on: the embedded Chicago taxi sample, the pipeline's features and label,
transformed with the project's own Transform math (z-scores, quantile buckets, vocabulary and category ids).

The pipeline computes these constants with TF Transform on Beam; here NumPy computes them on the training rows
and `components.transform` applies them, so a notebook gets `build_model`'s inputs in a second, not a minute.
Also the timing helpers the notebooks' comparisons share.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import tensorflow as tf

from components.features import transformed_name
from components.transform import bucket_ids, category_ids, z_score
from pipeline.data import EMBEDDED_TAXI_DIR
from settings.config import TrainingConfig, load_config


@dataclass
class TaxiData:
    train: tuple[dict[str, np.ndarray], np.ndarray]  # transformed features ([rows, 1] each), 0/1 labels
    eval: tuple[dict[str, np.ndarray], np.ndarray]
    numeric: list[str]  # transformed names of the float inputs of build_model
    cardinalities: dict[str, int]  # transformed name -> ids the categorical input can take
    training: TrainingConfig  # the default config's training section, as build_model receives it


def training_settings(**changes: Any) -> TrainingConfig:
    """The taxi config's training section with `changes` applied, as the Trainer passes it to build_model."""
    return dataclasses.replace(load_config().training, **changes)


def load_taxi(rows: int | None = None, eval_share: float = 0.2, seed: int = 0) -> TaxiData:
    """The first `rows` rows of the embedded sample, split at random into train and eval, transformed."""
    config = load_config()
    frame = pd.read_csv(EMBEDDED_TAXI_DIR / "data.csv", nrows=rows)
    label = config.label
    labels = (frame[label.column] > label.threshold * frame[label.relative_to]).to_numpy(np.int64)
    order = np.random.default_rng(seed).permutation(len(frame))
    cut = int(len(frame) * (1 - eval_share))
    train_rows, eval_rows = order[:cut], order[cut:]
    columns: dict[str, np.ndarray] = {}
    cardinalities: dict[str, int] = {}
    for key in config.data.numeric_features:
        values = frame[key].to_numpy(np.float32)
        present = values[train_rows][~np.isnan(values[train_rows])]
        mean, std = np.float32(present.mean()), np.float32(present.std())
        filled = np.where(np.isnan(values), mean, values)
        columns[transformed_name(key)] = z_score(tf.constant(filled), mean, std).numpy()
    buckets = config.transform.bucket_count
    for key in config.data.bucket_features:
        values = frame[key].to_numpy(np.float32)
        present = values[train_rows][~np.isnan(values[train_rows])]
        boundaries = np.quantile(present, np.linspace(0, 1, buckets + 1)[1:-1]).astype(np.float32)
        ids = bucket_ids(tf.constant(np.nan_to_num(values)), tf.constant(boundaries)).numpy()
        columns[transformed_name(key)] = np.where(np.isnan(values), buckets, ids)
        cardinalities[transformed_name(key)] = buckets + 1
    for key in config.data.vocab_features:
        text = frame[key].astype("string").fillna("")
        counts = text.iloc[train_rows][text.iloc[train_rows] != ""].value_counts()
        vocabulary = {value: i for i, value in enumerate(counts.index[: config.transform.vocab_size])}
        # Unseen and missing values share the one OOV id, as in the pipeline (transform.oov_buckets: 1).
        columns[transformed_name(key)] = text.map(vocabulary).fillna(len(vocabulary)).to_numpy(np.int64)
        cardinalities[transformed_name(key)] = len(vocabulary) + 1
    for key in config.data.category_features:
        values = frame[key].fillna(-1).to_numpy(np.int64)
        largest_id = max(int(values[train_rows].max()), -1)
        ids = category_ids(tf.constant(values), tf.constant(largest_id, tf.int64)).numpy()
        columns[transformed_name(key)] = ids
        cardinalities[transformed_name(key)] = largest_id + 2

    def take(index: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        return {name: values[index].reshape(-1, 1) for name, values in columns.items()}, labels[index]

    return TaxiData(
        train=take(train_rows),
        eval=take(eval_rows),
        numeric=[transformed_name(k) for k in config.data.numeric_features],
        cardinalities=cardinalities,
        training=config.training,
    )


def median_seconds(function: Callable[[], Any], repeats: int = 7, warmup: int = 1) -> float:
    """Median wall time of `function()` over `repeats` calls after `warmup` untimed ones: robust to a busy machine."""
    for _ in range(warmup):
        function()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def wall_and_cpu_seconds(function: Callable[[], Any], repeats: int = 7, warmup: int = 1) -> tuple[float, float]:
    """Median wall time of `function()` over `repeats` calls after `warmup` untimed ones, and the CPU time (user +
    system, every thread of this process) per timed call. Other programs on the machine stretch the wall time; the
    CPU time is the work the process itself did, which they hardly change, so comparisons are asserted on it."""
    for _ in range(warmup):
        function()
    times = []
    cpu_before = time.process_time()
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return float(np.median(times)), (time.process_time() - cpu_before) / repeats
