"""The request logs, read back: which files a window covers, and the TFDV statistics of the requests in them.

A logged model's folder, `<serving.request_log.directory>/<model>/`, holds TFRecord files named `requests-<UTC start
%Y%m%dT%H%M%S%fZ>-<pid>-<seq>.tfrecord` (serving/server/request_log.py writes them), so that names sort by time. A file
holds the requests its writer (one process) logged from its start until its next file's start, or, for its newest file,
until the file's modification time. Each record is TF Serving's `PredictionLog`: a `predict_log` with the
`PredictRequest` (one TensorProto per raw feature, the batch dimension first) and its response, and `log_metadata`
naming the model version that answered and the sampling rate. Everything is read through tf.io.gfile, so the folder may
be any URI.

A time window reads the files whose span meets it and takes each record by its `log_metadata.timestamp_secs` (when
the answer was sent); a record without one goes with its file. The statistics are built a file at a time (TFDV's
in-memory generators, merged), so memory holds one file's requests, not the window's. The last N requests are the
newest N by that time across every server's files, so those 2N serialized requests are held until they are sorted.
"""
from __future__ import annotations

import itertools
import math
import posixpath
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pyarrow as pa

from settings.errors import UserError

LOG_FILE_PATTERN = re.compile(r"^requests-(?P<start>\d{8}T\d{12}Z)-(?P<writer>\d+)-(?P<seq>\d+)\.tfrecord$")
START_FORMAT = "%Y%m%dT%H%M%S%fZ"
# How many requests read_last decodes into columns at a time.
ADD_CHUNK = 10_000
# Inputs a model reads as missing (serving/clients/values.py, missing_value): NaN for floats, -1 for integers, ""
# for strings.
MISSING_INT = -1
MISSING_STRING = b""


class LogError(UserError, ValueError):
    """The logs cannot give what was asked (no folder, no files, a window that cannot be read); the message says what
    to do."""

    exit_code = 2


@dataclass(frozen=True)
class LogFile:
    path: str
    start: datetime
    # The writer's next file's start, or this file's modification time when it is the writer's newest.
    end: datetime
    writer: str
    seq: int


def parse_start(name: str) -> tuple[datetime, str, int] | None:
    """(start, writer, sequence number) of a log file's name; None for a name of another kind."""
    match = LOG_FILE_PATTERN.match(name)
    if match is None:
        return None
    start = datetime.strptime(match["start"], START_FORMAT).replace(tzinfo=timezone.utc)
    return start, match["writer"], int(match["seq"])


def list_log_files(log_dir: str, model: str) -> list[LogFile]:
    """The log files of `model` under `log_dir`, oldest first; raises LogError when there are none."""
    import tensorflow as tf

    folder = posixpath.join(log_dir.rstrip("/"), model)
    if not tf.io.gfile.isdir(folder):
        raise LogError(f"there are no request logs of model {model!r}: {folder} does not exist; point "
                       "serving.request_log.directory at the folder the servers log requests to.")
    named = []
    for name in tf.io.gfile.listdir(folder):
        parsed = parse_start(name.rstrip("/"))
        if parsed is not None:
            named.append((parsed, posixpath.join(folder, name.rstrip("/"))))
    if not named:
        raise LogError(f"{folder} holds no request log files (requests-*.tfrecord); turn request logging on "
                       "(serving.request_log.enabled) and send requests, or point serving.request_log.directory "
                       "elsewhere.")
    named.sort(key=lambda item: (item[0][0], item[0][1], item[0][2]))
    files = []
    for index, ((start, writer, seq), path) in enumerate(named):
        following = next((s for (s, w, _), _ in named[index + 1:] if w == writer), None)
        end = following if following is not None else _modified(path)
        files.append(LogFile(path, start, max(start, end), writer, seq))
    return files


def _modified(path: str) -> datetime:
    import tensorflow as tf

    return datetime.fromtimestamp(tf.io.gfile.stat(path).mtime_nsec / 1e9, tz=timezone.utc)


