"""TF Serving's Prometheus metrics (`--monitoring_config_file`): request counts by status and the latency histogram,
turned into the error rate and p99 latency of a window (the difference of two scrapes).

What TF Serving 2.16.1 exports, from its source (tensorflow/serving at tag 2.16.1):
- servables/tensorflow/util.cc defines the counter `/tensorflow/serving/request_count` (labels model_name, status:
  the canonical code name, "OK" for success) and the histogram `/tensorflow/serving/request_latency` (labels
  model_name, API, entrypoint; microseconds, buckets 10 * 1.8^i);
- util/prometheus_exporter.cc turns every character outside [a-zA-Z0-9_] into ':' (hence
  `:tensorflow:serving:request_count`) and writes a histogram as `_bucket{...,le="..."}` (cumulative, the last
  `le="+Inf"`), `_sum` and `_count`, at `/monitoring/prometheus/metrics` unless the MonitoringConfig names a path;
- model_servers/http_server.cc counts every REST request that names a model, model status and metadata GETs
  (readiness probes included) as well as predictions, and records latency only for successful requests, with API
  "predict"/"classify"/"regress" (REST; "" for GETs) or "Predict"/"Classify"/"Regress" (gRPC) and entrypoint
  "REST" or "GRPC" (model_servers/prediction_service_impl.cc).
So the error rate is over every request naming the model (probes dilute it slightly), and p99 is that of successful
prediction requests only.
"""
from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

