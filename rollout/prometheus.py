"""The servers' own TF Serving counters as a Prometheus server scraped them, through its HTTP API (Prometheus 2.42,
https://prometheus.io/docs/prometheus/2.42/querying/api/: GET /api/v1/query and /api/v1/query_range, a JSON envelope
{"status": "success" | "error", "data": {"resultType", "result"}, "errorType", "error"}).

A snapshot reads raw samples, not rates: a range selector `metric[d]` answers a matrix of every sample scraped in the
last `d` with its timestamp, and the latest one of each series is the counter as the server reported it, so the
difference of two snapshots is exactly what the servers counted in between. `up`, which Prometheus writes for every
scrape of every target (1: scraped, 0: failed), names the servers each track should have and whether their last
scrape worked. The same PromQL serves the local stack (rollout/local_stack.py) and Kubernetes: the track is
a target label (`rollout.prometheus.track_label`), further matchers come from `rollout.prometheus.selector`."""
from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from rollout.backends import TRACKS, BackendError
from rollout.metrics import (
    PREDICTION_APIS,
    REQUEST_COUNT,
    REQUEST_LATENCY_BUCKET,
    MetricsError,
    MetricsSource,
    ModelCounters,
    Snapshot,
)
from serving.server.monitoring import VERIFIER_REQUEST_COUNT

# A snapshot reads the targets' scrapes and the servers' series apart; it reads them again, up to this many times in
# all, while a scrape stored in between makes them disagree, and then counts the servers concerned as missing.
SNAPSHOT_READS = 5


class PrometheusError(MetricsError, BackendError):
    """Prometheus could not be reached or refused a query; the message says which and what to check. A window that
    meets it is inconclusive (MetricsError)."""


def _quote(value: str) -> str:
    return json.dumps(value)  # a PromQL string literal: double quotes, backslash escapes