def files_between(files: list[LogFile], since: datetime, until: datetime) -> list[LogFile]:
    """The files whose span meets [since, until): a file that began before `since` and went on past it counts."""
    return [f for f in files if f.start < until and (f.end > since or f.start >= since)]


def read_records(path: str) -> tuple[list[bytes], bool]:
    """The records of one file, and whether it ended in a partial record (a file still being written)."""
    import tensorflow as tf

    records: list[bytes] = []
    try:
        for batch in tf.data.TFRecordDataset(path).batch(4096).as_numpy_iterator():
            records.extend(batch.tolist())
    except tf.errors.DataLossError:
        # The batch that met the partial record is lost: read the file again record by record up to it.
        records = []
        try:
            for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
                records.append(record)
        except tf.errors.DataLossError:
            return records, True
    return records, False


# ---- decoding --------------------------------------------------------------------------------------------------

def _dtypes() -> dict[int, tuple[Any, str, str]]:
    from tensorflow.core.framework import types_pb2

    # TF dtype -> (numpy dtype of tensor_content, the value field, the kind of column the statistics get).
    return {types_pb2.DT_FLOAT: (np.float32, "float_val", "float"),
            types_pb2.DT_DOUBLE: (np.float64, "double_val", "float"),
            types_pb2.DT_HALF: (np.float16, "half_val", "float"),
            types_pb2.DT_INT32: (np.int32, "int_val", "int"), types_pb2.DT_INT16: (np.int16, "int_val", "int"),
            types_pb2.DT_INT8: (np.int8, "int_val", "int"), types_pb2.DT_UINT8: (np.uint8, "int_val", "int"),
            types_pb2.DT_INT64: (np.int64, "int64_val", "int"), types_pb2.DT_STRING: (object, "string_val", "bytes")}


_DTYPES: dict[int, tuple[Any, str, str]] = {}


def tensor_values(tensor: Any) -> tuple[list[Any] | np.ndarray, int, str]:
    """A TensorProto's values, flat (a list from the value fields, an array from tensor_content), its rows (the
    first dimension; 1 for a scalar) and its kind (float, int or bytes). Raises ValueError for a type the statistics
    cannot take or values that do not fill the shape."""
    if not _DTYPES:
        _DTYPES.update(_dtypes())
    if tensor.dtype not in _DTYPES:
        raise ValueError(f"dtype {tensor.dtype}")
    dtype, field_name, kind = _DTYPES[tensor.dtype]
    shape = tensor.tensor_shape.dim
    if len(shape) == 1:
        # The usual [batch] tensor, without a list of its dimensions (3 of every 5 microseconds spent here).
        rows = size = shape[0].size
    else:
        dims = [d.size for d in shape]
        size, rows = math.prod(dims), (dims[0] if dims else 1)
    values: list[Any] | np.ndarray
    if tensor.tensor_content and dtype is not object:
        values = np.frombuffer(tensor.tensor_content, dtype=dtype)
    elif dtype is np.float16:
        # half_val holds the halves' bit patterns.
        values = np.asarray(tensor.half_val, np.uint16).view(np.float16)
    else:
        values = list(getattr(tensor, field_name))
    if len(values) == 1 and size > 1:
        # TensorFlow fills a whole shape from one value.
        values = [values[0]] * size
    if len(values) != size:
        raise ValueError(f"{len(values)} values for shape {[d.size for d in shape]}")
    return values, rows, kind


_ARROW = {"bytes": pa.binary(), "float": pa.float32(), "int": pa.int64()}
_NUMPY = {"bytes": object, "float": np.float32, "int": np.int64}