REQUEST_COUNT = ":tensorflow:serving:request_count"
REQUEST_LATENCY_BUCKET = ":tensorflow:serving:request_latency_bucket"
# Latency of these APIs only: status and metadata GETs (API "") are not predictions.
PREDICTION_APIS = ("predict", "classify", "regress")
_SAMPLE = re.compile(r'^(?P<name>[^\s{]+)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_prometheus_text(text: str) -> list[Sample]:
    """The samples of a Prometheus text exposition (comments and blank lines skipped)."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match.group("labels") or ""))
        samples.append(Sample(match.group("name"), labels, float(match.group("value"))))
    return samples


@dataclass(frozen=True)
class ModelCounters:
    """Cumulative counters of one model on one server: requests by status, latency buckets (microseconds)."""

    requests: dict[str, float]
    latency_buckets: dict[float, float]


def model_counters(samples: Iterable[Sample], model: str) -> ModelCounters:
    requests: dict[str, float] = {}
    buckets: dict[float, float] = {}
    for sample in samples:
        if sample.name == REQUEST_COUNT and sample.labels.get("model_name") == model:
            status = sample.labels.get("status", "OK")
            requests[status] = requests.get(status, 0.0) + sample.value
        elif (sample.name == REQUEST_LATENCY_BUCKET and sample.labels.get("model_name") == model
              and sample.labels.get("API", "").lower() in PREDICTION_APIS):
            bound = math.inf if sample.labels.get("le") in ("+Inf", "Inf") else float(sample.labels.get("le", "inf"))
            buckets[bound] = buckets.get(bound, 0.0) + sample.value
    return ModelCounters(requests, buckets)


def _add(total: dict, part: Mapping) -> None:
    for key, value in part.items():
        total[key] = total.get(key, 0.0) + value


def p99_ms(buckets: Mapping[float, float]) -> float:
    """The 99th percentile (ms) of cumulative counts by bucket bound (µs), interpolated linearly inside its bucket as
    Prometheus' histogram_quantile does (promql/quantile.go, bucketQuantile; the first bucket starts at 0), so that
    the local gate and the Prometheus one judge the same figure; 0.0 for no request. One difference, on purpose: a
    percentile beyond the highest finite bound is +Inf here (a gate then fails), where Prometheus reports that
    bound."""
    cumulative = sorted(buckets.items())
    if not cumulative or cumulative[-1][1] <= 0:
        return 0.0
    rank = 0.99 * cumulative[-1][1]
    index = next(i for i, (_, count) in enumerate(cumulative) if count >= rank)
    end, count = cumulative[index]
    if math.isinf(end):
        return math.inf
    start, below = cumulative[index - 1] if index > 0 else (0.0, 0.0)
    return (start + (end - start) * (rank - below) / (count - below)) / 1000.0


def _delta(before: Mapping, after: Mapping) -> dict | None:
    """after - before per key, or None when a counter went down (the server restarted: the delta is unknown)."""
    delta = {}
    for key in set(before) | set(after):
        change = after.get(key, 0.0) - before.get(key, 0.0)
        if change < 0:
            return None
        delta[key] = change
    return delta


def window_figures(before: Snapshot, after: Snapshot, track: str) -> dict[str, Any]:
    """The requests one track's servers counted between two snapshots: requests, errors, error rate, successful
    predictions, p99 latency (ms). A server that joined (a pod the HPA added: unknown to the first snapshot, not a
    failed scrape there) is counted whole, as its counters began at zero when it started; `joined` names it.
    `inconclusive` says why the figures cannot be trusted: a server not scraped, a server that left, a counter that
    went down."""
    was, now = before.counters.get(track, {}), after.counters.get(track, {})
    figures: dict[str, Any] = {"servers": len(now), "requests": 0.0, "errors": 0.0, "error_rate": 0.0,
                               "predictions": 0.0, "p99_ms": 0.0}
    missing = sorted(set(before.missing.get(track, [])) | set(after.missing.get(track, [])))
    if missing:
        figures["inconclusive"] = f"no metrics from the {track} server(s) {', '.join(missing)} (failed scrape)"
        return figures
    left = sorted(set(was) - set(now))
    if left:
        figures["inconclusive"] = (f"the {track} server(s) {', '.join(left)} left during the window (scaled down or "
                                   "replaced): what they answered after the first snapshot is unknown")
        return figures
    joined = sorted(set(now) - set(was))
    requests: dict[str, float] = {}
    buckets: dict[float, float] = {}
    for server in sorted(now):
        start = was.get(server, ModelCounters({}, {}))
        counted = _delta(start.requests, now[server].requests)
        latency = _delta(start.latency_buckets, now[server].latency_buckets)
        if counted is None or latency is None:
            figures["inconclusive"] = f"the counters of {track} server {server} went down (it restarted)"
            return figures
        _add(requests, counted)
        _add(buckets, latency)
    total = sum(requests.values())
    errors = total - requests.get("OK", 0.0)
    figures.update(requests=total, errors=errors, error_rate=errors / total if total else 0.0,
                   predictions=buckets.get(math.inf, 0.0), p99_ms=p99_ms(buckets))
    if joined:
        figures["joined"] = joined
    return figures


@dataclass(frozen=True)
class Snapshot:
    """Every server's cumulative counters of one model at one moment, by track and server (a Prometheus `instance`,
    or a pod); `missing` names, per track, the servers that should have been counted and were not (a failed scrape:
    `up == 0`, or no sample fresh enough)."""

    counters: dict[str, dict[str, ModelCounters]]
    missing: dict[str, list[str]] = field(default_factory=dict)


class MetricsError(RuntimeError):
    """The metrics source could not be read; the window it was for is inconclusive."""


class MetricsSource(ABC):
    """Where a verification window's figures come from: the servers' own TF Serving metrics, as a monitoring system
    scraped them (rollout/prometheus.py). The same PromQL serves the local stack and Kubernetes."""

    name = "metrics"

    @abstractmethod
    def snapshot(self, model: str, fresh_after: float | None = None) -> Snapshot:
        """The counters of `model` on every server of both tracks from a scrape that started after `fresh_after` (a
        time.time(); without one, after this call), waiting a few scrape intervals at most for it (a server without
        one is `missing`): requests made before the call are in it. Raises MetricsError when the source cannot be
        read."""
