"""`mlops monitor` as a plain function: a window of request logs judged against the serving version's training data.

1. The window: `--since`/`--until` (whole log files, logs/files_between) or the last N requests; the window before
   it, of the same length, is read too, for drift.
2. The version: the one that answered most of the window's requests (or `--version`); its training schema and
   statistics come from its folder in the model repository (the Publisher copies them there).
3. TFDV statistics of the version's requests, judged (monitoring/judge.py); the record (monitor.json), the page
   (monitor.html) and the gauges (metrics.prom) land in one folder, and the gauges may be pushed to a Pushgateway.
"""
from __future__ import annotations

import json
import posixpath
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TextIO

from monitoring import judge as gate
from monitoring import logs
from settings.config import MONITORING_THRESHOLDS, PipelineConfig
from settings.errors import UserError
from settings.files import TRAINING_SCHEMA_FILE, TRAINING_STATISTICS_FILE

RECORD_FILE = "monitor.json"
PAGE_FILE = "monitor.html"
METRICS_FILE = "metrics.prom"
# Exit codes of `mlops monitor`: 0 no threshold crossed (or too few requests to judge), 3 one was, as the
# data-validation gate stops `mlops run` with 3; 2 a problem the user fixes, 1 the Pushgateway did not take the
# figures.
EXIT_OK = 0
EXIT_PUSH_FAILED = 1
EXIT_CROSSED = 3
# Values of a categorical feature kept in the record per distribution.
TOP_VALUES = 20


class MonitorError(UserError, ValueError):
    """A request `mlops monitor` cannot honour (no logs, a version without training data); the message says what to
    do."""

    exit_code = 2


@dataclass(frozen=True)
class Window:
    """What was asked: a time range [since, until), or the last `last` requests."""

    since: datetime | None = None
    until: datetime | None = None
    last: int | None = None


def window_from_arguments(since: str | None, until: str | None, last: int | None, default_last: int,
                          now: datetime) -> Window:
    """The window the command line names: --since [--until] or --last N (default: the last `default_last`)."""
    if last is not None and (since or until):
        raise MonitorError("--last counts requests and --since/--until name times; give one or the other.")
    if until and not since:
        raise MonitorError("--until needs --since: the window runs from --since to --until.")
    if since:
        begin = logs.parse_when(since, now)
        end = logs.parse_when(until, now) if until else now
        if end <= begin:
            raise MonitorError(f"the window from {logs.utc_text(begin)} to {logs.utc_text(end)} is empty; --since must "
                               "come before --until.")
        return Window(since=begin, until=end)
    count = default_last if last is None else last
    if count < 1:
        raise MonitorError(f"--last {count} names no request; ask for 1 or more.")
    return Window(last=count)


@dataclass(frozen=True)
class MonitorResult:
    record: dict[str, Any]
    folder: str
    exit_code: int
    # Why the Pushgateway did not take the figures (None: taken, or none configured).
    push_error: str | None = None


def _progress(out: TextIO) -> logs.Progress:
    last = [time.monotonic()]

    def show(done: int, total: int, requests: int) -> None:
        # At most one line a second: a window of a few files reads in less.
        if time.monotonic() - last[0] >= 1.0:
            last[0] = time.monotonic()
            print(f"  read {done} of {total} log files: {requests:,} requests so far", file=out, flush=True)

    return show


def _read_version_file(config: PipelineConfig, version: int, name: str) -> bytes:
    from serving.repository.factory import open_repository

    repository = open_repository(config.serving_base_dir)
    if version not in repository.versions(config.model_name):
        raise MonitorError(f"the logs name version {version} of {config.model_name!r}, which the model repository "
                           f"{config.serving_base_dir} does not hold; point output_root at the repository the server "
                           "serves.")
    try:
        return repository.read_version_file(config.model_name, version, name)
    except OSError:
        raise MonitorError(f"version {version} of {config.model_name!r} carries no training schema and statistics "
                           f"({name} is missing): it was published before versions did; publish it again with "
                           "`mlops run`.") from None


def training_data(config: PipelineConfig, version: int) -> tuple[Any, Any]:
    """The schema and the training statistics version `version` carries."""
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2, statistics_pb2

    schema = text_format.Parse(_read_version_file(config, version, TRAINING_SCHEMA_FILE).decode(), schema_pb2.Schema())
    statistics = statistics_pb2.DatasetFeatureStatisticsList.FromString(
        _read_version_file(config, version, TRAINING_STATISTICS_FILE))
    return schema, statistics


def _feature_stats(statistics: Any, name: str) -> Any:
    if statistics is None:
        return None
    return next((f for f in statistics.datasets[0].features if (".".join(f.path.step) or f.name) == name), None)