@dataclass
class _Feature:
    kind: str
    parts: list[list[Any] | np.ndarray] = field(default_factory=list)
    # Per record: the first row it fills, its rows and its values (a multiple of its rows).
    offsets: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)

    def values(self) -> np.ndarray:
        dtype = _NUMPY[self.kind]
        if all(isinstance(part, list) for part in self.parts):
            # One conversion for the whole file: a logger writes the value fields alike for every request.
            flat = list(itertools.chain.from_iterable(self.parts))
            return np.array(flat, dtype=dtype) if flat else np.zeros(0, dtype)
        return np.concatenate([np.asarray(part).astype(dtype, copy=False) for part in self.parts])


class _Columns:
    """Decoded requests of one version, as one Arrow list column per feature (a missing value: no value)."""

    def __init__(self) -> None:
        self.rows = 0
        self.features: dict[str, _Feature] = {}

    def add(self, inputs: dict[str, tuple[list[Any] | np.ndarray, int, str]], rows: int) -> None:
        for name, (values, _, kind) in inputs.items():
            feature = self.features.get(name)
            if feature is None:
                feature = self.features[name] = _Feature(kind)
            feature.parts.append(values)
            feature.offsets.append(self.rows)
            feature.rows.append(rows)
            feature.sizes.append(len(values))
        self.rows += rows

    def record_batch(self) -> pa.RecordBatch:
        arrays, names = [], []
        for name in sorted(self.features):
            feature = self.features[name]
            values = feature.values()
            sizes = np.asarray(feature.sizes)
            per_row = sizes // np.maximum(np.asarray(feature.rows), 1)
            record = np.repeat(np.arange(len(sizes)), sizes)
            within = np.arange(values.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)
            row = np.asarray(feature.offsets)[record] + within // np.maximum(per_row[record], 1)
            present = _present(values, feature.kind)
            counts = np.bincount(row[present], minlength=self.rows)
            offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
            column = pa.array(values[present], type=_ARROW[feature.kind])
            arrays.append(pa.ListArray.from_arrays(pa.array(offsets), column, mask=pa.array(counts == 0)))
            names.append(name)
        return pa.RecordBatch.from_arrays(arrays, names)


def _present(values: np.ndarray, kind: str) -> np.ndarray:
    if kind == "float":
        return ~np.isnan(values)
    if kind == "int":
        return values != MISSING_INT
    return values != MISSING_STRING


# ---- statistics of a window --------------------------------------------------------------------------------------

