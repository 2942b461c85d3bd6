"""TF Serving's Prometheus metrics, as `mlops serve` answers them at /monitoring/prometheus/metrics: the same names,
labels and semantics as TF Serving 2.16.1 with a MonitoringConfig that enables prometheus_config (see
rollout/metrics.py for the source files): `:tensorflow:serving:request_count{model_name,status}` over every
request that names a model, and the histogram `:tensorflow:serving:request_latency{model_name,API,entrypoint}` of
successful ones, in microseconds with buckets 10 * 1.8^i; and with request logging on (serving/server/request_log.py),
`:mlops:serving:request_log_count{model_name,status}` of sampled predictions written, dropped (the writer's queue was
full) or failed (the write raised); and `:mlops:serving:verifier_request_count{model_name,status}`, the predictions
the rollout's verifier sent (serving.TRAFFIC_HEADER), which request_count counts too: the users' are the difference."""
from __future__ import annotations

import bisect
import threading

from serving.server.answers import RecentAnswers
from serving.server.failures import RecentFailures

METRICS_PATH = "/monitoring/prometheus/metrics"
# Not TF Serving's own :tensorflow:serving:request_log_count: its page always declares that family, empty
# (core/request_logger.cc, util/prometheus_exporter.cc GeneratePage, 2.16.1), and `mlops log-proxy` appends this
# family to that page, where a second declaration of one name would make Prometheus reject the whole scrape.
REQUEST_LOG_COUNT = ":mlops:serving:request_log_count"
VERIFIER_REQUEST_COUNT = ":mlops:serving:verifier_request_count"
# verifier: predictions the rollout's verifier sent (serving.TRAFFIC_HEADER), left out of the logs.
REQUEST_LOG_STATUSES = ("written", "dropped", "failed", "verifier")
# TF Serving's request_latency buckets (servables/tensorflow/util.cc: ExponentialBuckets(10, 1.8, 33)).
LATENCY_BOUNDS_US = [10 * 1.8**i for i in range(33)]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class RequestMetrics:
    """Cumulative counters of one server process, safe to update from the event loop and worker threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str], int] = {}
        # (model, API, entrypoint) -> per-bucket counts (the last one +Inf), sum of microseconds
        self._latency: dict[tuple[str, str, str], tuple[list[int], float]] = {}
        # What the request logger did with the sampled predictions: on the same page.
        self.request_log = RequestLogMetrics()
        self.verifier = VerifierRequestCount()
        # The newest failed predictions with their inputs, read at FAILURES_PATH beside this page.
        self.failures = RecentFailures()
        # The newest answers to requests with an id (the router's), read at ANSWERS_PATH by the shadow step.
        self.answers = RecentAnswers()

    def record(self, model: str, status: str, api: str, entrypoint: str, seconds: float,
               verifier: bool = False) -> None:
        """One request naming `model` ended with canonical code `status` ("OK" for success) after `seconds`;
        `verifier`: a prediction the rollout's verifier marked, counted apart as well."""
        if not model:
            return
        if verifier:
            self.verifier.count(model, status)
        micros = seconds * 1e6
        with self._lock:
            self._requests[(model, status)] = self._requests.get((model, status), 0) + 1
            if status != "OK":  # as TF Serving: latency of successful requests only
                return
            counts, total = self._latency.get((model, api, entrypoint), ([0] * (len(LATENCY_BOUNDS_US) + 1), 0.0))
            counts[bisect.bisect_left(LATENCY_BOUNDS_US, micros)] += 1
            self._latency[(model, api, entrypoint)] = (counts, total + micros)

    def text(self) -> str:
        """The Prometheus text exposition format (version 0.0.4)."""
        with self._lock:
            requests = sorted(self._requests.items())
            latency = sorted((key, (list(counts), total)) for key, (counts, total) in self._latency.items())
        lines = ["# TYPE :tensorflow:serving:request_count counter"]
        for (model, status), count in requests:
            lines.append(f':tensorflow:serving:request_count{{model_name="{_escape(model)}",'
                         f'status="{_escape(status)}"}} {count}')
        lines.append("# TYPE :tensorflow:serving:request_latency histogram")
        for (model, api, entrypoint), (counts, total) in latency:
            labels = f'model_name="{_escape(model)}",API="{_escape(api)}",entrypoint="{entrypoint}"'
            cumulative = 0
            for bound, count in zip([*LATENCY_BOUNDS_US, None], counts, strict=True):
                cumulative += count
                le = "+Inf" if bound is None else f"{bound:.6g}"
                lines.append(f':tensorflow:serving:request_latency_bucket{{{labels},le="{le}"}} {cumulative}')
            lines.append(f":tensorflow:serving:request_latency_sum{{{labels}}} {total:.17g}")
            lines.append(f":tensorflow:serving:request_latency_count{{{labels}}} {cumulative}")
        return "\n".join(lines) + "\n" + self.request_log.text() + self.verifier.text()


class VerifierRequestCount:
    """The rollout verifier's predictions by model and status, which request_count and the latency histogram count
    too: a chart of the users' traffic subtracts them (rollout/prometheus.py PrometheusSource.traffic)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}

    def count(self, model: str, status: str) -> None:
        with self._lock:
            self._counts[(model, status)] = self._counts.get((model, status), 0) + 1

    def text(self) -> str:
        """The family in the Prometheus text format; empty until the verifier sent a prediction."""
        with self._lock:
            counts = sorted(self._counts.items())
        if not counts:
            return ""
        lines = [f"# TYPE {VERIFIER_REQUEST_COUNT} counter"]
        for (model, status), count in counts:
            lines.append(f'{VERIFIER_REQUEST_COUNT}{{model_name="{_escape(model)}",status="{_escape(status)}"}} '
                         f"{count}")
        return "\n".join(lines) + "\n"


class RequestLogMetrics:
    """Predictions by model and outcome: sampled and written, dropped or failed, or the verifier's (not logged); each
    model's four start at 0."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}

    def count(self, model: str, status: str, records: int = 1) -> None:
        if status not in REQUEST_LOG_STATUSES:
            raise ValueError(f"request log status must be one of {', '.join(REQUEST_LOG_STATUSES)}; got {status!r}.")
        with self._lock:
            if (model, status) not in self._counts:
                for each in REQUEST_LOG_STATUSES:
                    self._counts.setdefault((model, each), 0)
            self._counts[(model, status)] += records

    def value(self, model: str, status: str) -> int:
        with self._lock:
            return self._counts.get((model, status), 0)

    def text(self) -> str:
        """The family in the Prometheus text format; empty until a sampled prediction was counted."""
        with self._lock:
            counts = sorted(self._counts.items())
        if not counts:
            return ""
        lines = [f"# TYPE {REQUEST_LOG_COUNT} counter"]
        for (model, status), count in counts:
            lines.append(f'{REQUEST_LOG_COUNT}{{model_name="{_escape(model)}",status="{status}"}} {count}')
        return "\n".join(lines) + "\n"
