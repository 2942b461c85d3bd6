"""Request logs in TF Serving's own format: sampled predictions and their answers as PredictionLog TFRecords.

Each record is a `tensorflow_serving.apis.prediction_log_pb2.PredictionLog`, the record TF Serving's request logger
writes (core/request_logger.cc RequestLogger::Log, 2.16.1) and TFX's InfraValidator and BulkInferrer read:

- `predict_log.request`: the PredictRequest as the client sent it over gRPC, or for REST the PredictRequest TF
  Serving turns the JSON into (model_servers/http_rest_api_handler.cc ProcessPredictRequest: model_spec with the
  URL's name and version or label, one TensorProto per input in the signature's dtype);
- `predict_log.response`: the PredictResponse (model_spec with name, the version that answered and the signature,
  as servables/tensorflow/predict_util.cc RunPredict sets it; one TensorProto per output);
- `log_metadata`: `model_spec` {name, version (the version that answered), signature_name}, `sampling_config.
  sampling_rate`, `saved_model_tags` ["serve"] and `timestamp_secs` (when the answer was sent). A ModelSpec holds a
  version or a label, not both: the label a request named is in `predict_log.request.model_spec.version_label`.

Files: `<directory>/<model>/requests-<UTC time of the first record, %Y%m%dT%H%M%S%fZ>-<pid>-<seq>.tfrecord` (the
names sort by time), written through tf.io.gfile (a folder or any URI it serves, gs:// included). A file is closed
and the next one started when a record would take it past `max_file_bytes` or its first record is `max_file_seconds`
old; a model's folder keeps `max_files` files, the oldest deleted first (only files whose writer has closed them: on
a folder several servers share, one more each may be open). On a local folder the file being written is
flushed after each batch of records (every 50 ms while records come), so it ends on a whole record.

Failed predictions of users go to `failures-<same stamp>-<pid>-<seq>.jsonl` beside them, one JSON object a line
(serving/server/failures.py FailedPrediction: time, version, code, the whole error message and the first rows of the
inputs), with the same rotation and limits; they are not sampled. TF Serving logs no failures, so nothing reads these
but people and `mlops rollout`.

Requests never wait for the log: a sampled prediction is put on a bounded queue and a writer thread builds and writes
its record; a full queue drops the record, a failed write is counted, and both show on the server's Prometheus page
(`:mlops:serving:request_log_count{model_name,status}`, serving/server/monitoring.py).
"""
from __future__ import annotations

import collections
import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timezone
from typing import NamedTuple

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import logging_pb2, model_pb2, predict_pb2, prediction_log_pb2

from serving.server.failures import FailedPrediction
from serving.server.grpc.codec import array_to_tensor_proto
from serving.server.limits import wire_fields
from serving.server.monitoring import RequestLogMetrics
from settings.config import RequestLogConfig

logger = logging.getLogger(__name__)

FILE_PREFIX = "requests-"
FILE_SUFFIX = ".tfrecord"
LOG_FILE_NAME = re.compile(r"requests-\d{8}T\d{12}Z-\d+-\d+\.tfrecord")
FAILURE_FILE_PREFIX = "failures-"
FAILURE_FILE_SUFFIX = ".jsonl"
FAILURE_FILE_NAME = re.compile(r"failures-\d{8}T\d{12}Z-\d+-\d+\.jsonl")
# What a model's files hold: sampled predictions (TFRecords of PredictionLog) or users' failures (JSON lines).
PREDICTIONS, FAILURES = "predictions", "failures"
# TF Serving's default --saved_model_tags.
SAVED_MODEL_TAGS = ("serve",)
# The writer wakes this often and writes what waits (or at once for flush and close): a handful of wake-ups a
# second, where one per request would hand the GIL back and forth with the event loop for every prediction.
WRITE_INTERVAL_S = 0.05
# Records written before the file is flushed and progress reported.
WRITE_BATCH = 1024
# TFRecord framing around each record: length (8 bytes) and two masked CRC32Cs (4 each).
TFRECORD_OVERHEAD = 16


class LoggedPrediction(NamedTuple):
    """One answered prediction as the writer needs it: who answered, and the two messages serialized."""

    version: int
    signature_name: str
    request: bytes
    response: bytes


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def prediction_log_bytes(metadata: bytes, prediction: LoggedPrediction) -> bytes:
    """A serialized PredictionLog{log_metadata, predict_log{request, response}}, built from the serialized parts
    (fields 1 and 6; PredictLog's request 1 and response 2) without parsing them."""
    predict_log = _length_delimited(1, prediction.request) + _length_delimited(2, prediction.response)
    return _length_delimited(1, metadata) + _length_delimited(6, predict_log)