class WindowStatistics:
    """The requests of one window, counted and summed into TFDV statistics per model version, a file at a time."""

    def __init__(self) -> None:
        import tensorflow_data_validation as tfdv
        from tensorflow_data_validation.statistics import stats_impl

        # TFDV's defaults, as StatisticsGen computes the training statistics: the same histograms compare.
        self._options = tfdv.StatsOptions()
        self._generators = stats_impl.get_generators(self._options, in_memory=True)
        self._accumulators: dict[int, list[Any]] = {}
        self.requests: Counter[int] = Counter()
        self.rows: Counter[int] = Counter()
        self.sampling_rates: Counter[float] = Counter()
        self.signatures: Counter[str] = Counter()
        # Records left out, by reason.
        self.skipped: Counter[str] = Counter()
        self.files: list[LogFile] = []
        self.truncated: list[str] = []
        self._kinds: dict[str, str] = {}
        self._extracted = False
        # The first and last timestamp_secs of the requests added (None: none carried one).
        self._times: tuple[int, int] | None = None

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    def add_file(self, log_file: LogFile, records: list[bytes], truncated: bool = False) -> None:
        self.note_file(log_file, truncated)
        self.add(records)

    def note_file(self, log_file: LogFile, truncated: bool = False) -> None:
        """Counts `log_file` among the files the window read."""
        self.files.append(log_file)
        if truncated:
            self.truncated.append(log_file.path)

    def add(self, records: Iterable[bytes]) -> None:
        self.add_logs(parse_record(record, self.skipped) for record in records)

    def add_logs(self, logs: Iterable[Any]) -> None:
        """Adds parsed PredictionLogs (None: a record that was not one, already counted)."""
        columns: dict[int, _Columns] = {}
        for log in logs:
            if log is None:
                continue
            if log.WhichOneof("log_type") != "predict_log":
                self.skipped["not a Predict request"] += 1
                continue
            spec = log.log_metadata.model_spec
            if not spec.HasField("version"):
                self.skipped["no model version"] += 1
                continue
            decoded = self._decode(log.predict_log.request.inputs)
            if decoded is None:
                continue
            rows = next(iter(decoded.values()))[1] if decoded else 0
            columns.setdefault(spec.version.value, _Columns()).add(decoded, rows)
            self.requests[spec.version.value] += 1
            self.rows[spec.version.value] += rows
            self.sampling_rates[float(log.log_metadata.sampling_config.sampling_rate)] += 1
            self.signatures[spec.signature_name or "serving_default"] += 1
            stamp = log.log_metadata.timestamp_secs
            if stamp:
                low, high = self._times or (stamp, stamp)
                self._times = (min(low, stamp), max(high, stamp))
        for version, batch in columns.items():
            self._add_batch(version, batch.record_batch())

    def _decode(self, inputs: Any) -> dict[str, tuple[list[Any] | np.ndarray, int, str]] | None:
        try:
            decoded = {name: tensor_values(tensor) for name, tensor in inputs.items()}
        except ValueError:
            self.skipped["inputs that cannot be decoded"] += 1
            return None
        if len({rows for _, rows, _ in decoded.values()}) > 1:
            self.skipped["inputs of different batch sizes"] += 1
            return None
        for name, (_, _, kind) in decoded.items():
            if self._kinds.setdefault(name, kind) != kind:
                self.skipped["an input whose type changed"] += 1
                return None
        return decoded

    def _add_batch(self, version: int, batch: pa.RecordBatch) -> None:
        accumulators = self._accumulators.get(version)
        if accumulators is None:
            accumulators = [g.create_accumulator() for g in self._generators]
        self._accumulators[version] = [g.add_input(a, batch) for g, a in zip(self._generators, accumulators,
                                                                            strict=True)]

    def statistics(self, version: int | None = None) -> Any:
        """The DatasetFeatureStatisticsList of one version's requests, or of all of them (None); None without any.
        Once per window: TFDV finalizes the sketches it extracts from."""
        from tensorflow_data_validation.statistics import stats_impl

        if self._extracted:
            raise RuntimeError("a window's statistics are extracted once; build another WindowStatistics.")
        self._extracted = True
        chosen = [a for v, a in self._accumulators.items() if version is None or v == version]
        if not chosen:
            return None
        merged = [g.merge_accumulators([a[i] for a in chosen]) for i, g in enumerate(self._generators)]
        return stats_impl.extract_statistics_output(merged, self._generators)

    def span(self) -> tuple[datetime, datetime] | None:
        """When the requests were answered: from the first to the last request's own time, or without those, from
        the first file's start to the last file's end."""
        if self._times is not None:
            low, high = self._times
            return datetime.fromtimestamp(low, tz=timezone.utc), datetime.fromtimestamp(high, tz=timezone.utc)
        if not self.files:
            return None
        return min(f.start for f in self.files), max(f.end for f in self.files)


Progress = Callable[[int, int, int], None]


def parse_record(record: bytes, skipped: Counter[str]) -> Any:
    """One request log record as a PredictionLog, or None (counted in `skipped`) when it is not one."""
    from google.protobuf.message import DecodeError
    from tensorflow_serving.apis import prediction_log_pb2

    try:
        return prediction_log_pb2.PredictionLog.FromString(record)
    except DecodeError:
        skipped["not a PredictionLog"] += 1
        return None