def distribution(statistics: Any, name: str) -> dict[str, Any] | None:
    """What the page draws of one feature in one dataset: the share of rows without a value, and the cumulative
    shares at the quantiles (numbers) or the shares of the most frequent values (strings)."""
    from tensorflow_metadata.proto.v0 import statistics_pb2

    feature = _feature_stats(statistics, name)
    if feature is None:
        return None
    rows = statistics.datasets[0].num_examples
    kind = feature.WhichOneof("stats")
    # Values, not rows with the feature: ExampleGen keeps an empty cell as an empty list, which TFDV counts present.
    values = int(getattr(feature, kind).common_stats.tot_num_values) if kind else 0
    out: dict[str, Any] = {"rows": int(rows), "missing": max(0.0, 1 - values / rows) if rows else 0.0}
    if feature.HasField("num_stats"):
        stats = feature.num_stats
        quantiles = next((h for h in stats.histograms if h.type == statistics_pb2.Histogram.QUANTILES), None)
        points, total = [], 0.0
        if quantiles is not None and quantiles.buckets:
            count = sum(b.sample_count for b in quantiles.buckets) or 1.0
            points.append([quantiles.buckets[0].low_value, 0.0])
            for bucket in quantiles.buckets:
                total += bucket.sample_count
                points.append([bucket.high_value, total / count])
        out.update(mean=stats.mean, min=stats.min, max=stats.max, cdf=points)
    elif feature.HasField("string_stats"):
        stats = feature.string_stats
        out.update(unique=int(stats.unique), top=[[t.value, t.frequency / values if values else 0.0]
                                                  for t in list(stats.top_values)[:TOP_VALUES]])
    return out


def _window_record(window: logs.WindowStatistics, version: int | None) -> dict[str, Any]:
    span = window.span()
    requests = window.requests.get(version, 0) if version is not None else window.total_requests
    rows = window.rows.get(version, 0) if version is not None else sum(window.rows.values())
    rates = [rate for rate, _ in window.sampling_rates.most_common()]
    return {
        "files": len(window.files),
        # When its requests were answered: their own times, else their files' spans.
        "from": logs.utc_text(span[0]) if span else None,
        "to": logs.utc_text(span[1]) if span else None,
        "requests": requests,
        "rows": rows,
        "all_requests": window.total_requests,
        "versions": {str(v): n for v, n in sorted(window.requests.items())},
        "sampling_rates": rates,
        "skipped": dict(window.skipped),
        "truncated_files": window.truncated,
    }


def _output_folder(config: PipelineConfig, finished: datetime) -> str:
    import tensorflow as tf

    base = posixpath.join(config.monitoring_dir, config.model_name, finished.strftime("%Y%m%dT%H%M%SZ"))
    folder, suffix = base, 1
    while tf.io.gfile.exists(folder):
        suffix += 1
        folder = f"{base}-{suffix}"
    tf.io.gfile.makedirs(folder)
    return folder


def _write(path: str, text: str) -> None:
    """Writes `text` at `path` (any tf.io.gfile URI) under a temporary name first, so a reader (node-exporter) never
    sees half a file."""
    import tensorflow as tf

    temporary = posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.tmp")
    with tf.io.gfile.GFile(temporary, "w") as f:
        f.write(text)
    tf.io.gfile.rename(temporary, path, overwrite=True)


