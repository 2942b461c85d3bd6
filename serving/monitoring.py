"""TF Serving's Prometheus metrics, as `mlops serve` answers them at /monitoring/prometheus/metrics: the same names,
labels and semantics as TF Serving 2.16.1 with a MonitoringConfig that enables prometheus_config (see
serving/rollout/metrics.py for the source files): `:tensorflow:serving:request_count{model_name,status}` over every
request that names a model, and the histogram `:tensorflow:serving:request_latency{model_name,API,entrypoint}` of
successful ones, in microseconds with buckets 10 * 1.8^i."""
from __future__ import annotations

import bisect
import threading

METRICS_PATH = "/monitoring/prometheus/metrics"
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

    def record(self, model: str, status: str, api: str, entrypoint: str, seconds: float) -> None:
        """One request naming `model` ended with canonical code `status` ("OK" for success) after `seconds`."""
        if not model:
            return
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
        return "\n".join(lines) + "\n"