class PrometheusSource(MetricsSource):
    name = "prometheus"

    def __init__(self, url: str, track_label: str = "track", selector: str = "", scrape_interval_s: float = 5.0,
                 timeout_s: float = 10.0, tracks: tuple[str, ...] = TRACKS,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> None:
        self.url = url.rstrip("/")
        self.track_label = track_label
        self.selector = selector.strip().strip(",")
        self.scrape_interval_s = scrape_interval_s
        self.timeout_s = timeout_s
        self.tracks = tracks
        self.clock = clock
        self.sleep = sleep

    # -------------------------------------------------------------------------------------------- the HTTP API
    def _get(self, path: str, params: dict[str, str]) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as e:
            # 400 (bad parameters), 422 (the expression cannot run) and 503 (timeout) carry the JSON error object.
            try:
                body = json.loads(e.read())
            except ValueError:
                raise PrometheusError(f"Prometheus at {self.url} answered {e.code} {e.reason} to {path}; check "
                                      "rollout.prometheus.url.") from None
        except (OSError, ValueError) as e:
            raise PrometheusError(f"cannot query Prometheus at {self.url} ({e}); start it (`mlops deploy local`) or "
                                  "fix rollout.prometheus.url.") from None
        if body.get("status") != "success":
            raise PrometheusError(f"Prometheus at {self.url} refused the query {params.get('query')!r} "
                                  f"({body.get('errorType')}: {body.get('error')}); check rollout.prometheus.selector "
                                  "and track_label.")
        return body["data"]

    def query(self, promql: str, at: float | None = None) -> tuple[str, list[dict[str, Any]]]:
        """An instant query: (resultType, result)."""
        params = {"query": promql, "timeout": f"{max(1, int(self.timeout_s))}s"}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params)
        return data["resultType"], data["result"]

    def query_range(self, promql: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
        """A range query: one series a result, each with `values` [[timestamp, "value"], ...]."""
        data = self._get("/api/v1/query_range", {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                  "step": f"{max(step_s, 0.001):.3f}",
                                                  "timeout": f"{max(1, int(self.timeout_s))}s"})
        return data["result"]

    # ------------------------------------------------------------------------------------------------ the PromQL
    def matchers(self, *extra: str) -> str:
        tracks = "|".join(self.tracks)
        parts = [f"{self.track_label}=~{_quote(tracks)}", *extra]
        if self.selector:
            parts.append(self.selector)
        return ",".join(parts)

    def series(self, metric: str, model: str, *extra: str) -> str:
        """The selector of `metric` for `model` on both tracks' servers."""
        return f"{{__name__={_quote(metric)},{self.matchers(f'model_name={_quote(model)}', *extra)}}}"

    def _lookback(self) -> str:
        # Long enough to hold each target's last scrape (and one before it, should a scrape be slow).
        return f"{max(1000, int(4000 * self.scrape_interval_s))}ms"

    def _latest(self, selector: str, at: float | None) -> list[tuple[dict[str, str], float, float]]:
        """(labels, timestamp, value) of the latest raw sample of every series `selector` matches."""
        kind, result = self.query(f"{selector}[{self._lookback()}]", at)
        if kind != "matrix":
            raise PrometheusError(f"Prometheus at {self.url} answered a {kind} to a range selector; is it Prometheus?")
        latest = []
        for series in result:
            if series.get("values"):
                timestamp, value = series["values"][-1]
                latest.append((series["metric"], float(timestamp), float(value)))
        return latest

    def _targets(self, at: float | None) -> dict[tuple[str, str], tuple[float, float]]:
        """(track, instance) -> (timestamp, up) of every target's latest scrape."""
        targets = {}
        for labels, timestamp, value in self._latest(f"up{{{self.matchers()}}}", at):
            targets[(labels.get(self.track_label, ""), labels.get("instance", ""))] = (timestamp, value)
        return targets

    def snapshot(self, model: str, fresh_after: float | None = None) -> Snapshot:
        """Every server's counters from a scrape that started after `fresh_after`, or after this call without one: a
        window's `before` then holds every request made before it (the verifier's golden requests), not only those
        up to the last scrape. It waits a few scrape intervals at most; a server still without such a scrape is
        `missing`."""
        fresh_after = self.clock() if fresh_after is None else fresh_after
        deadline = self.clock() + 3 * self.scrape_interval_s + 1.0
        while True:
            now = self.clock()
            targets = self._targets(now)
            stale = [key for key, (timestamp, _) in targets.items() if timestamp <= fresh_after]
            if not stale or now >= deadline:
                break
            self.sleep(min(self.scrape_interval_s / 4, max(0.0, deadline - now)))
        apis = _quote("(?i)" + "|".join(PREDICTION_APIS))
        for _ in range(SNAPSHOT_READS):
            missing: dict[str, list[str]] = {track: [] for track in self.tracks}
            scraped: dict[tuple[str, str], float] = {}
            for (track, instance), (timestamp, up) in sorted(targets.items()):
                if up != 1 or (track, instance) in stale:
                    missing.setdefault(track, []).append(instance)
                else:
                    scraped[(track, instance)] = timestamp
            counts = self._latest(self.series(REQUEST_COUNT, model), now)
            latencies = self._latest(self.series(REQUEST_LATENCY_BUCKET, model, f"API=~{apis}"), now)
            # A scrape that started before `now` but was stored between the queries: its samples are newer than
            # the targets' read, and the three reads are taken again together.
            newer = {key for labels, timestamp, _ in [*counts, *latencies]
                     if timestamp > scraped.get(key := (labels.get(self.track_label, ""), labels.get("instance", "")),
                                                math.inf)}
            if not newer:
                break
            targets = self._targets(now)
        for track, instance in newer:
            del scraped[(track, instance)]
            missing.setdefault(track, []).append(instance)
        requests: dict[tuple[str, str], dict[str, float]] = {key: {} for key in scraped}
        buckets: dict[tuple[str, str], dict[float, float]] = {key: {} for key in scraped}
        for labels, timestamp, value in counts:
            key = (labels.get(self.track_label, ""), labels.get("instance", ""))
            # Only the samples of the target's latest scrape: an older one is a series that scrape no longer had.
            if scraped.get(key) == timestamp:
                status = labels.get("status", "OK")
                requests[key][status] = requests[key].get(status, 0.0) + value
        for labels, timestamp, value in latencies:
            key = (labels.get(self.track_label, ""), labels.get("instance", ""))
            if scraped.get(key) == timestamp:
                le = labels.get("le", "+Inf")
                bound = math.inf if le in ("+Inf", "Inf") else float(le)
                buckets[key][bound] = buckets[key].get(bound, 0.0) + value
        counters: dict[str, dict[str, ModelCounters]] = {track: {} for track in self.tracks}
        for track, instance in scraped:
            counters.setdefault(track, {})[instance] = ModelCounters(requests[(track, instance)],
                                                                     buckets[(track, instance)])
        return Snapshot(counters, {track: servers for track, servers in missing.items() if servers})

    # ----------------------------------------------------------------------------------- figures over time
    def traffic(self, model: str, start: float, end: float, step_s: float | None = None) -> dict[str, Any]:
        """Per track from `start` to `end`, as Prometheus's query_range computes them: the users' requests per second
        (predictions and failed requests, less the verifier's predictions, which the servers count apart), their error
        rate, the verifier's predictions per second, and the p99 latency (ms) of every prediction (a histogram
        cannot be split after the fact): {"times": [...], "tracks": {track: {figure: [value or None]}}}."""
        step_s = step_s or max(self.scrape_interval_s, (end - start) / 200)
        window = f"{max(1000, int(1000 * max(4 * self.scrape_interval_s, 2 * step_s)))}ms"
        label = self.track_label
        apis = _quote("(?i)" + "|".join(PREDICTION_APIS))
        latency = self.series(REQUEST_LATENCY_BUCKET, model, f"API=~{apis}")

        def rate(selector: str) -> str:
            return f"sum by ({label}) (rate({selector}[{window}]))"

        total = rate(self.series(REQUEST_COUNT, model))

        def or_zero(selector: str) -> str:
            # Zero where a track counted requests but has no series of this kind (no error, no verifier yet).
            return f"({rate(selector)} or {total} * 0)"

        not_ok, every = 'status!="OK"', 'le="+Inf"'
        predictions = or_zero(self.series(REQUEST_LATENCY_BUCKET, model, f"API=~{apis}", every))
        failed = or_zero(self.series(REQUEST_COUNT, model, not_ok))
        verifier = self.series(VERIFIER_REQUEST_COUNT, model)
        # Each rate is extrapolated over its own samples: a difference of two can dip below zero by a little.
        users = f"clamp_min({predictions} + {failed} - {or_zero(verifier)}, 0)"
        user_errors = f"clamp_min({failed} - {or_zero(self.series(VERIFIER_REQUEST_COUNT, model, not_ok))}, 0)"
        queries = {
            "user_requests_per_second": users,
            "error_rate": f"clamp_max({user_errors} / {users}, 1)",
            "verifier_requests_per_second": rate(verifier),
            "p99_ms": f"histogram_quantile(0.99, sum by ({label}, le) (rate({latency}[{window}]))) / 1000",
        }
        count = int(math.floor((end - start) / step_s)) + 1
        times = [round(start + i * step_s, 3) for i in range(count)]
        tracks: dict[str, dict[str, list[float | None]]] = {
            track: {figure: [None] * count for figure in queries} for track in self.tracks}
        for figure, promql in queries.items():
            for series in self.query_range(promql, start, start + (count - 1) * step_s, step_s):
                track = series["metric"].get(label, "")
                if track not in tracks:
                    continue
                for timestamp, value in series["values"]:
                    i = round((float(timestamp) - start) / step_s)
                    number = float(value)
                    if 0 <= i < count and math.isfinite(number):
                        tracks[track][figure][i] = number
        return {"times": times, "tracks": tracks}


def source_for(settings, default_selector: str = "") -> PrometheusSource | None:
    """The configured Prometheus (`rollout.prometheus`), or None when its url is empty; `default_selector` stands
    in for an empty rollout.prometheus.selector."""
    if not settings.url:
        return None
    return PrometheusSource(settings.url, settings.track_label, settings.selector or default_selector,
                            settings.scrape_interval_seconds, settings.request_timeout_seconds)
