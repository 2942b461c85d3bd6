"""SavedModel warm-up as TF Serving runs it (tensorflow_serving/servables/tensorflow/saved_model_warmup_util.cc,
RunSavedModelWarmup): the PredictionLogs in a version's `assets.extra/tf_serving_warmup_requests` are each run once
before the version is AVAILABLE, so that its first users do not pay TensorFlow's lazy initialization (a version's
first answer took 0.16 s here, the next ones 1 ms). The Exporter writes the file (`write_warmup_requests`), so the
same SavedModel warms up in TF Serving on a cluster and in `mlops serve`.
"""
from __future__ import annotations

import logging
import posixpath
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import tensorflow as tf
from google.protobuf.message import DecodeError
from tensorflow_serving.apis import prediction_log_pb2

from serving.server.errors import ServingRequestError, invalid_argument
from serving.server.servable import ServableLoadError, ServableVersion, load_servable_version, read_signature_defs

logger = logging.getLogger(__name__)

# WarmupConsts::kRequestsFileName, under the SavedModel's assets.extra (saved_model_warmup_util.h).
WARMUP_FILE = posixpath.join("assets.extra", "tf_serving_warmup_requests")
# WarmupConsts::kMaxNumRecords: TF Serving refuses a file with more.
MAX_WARMUP_RECORDS = 1000
# One row, as most requests come, and a batch: a function's first batched call costs again (25 ms here), later
# batch sizes do not.
WARMUP_BATCH_SIZES = (1, 8)
SIGNATURE = "serving_default"


def write_warmup_requests(export_dir: str, rows: Mapping[str, np.ndarray],
                          batch_sizes: Sequence[int] = WARMUP_BATCH_SIZES) -> int:
    """Writes `export_dir`/assets.extra/tf_serving_warmup_requests: one Predict request of serving_default per batch
    size, made of the first rows of `rows` (the signature's raw inputs, as clients send them); returns how many
    requests it holds."""
    signature = read_signature_defs(Path(export_dir)).signature_def[SIGNATURE]
    available = len(next(iter(rows.values())))
    sizes = sorted({min(size, available) for size in batch_sizes if available})
    path = posixpath.join(export_dir, WARMUP_FILE)
    tf.io.gfile.makedirs(posixpath.dirname(path))
    with tf.io.TFRecordWriter(path) as writer:
        for size in sizes:
            log = prediction_log_pb2.PredictionLog()
            request = log.predict_log.request
            request.model_spec.signature_name = SIGNATURE
            for name, info in sorted(signature.inputs.items()):
                dtype = tf.dtypes.as_dtype(info.dtype)
                values = np.asarray(rows[name][:size])
                if dtype != tf.string:
                    values = values.astype(dtype.as_numpy_dtype)
                request.inputs[name].CopyFrom(tf.make_tensor_proto(values, dtype))
            writer.write(log.SerializeToString())
    return len(sizes)


def warm_up(servable: ServableVersion) -> int:
    """Runs the version's warm-up requests, as TF Serving does before it serves the version; returns how many ran
    (0 without a warm-up file). Raises ServableLoadError, as TF Serving fails the load, for a file that is not
    TFRecords of PredictionLogs, has more than MAX_WARMUP_RECORDS, or holds a request the model refuses."""
    path = posixpath.join(servable.path, WARMUP_FILE)
    if not tf.io.gfile.exists(path):
        return 0
    count = 0
    try:
        for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
            count += 1
            if count > MAX_WARMUP_RECORDS:
                raise ServableLoadError("INVALID_ARGUMENT", f"Number of warmup records exceeds the maximum "
                                        f"({MAX_WARMUP_RECORDS}) at {path}")
            _run(servable, _parse(record, count, path), count, path)
    except tf.errors.DataLossError as e:
        raise ServableLoadError("DATA_LOSS", f"{e.message} at {path}. Please verify your warmup data is in "
                                "TFRecord format.") from e
    return count


def load_and_warm_up(model_name: str, version: int, path: str | Path) -> ServableVersion:
    """The version at `path`, loaded and warmed up: the ModelManager's loader."""
    servable = load_servable_version(model_name, version, path)
    ran = warm_up(servable)
    if ran:
        logger.info("warmed up %s version %d with %d request(s) from %s", model_name, version, ran, WARMUP_FILE)
    return servable


def _parse(record: bytes, number: int, path: str) -> prediction_log_pb2.PredictionLog:
    try:
        return prediction_log_pb2.PredictionLog.FromString(record)
    except DecodeError as e:
        raise ServableLoadError("INVALID_ARGUMENT", f"Failed to parse warmup record {number} from {path}") from e


def _run(servable: ServableVersion, log: prediction_log_pb2.PredictionLog, number: int, path: str) -> None:
    kind = log.WhichOneof("log_type") or "record without a request"
    if kind != "predict_log":
        # The server answers Predict alone (grpc/servicer.py); TF Serving would run Classify and Regress too.
        raise ServableLoadError("UNIMPLEMENTED", f"warmup record {number} of {path} is a {kind}; this server answers "
                                "Predict requests alone, so its warm-up file may hold predict_log records only.")
    request = log.predict_log.request
    try:
        signature = servable.signature(request.model_spec.signature_name)
        missing = sorted(set(signature.inputs) - set(request.inputs))
        unknown = sorted(set(request.inputs) - set(signature.inputs))
        if missing or unknown:
            raise invalid_argument(f"its inputs do not match the signature's (missing {missing}, unknown {unknown})")
        signature.run({name: tf.make_ndarray(tensor) for name, tensor in request.inputs.items()})
    except ServingRequestError as e:
        raise ServableLoadError("INVALID_ARGUMENT", f"warmup request {number} of {path} failed: {e.message}") from e
    except (ValueError, TypeError) as e:
        raise ServableLoadError("INVALID_ARGUMENT", f"warmup request {number} of {path} failed: {e}") from e
