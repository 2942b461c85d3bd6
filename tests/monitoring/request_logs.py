"""A small writer of request logs in serving/server/request_log.py's format, with TF Serving's own protos: PredictionLog
records of PredictRequests (one tensor per raw feature, batch first), in files named as it names them, so that a test
chooses each file's time, writer and contents.
Rows are encoded as serving/clients/ sends them: a missing float is NaN, a missing integer -1, a missing string ""."""
from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow_metadata.proto.v0 import schema_pb2
from tensorflow_serving.apis import prediction_log_pb2

from serving.server.request_log import log_file_name

DTYPES = {schema_pb2.FLOAT: np.float32, schema_pb2.INT: np.int64, schema_pb2.BYTES: object}


def feature_types(schema: schema_pb2.Schema, features: Iterable[str]) -> dict[str, Any]:
    """The numpy dtype a client sends each feature in, from the schema's types."""
    types = {f.name: f.type for f in schema.feature}
    return {name: DTYPES[types[name]] for name in features}


def encode(rows: Sequence[Mapping[str, Any]], types: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """One array per feature over `rows`; None (or NaN) is the feature's missing marker."""
    arrays = {}
    for name, dtype in types.items():
        values = [row.get(name) for row in rows]
        if dtype is object:
            arrays[name] = np.array([b"" if v is None else (v if isinstance(v, bytes) else str(v).encode())
                                     for v in values], dtype=object)
        elif dtype is np.float32:
            arrays[name] = np.array([math.nan if v is None else float(v) for v in values], np.float32)
        else:
            arrays[name] = np.array([-1 if v is None else int(v) for v in values], np.int64)
    return arrays


def prediction_log(inputs: Mapping[str, np.ndarray], version: int, model: str = "taxi", sampling_rate: float = 1.0,
                   signature: str = "serving_default", as_values: bool = False, answered: datetime | None = None
                   ) -> bytes:
    """One serialized PredictionLog; `as_values` writes numbers into the typed value fields instead of
    tensor_content (both are TensorProto encodings a logger may produce); `answered` sets timestamp_secs."""
    log = prediction_log_pb2.PredictionLog()
    spec = log.log_metadata.model_spec
    spec.name, spec.signature_name = model, signature
    # version and version_label are one oneof in ModelSpec: the log names the version that answered.
    spec.version.value = version
    log.log_metadata.sampling_config.sampling_rate = sampling_rate
    if answered is not None:
        log.log_metadata.timestamp_secs = int(answered.timestamp())
    request = log.predict_log.request
    request.model_spec.CopyFrom(spec)
    for name, values in inputs.items():
        tensor = tf.make_tensor_proto(values)
        if as_values and values.dtype != object:
            field = {np.dtype(np.float32): "float_val", np.dtype(np.int64): "int64_val"}[values.dtype]
            tensor.ClearField("tensor_content")
            tensor.ClearField(field)
            getattr(tensor, field).extend(values.tolist())
        request.inputs[name].CopyFrom(tensor)
    rows = len(next(iter(inputs.values())))
    log.predict_log.response.outputs["probabilities"].CopyFrom(tf.make_tensor_proto(np.full(rows, 0.5, np.float32)))
    return log.SerializeToString()


def write_log_file(folder: Path, start: datetime, records: Iterable[bytes], writer: int = 1, seq: int = 0,
                   modified: datetime | None = None) -> Path:
    """A log file of `records`; `modified` sets its modification time (the end of a writer's newest file)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / log_file_name(start.timestamp(), writer, seq)
    with tf.io.TFRecordWriter(str(path)) as f:
        for record in records:
            f.write(record)
    if modified is not None:
        os.utime(path, (modified.timestamp(), modified.timestamp()))
    return path


def request_records(rows: Sequence[Mapping[str, Any]], types: Mapping[str, Any], version: int,
                    rows_per_request: int = 1, **kwargs: Any) -> list[bytes]:
    """`rows` as PredictionLogs of `rows_per_request` rows each."""
    return [prediction_log(encode(rows[i:i + rows_per_request], types), version, **kwargs)
            for i in range(0, len(rows), rows_per_request)]


def csv_rows(path: Path, types: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The rows of a CSV file as a client sends them: the features only, typed, None for an empty cell."""
    import csv

    def value(text: str, dtype: Any) -> Any:
        if text == "":
            return None
        if dtype is object:
            return text.encode()
        return float(text) if dtype is np.float32 else int(float(text))

    with open(path, newline="") as f:
        return [{name: value(row[name], dtype) for name, dtype in types.items()} for row in csv.DictReader(f)]


def statistics_of(rows: Sequence[Mapping[str, Any]], types: Mapping[str, Any], version: int = 1) -> Any:
    """TFDV statistics of `rows` as `mlops monitor` computes them from logged requests."""
    from monitoring.logs import WindowStatistics

    window = WindowStatistics()
    window.add(request_records(rows, types, version))
    return window.statistics(version)