def read_time_windows(files: list[LogFile], since: datetime, until: datetime, current: WindowStatistics,
                      previous: WindowStatistics, progress: Progress | None = None) -> None:
    """Adds the requests answered in [since, until) to `current`, and those of the window of the same length just
    before it to `previous`: each by its own time, read from the files whose span meets either window; a request
    without a time goes with its file (the current window's when the file meets it)."""
    start = since - (until - since)
    now = files_between(files, since, until)
    chosen = files_between(files, start, until)
    bounds = (start.timestamp(), since.timestamp(), until.timestamp())
    for index, log_file in enumerate(chosen, 1):
        records, truncated = read_records(log_file.path)
        this, before = [], []
        for record in records:
            log = parse_record(record, (current if log_file in now else previous).skipped)
            if log is None:
                continue
            stamp = log.log_metadata.timestamp_secs
            if not stamp:
                (this if log_file in now else before).append(log)
            elif bounds[1] <= stamp < bounds[2]:
                this.append(log)
            elif bounds[0] <= stamp < bounds[1]:
                before.append(log)
        for window, logs in ((current, this), (previous, before)):
            if logs:
                window.note_file(log_file, truncated)
                window.add_logs(logs)
        if progress:
            progress(index, len(chosen), current.total_requests + previous.total_requests)


def read_last(files: list[LogFile], count: int, current: WindowStatistics, previous: WindowStatistics,
              progress: Progress | None = None) -> None:
    """Adds the newest `count` requests across every writer's files to `current` and the `count` before them to
    `previous`, ordered by when each was answered (a request without a time takes its file's end). Files are read
    from the latest end back, and no further than an unread file could still hold one of the requests kept: with
    several servers logging, the newest file by name may hold older requests than another server's."""
    by_end = sorted(files, key=lambda f: f.end, reverse=True)
    # (answered, the file's end, position in the file): a file's records are in the order its writer logged them.
    # The records are kept serialized (a fraction of a parsed PredictionLog's memory) and parsed again when added.
    kept: list[tuple[tuple[float, float, int], LogFile, bool, bytes]] = []
    ignored: Counter[str] = Counter()
    for index, log_file in enumerate(by_end, 1):
        records, truncated = read_records(log_file.path)
        file_end = log_file.end.timestamp()
        for position, record in enumerate(records):
            log = parse_record(record, ignored)
            answered = (log.log_metadata.timestamp_secs if log is not None else 0) or file_end
            kept.append(((answered, file_end, position), log_file, truncated, record))
        kept.sort(key=lambda item: item[0], reverse=True)
        del kept[2 * count:]
        if progress:
            progress(index, len(files), len(kept))
        unread = by_end[index:]
        # An unread file holds nothing answered after its end, and by_end puts the latest end first.
        if not unread or (len(kept) == 2 * count and kept[-1][0][0] > unread[0].end.timestamp()):
            break
    for window, part in ((current, kept[:count]), (previous, kept[count:])):
        # The files newest first, as they were read; the requests oldest first, as read_time_windows adds them.
        for log_file in dict.fromkeys(log_file for _, log_file, _, _ in part):
            window.note_file(log_file, any(truncated for _, f, truncated, _ in part if f is log_file))
        oldest_first = [record for _, _, _, record in reversed(part)]
        # In chunks: the decoded columns of a whole window would hold every value at once.
        for chunk in range(0, len(oldest_first), ADD_CHUNK):
            window.add(oldest_first[chunk:chunk + ADD_CHUNK])


def parse_when(text: str, now: datetime) -> datetime:
    """A point in time: an ISO 8601 time (UTC unless it says otherwise) or a span before `now` (90s, 30m, 2h, 7d)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text)
    if match:
        unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[match[2]]
        return now - timedelta(**{unit: float(match[1])})
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise LogError(f"{text!r} is not a time; write an ISO 8601 UTC time such as 2026-01-31T14:00:00Z, or a span "
                       "before now such as 90m, 2h or 1d.") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def utc_text(when: datetime) -> str:
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_utc() -> datetime:
    return datetime.fromtimestamp(time.time(), tz=timezone.utc)