def wire_model_spec(message: bytes, field_number: int) -> model_pb2.ModelSpec:
    """The ModelSpec in field `field_number` of a serialized message (PredictRequest: 1, PredictResponse: 2), read
    without parsing the tensors around it."""
    spec = model_pb2.ModelSpec()
    for number, wire_type, start, end in wire_fields(message, 0, len(message)):
        if number == field_number and wire_type == 2:
            spec.MergeFromString(message[start:end])
    return spec


def predict_messages_from_arrays(
    model: str, requested_version: int | None, requested_label: str | None, version: int, signature_name: str,
    inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray],
) -> LoggedPrediction:
    """The PredictRequest and PredictResponse a REST prediction stands for (http_rest_api_handler.cc
    ProcessPredictRequest), from the arrays the server converted the JSON into and the ones the model returned."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    if requested_version is not None:
        request.model_spec.version.value = requested_version
    elif requested_label:
        request.model_spec.version_label = requested_label
    request.model_spec.signature_name = signature_name
    for name, value in inputs.items():
        array_to_tensor_proto(np.asarray(value), request.inputs[name])
    response = predict_pb2.PredictResponse()
    response.model_spec.name = model
    response.model_spec.version.value = version
    response.model_spec.signature_name = signature_name
    for name, value in outputs.items():
        array_to_tensor_proto(np.asarray(value), response.outputs[name])
    return LoggedPrediction(version, signature_name, request.SerializeToString(), response.SerializeToString())


def log_file_name(started: float, pid: int, seq: int, kind: str = PREDICTIONS) -> str:
    stamp = datetime.fromtimestamp(started, timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    if kind == FAILURES:
        return f"{FAILURE_FILE_PREFIX}{stamp}-{pid}-{seq:06d}{FAILURE_FILE_SUFFIX}"
    return f"{FILE_PREFIX}{stamp}-{pid}-{seq:06d}{FILE_SUFFIX}"


def file_start(name: str) -> float:
    """When the log file `name` (log_file_name's) got its first record, in seconds since 1970."""
    stamp = name.split("-", 2)[1]
    return datetime.strptime(stamp, "%Y%m%dT%H%M%S%fZ").replace(tzinfo=timezone.utc).timestamp()


def log_files(directory: str, model: str) -> list[str]:
    """A model's log files, oldest first (full paths); none when its folder does not exist."""
    folder = _join(directory, model)
    if not tf.io.gfile.isdir(folder):
        return []
    return [_join(folder, name) for name in sorted(tf.io.gfile.listdir(folder)) if LOG_FILE_NAME.fullmatch(name)]


def failure_files(directory: str, model: str) -> list[str]:
    """A model's files of users' failures, oldest first (full paths)."""
    folder = _join(directory, model)
    if not tf.io.gfile.isdir(folder):
        return []
    return [_join(folder, name) for name in sorted(tf.io.gfile.listdir(folder)) if FAILURE_FILE_NAME.fullmatch(name)]


def read_failures(path: str) -> Iterator[dict]:
    """The failures of one file, in order (a line the writer was cut off in is left out)."""
    with tf.io.gfile.GFile(path, "rb") as f:
        for line in f:
            try:
                yield json.loads(line)
            except ValueError:
                continue


def read_prediction_logs(path: str) -> Iterator[prediction_log_pb2.PredictionLog]:
    """The records of one log file, in order."""
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
        yield prediction_log_pb2.PredictionLog.FromString(record)


def open_record_file(path: str) -> tf.io.TFRecordWriter:
    """A TFRecord writer through tf.io.gfile (monkeypatched by the tests to fail)."""
    return tf.io.TFRecordWriter(path)


def _join(directory: str, name: str) -> str:
    return directory.rstrip("/") + "/" + name if "://" in directory else os.path.join(directory, name)


class _ModelFiles:
    """The file one model's records of one kind go to now, and when and how large it started."""

    def __init__(self, folder: str, kind: str) -> None:
        self.folder = folder
        self.kind = kind
        self.writer: tf.io.TFRecordWriter | None = None
        self.path = ""
        self.started = 0.0
        self.bytes = 0
        self.created = False  # the folder


class RequestLogger:
    """Samples predictions and writes their PredictionLog records on a thread of its own.

    `sample()` and `submit()` run on the request path and only draw a number and append a closure to the queue;
    the closure builds the messages on the writer thread. `random_source` draws the samples (seed it for exact
    counts) and `clock` stamps the records and ages the files (seconds since the epoch).
    """

    def __init__(self, settings: RequestLogConfig, directory: str, metrics: RequestLogMetrics | None = None,
                 random_source: random.Random | None = None, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.directory = directory
        self.metrics = metrics or RequestLogMetrics()
        self._random = random_source or random.Random()
        self._clock = clock
        # Appended by the request path and taken by the writer, which wakes on a timer rather than per record.
        self._pending: collections.deque = collections.deque()
        self._files: dict[tuple[str, str], _ModelFiles] = {}
        self._metadata_cache: dict[tuple[str, int, str], bytes] = {}
        self._pid = os.getpid()
        self._seq = 0
        # Only local files are flushed per batch: a flush of a gs:// file uploads all of it again.
        self._flush_batches = "://" not in directory or directory.startswith("file://")
        self._wake = threading.Event()
        self._accepted_lock = threading.Lock()
        self._progress = threading.Condition()
        self._accepted = 0
        self._finished = 0
        self._failing = False
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="request-log-writer", daemon=True)
        self._thread.start()

    def sample(self) -> bool:
        """Whether to log this prediction, drawn with probability sampling_rate."""
        rate = self.settings.sampling_rate
        return rate >= 1.0 or (rate > 0.0 and self._random.random() < rate)

    def leave_out_verifier(self, model: str) -> None:
        """Counts a prediction of the rollout's verifier, which the logs leave out: they hold users' requests."""
        self.metrics.count(model, "verifier")

    def submit(self, model: str, build: Callable[[], LoggedPrediction]) -> None:
        """Queues one sampled prediction of `model`; a full queue drops it (counted), never waits."""
        if self._stopping:
            return
        if len(self._pending) >= self.settings.queue_size:
            self.metrics.count(model, "dropped")
            return
        with self._accepted_lock:
            self._accepted += 1
        self._pending.append((model, self._clock(), build))

    def submit_failure(self, failure: FailedPrediction) -> None:
        """Queues one users' failed prediction (not sampled); a full queue drops it (counted), never waits."""
        if self._stopping:
            return
        if len(self._pending) >= self.settings.queue_size:
            self.metrics.count(failure.model, "dropped")
            return
        with self._accepted_lock:
            self._accepted += 1
        self._pending.append((failure.model, failure.time, failure))

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Waits until every record queued so far is written (or failed); False after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        target = self._accepted
        self._wake.set()
        with self._progress:
            while self._finished < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._progress.wait(left)
        return True

    def close(self, timeout_s: float = 30.0) -> None:
        """Writes what is queued, closes the files and ends the writer thread."""
        if self._stopping:
            return
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            logger.error("the request log writer did not finish within %ss; records still queued are lost", timeout_s)

    # ------------------------------------------------------------------------------------------ writer thread
    def _run(self) -> None:
        while True:
            self._wake.wait(WRITE_INTERVAL_S)
            self._wake.clear()
            stopping = self._stopping  # read first: what was queued before close() is written below
            done = 0
            while self._pending and done < WRITE_BATCH:
                model, stamp, build = self._pending.popleft()
                self._write_one(model, stamp, build)
                done += 1
            if done:
                if self._flush_batches:
                    self._flush_files()
                with self._progress:
                    self._finished += done
                    self._progress.notify_all()
            if self._pending:
                self._wake.set()  # more than a batch waits: go on without sleeping
                continue
            self._close_old_files()
            if stopping:
                self._close_files()
                return

    def _write_one(self, model: str, stamp: float,
                   build: Callable[[], LoggedPrediction] | FailedPrediction) -> None:
        kind = FAILURES if isinstance(build, FailedPrediction) else PREDICTIONS
        try:
            if isinstance(build, FailedPrediction):
                record = json.dumps(build.to_json(), allow_nan=False).encode() + b"\n"
            else:
                prediction = build()
                record = prediction_log_bytes(self._metadata(model, prediction, stamp), prediction)
            self._append(model, kind, stamp, record)
        except Exception as e:  # noqa: BLE001 - a failed log write must never reach the request
            self.metrics.count(model, "failed")
            files = self._files.get((model, kind))
            if files is not None and files.writer is not None:
                self._close(files)  # the next record starts a new file rather than write after a failed write
            if not self._failing:
                logger.warning("could not write a request log record of %s under %s (%s: %s); counting failures "
                               "in %s until a write succeeds", model, self.directory, type(e).__name__, e,
                               "the request_log_count metric")
            self._failing = True
            return
        if kind == PREDICTIONS:  # `written` counts predictions, as the records `mlops monitor` reads
            self.metrics.count(model, "written")
        self._failing = False

    def _metadata(self, model: str, prediction: LoggedPrediction, stamp: float) -> bytes:
        key = (model, prediction.version, prediction.signature_name)
        fixed = self._metadata_cache.get(key)
        if fixed is None:
            metadata = logging_pb2.LogMetadata(
                model_spec=model_pb2.ModelSpec(name=model, signature_name=prediction.signature_name),
                saved_model_tags=SAVED_MODEL_TAGS,
            )
            metadata.model_spec.version.value = prediction.version
            metadata.sampling_config.sampling_rate = self.settings.sampling_rate
            fixed = metadata.SerializeToString()
            if len(self._metadata_cache) > 1024:
                self._metadata_cache.clear()
            self._metadata_cache[key] = fixed
        # timestamp_secs (field 4, a varint) appended: a message's fields may come in any order.
        return fixed + _varint(4 << 3) + _varint(int(stamp))

    def _append(self, model: str, kind: str, stamp: float, record: bytes) -> None:
        files = self._files.get((model, kind))
        if files is None:
            files = self._files[(model, kind)] = _ModelFiles(_join(self.directory, model), kind)
        size = len(record) + (TFRECORD_OVERHEAD if kind == PREDICTIONS else 0)
        if files.writer is not None and (files.bytes + size > self.settings.max_file_bytes
                                         or stamp - files.started >= self.settings.max_file_seconds):
            self._close(files)
        if files.writer is None:
            self._open(files, stamp)
        files.writer.write(record)
        files.bytes += size

    def _open(self, files: _ModelFiles, stamp: float) -> None:
        if not files.created:
            tf.io.gfile.makedirs(files.folder)
            files.created = True
        self._seq += 1
        path = _join(files.folder, log_file_name(stamp, self._pid, self._seq, files.kind))
        files.writer = open_record_file(path) if files.kind == PREDICTIONS else tf.io.gfile.GFile(path, "wb")
        files.path, files.started, files.bytes = path, stamp, 0
        self._prune(files)

    def _prune(self, files: _ModelFiles) -> None:
        """Deletes a model's oldest files beyond max_files, never one that may still be written: on a folder that
        several servers share (a ReadWriteMany claim), another writer's file is closed by its writer once
        max_file_seconds old, so only files started more than twice that long ago are deleted."""
        try:
            pattern = LOG_FILE_NAME if files.kind == PREDICTIONS else FAILURE_FILE_NAME
            names = sorted(n for n in tf.io.gfile.listdir(files.folder) if pattern.fullmatch(n))
            current = files.path.rsplit("/", 1)[-1]
            excess = len(names) - self.settings.max_files
            closed_before = self._clock() - 2 * self.settings.max_file_seconds
            old = [n for n in names if n != current and file_start(n) < closed_before]
            for name in old[:max(0, excess)]:
                tf.io.gfile.remove(_join(files.folder, name))
        except (OSError, tf.errors.OpError) as e:  # another writer may have removed it first
            logger.warning("could not remove old request logs under %s: %s", files.folder, e)

    def _close(self, files: _ModelFiles) -> None:
        writer, files.writer = files.writer, None
        try:
            writer.close()
        except Exception as e:  # noqa: BLE001 - a file that cannot be closed is lost, the next one is tried
            logger.warning("could not close request log %s: %s", files.path, e)

    def _flush_files(self) -> None:
        for files in self._files.values():
            if files.writer is not None:
                try:
                    files.writer.flush()
                except Exception as e:  # noqa: BLE001 - counted when the next write to it fails
                    logger.warning("could not flush request log %s: %s", files.path, e)

    def _close_old_files(self) -> None:
        now = self._clock()
        for files in self._files.values():
            if files.writer is not None and now - files.started >= self.settings.max_file_seconds:
                self._close(files)

    def _close_files(self) -> None:
        for files in self._files.values():
            if files.writer is not None:
                self._close(files)


def open_request_logger(settings: RequestLogConfig, directory: str,
                        metrics: RequestLogMetrics | None = None) -> RequestLogger | None:
    """The logger the config asks for, or None when request logging is off."""
    if not settings.enabled:
        return None
    return RequestLogger(settings, directory, metrics)