def monitor(config: PipelineConfig, window: Window, version: int | None = None, pushgateway: str | None = None,
            now: datetime | None = None, out: TextIO | None = None) -> MonitorResult:
    """Judges `window` of `config.model_name`'s request logs and writes the record, the page and the gauges into a
    new folder under config.monitoring_dir; raises MonitorError or logs.LogError for what the user must fix."""
    from monitoring import page, prometheus

    out = out or sys.stdout
    now = now or logs.now_utc()
    monitoring = config.monitoring
    files = logs.list_log_files(config.request_log_dir, config.model_name)
    current, previous = logs.WindowStatistics(), logs.WindowStatistics()
    if window.last is not None:
        print(f"reading the last {window.last:,} requests of {config.model_name} (and the {window.last:,} before) "
              f"from {config.request_log_dir}", file=out, flush=True)
        logs.read_last(files, window.last, current, previous, _progress(out))
    else:
        print(f"reading the requests of {config.model_name} logged from {logs.utc_text(window.since)} to "
              f"{logs.utc_text(window.until)} (and as long before) from {config.request_log_dir}", file=out, flush=True)
        logs.read_time_windows(files, window.since, window.until, current, previous, _progress(out))

    print(f"  read {len(current.files)} log file(s): {current.total_requests:,} requests in the window, "
          f"{previous.total_requests:,} in the one before", file=out, flush=True)
    if version is None and current.requests:
        version = current.requests.most_common(1)[0][0]
    if version is not None and version not in current.requests:
        raise MonitorError(f"no logged request of the window was answered by version {version}; the window's "
                           f"versions are {', '.join(map(str, sorted(current.requests))) or 'none'}.")
    requests = current.requests.get(version, 0) if version is not None else 0
    judged = gate.enough(requests, monitoring.min_requests)
    previous_problem = gate.previous_window_problem(previous.total_requests, requests, monitoring.min_requests)
    previous_judged = not previous_problem
    note = "" if judged else (f"{requests:,} requests in the window, fewer than monitoring.min_requests "
                              f"({monitoring.min_requests:,}): nothing judged")
    verdicts: list[gate.FeatureVerdict] = []
    training = serving = before = None
    if judged:
        print(f"statistics of {requests:,} requests answered by version {version}; judging them against its "
              "training data", file=out, flush=True)
        schema, training = training_data(config, version)
        serving = current.statistics(version)
        before = previous.statistics() if previous_judged else None
        verdicts = gate.judge(schema, training, serving, before, monitoring)

    finished = logs.now_utc()
    folder = _output_folder(config, finished)
    paths = {"html": posixpath.join(folder, PAGE_FILE), "json": posixpath.join(folder, RECORD_FILE),
             "prom": posixpath.join(folder, METRICS_FILE)}
    flagged = gate.crossed(verdicts)
    record = {
        "model": config.model_name,
        "version": version,
        "judged": judged,
        "note": note,
        "asked": {"since": logs.utc_text(window.since) if window.since else None,
                  "until": logs.utc_text(window.until) if window.until else None, "last": window.last},
        "log_dir": config.request_log_dir,
        "window": _window_record(current, version),
        "previous": {**_window_record(previous, None), "judged": judged and previous_judged,
                     "note": previous_problem},
        "thresholds": {key: getattr(monitoring, key) for key in MONITORING_THRESHOLDS},
        "min_requests": monitoring.min_requests,
        "features": [_feature_record(v, training, serving, before) for v in verdicts],
        "flagged": flagged,
        "exit_code": EXIT_CROSSED if flagged else EXIT_OK,
        "started_at": logs.utc_text(now),
        "finished_at": logs.utc_text(finished),
        "finished_at_seconds": finished.timestamp(),
        "files": paths,
        # What `mlops monitor --retrain` did about it (monitoring/retrain.py); None without --retrain.
        "retrain": None,
    }
    _write(paths["json"], json.dumps(record, indent=1) + "\n")
    _write(paths["html"], page.monitor_html(record))
    metrics = prometheus.exposition(record)
    _write(paths["prom"], metrics)
    # The newest figures at one path per model, for node-exporter's --collector.textfile.directory.
    _write(posixpath.join(config.monitoring_dir, f"{config.model_name}.prom"), metrics)
    push_error = None
    target = pushgateway if pushgateway is not None else monitoring.pushgateway
    if target:
        try:
            prometheus.push(target, monitoring.pushgateway_job, config.model_name, metrics,
                            monitoring.request_timeout_seconds)
        except prometheus.PushError as e:
            push_error = str(e)
    code = record["exit_code"] if record["exit_code"] or push_error is None else EXIT_PUSH_FAILED
    return MonitorResult(record, folder, code, push_error)


def _feature_record(verdict: gate.FeatureVerdict, training: Any, serving: Any, before: Any) -> dict[str, Any]:
    def distance(d: gate.Distance | None) -> dict[str, Any] | None:
        if d is None:
            return None
        return {"measure": d.measure, "value": d.value, "threshold": d.threshold, "crossed": d.crossed}

    return {
        "name": verdict.name,
        "kind": verdict.kind,
        "skew": distance(verdict.skew),
        "drift": distance(verdict.drift),
        "anomalies": list(verdict.anomalies),
        "flagged": verdict.flagged,
        "distributions": {"training": distribution(training, verdict.name),
                          "serving": distribution(serving, verdict.name),
                          "previous": distribution(before, verdict.name)},
    }


def rewrite_record(record: dict[str, Any]) -> None:
    """Writes `record` again, and the page drawn from it, at the paths it names (after --retrain added its entry)."""
    from monitoring import page

    _write(record["files"]["json"], json.dumps(record, indent=1) + "\n")
    _write(record["files"]["html"], page.monitor_html(record))


def read_record(folder: str) -> dict[str, Any]:
    """A run's record, read back from its folder."""
    import tensorflow as tf

    with tf.io.gfile.GFile(posixpath.join(folder, RECORD_FILE)) as f:
        return json.load(f)
