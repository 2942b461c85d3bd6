"""The checks before each traffic step: golden requests (eval rows) answered by the candidate over REST and gRPC must
agree with the stable version on every row and output; then a window of the users' requests, as the servers counted
them, judges the canary's errors against stable's and against the limit by exact tests sized by evidence
(rollout/evidence.py), and its p99 latency within absolute bounds and relative to stable's over the same window.

A window decides only on figures it can trust. A server missing from a scrape, a counter that went down, or a canary
share of the user traffic far from the step's weight make it inconclusive, and so do fewer canary user requests than
the step needs once its extensions ran out: never a pass (the controller retries, then rolls back or pauses)."""
from __future__ import annotations

import csv
import math
import posixpath
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rollout.backends import Backend, Endpoint
from rollout.evidence import EvidenceRules, above_limit_p_value, canary_worse_p_value, min_canary_requests
from rollout.metrics import MetricsError, Snapshot, window_figures
from rollout.shadow import AnswerReader, Comparison, ShadowLimits, compare
from rollout.shadow import judge as judge_shadow
from serving import TRAFFIC_HEADER, VERIFIER_TRAFFIC
from settings.errors import UserError


class GoldenDataError(UserError, ValueError):
    """No golden rows could be read; the message names the path to fix."""

    exit_code = 2


def _csv_rows(path: str, count: int) -> list[dict[str, Any]]:
    from tensorflow.io import gfile

    files = sorted(gfile.glob(path.rstrip("/") + "/*.csv")) if gfile.isdir(path) else [path]
    rows: list[dict[str, Any]] = []
    for file in files:
        with gfile.GFile(file) as f:
            for row in csv.DictReader(f):
                rows.append(row)
                if len(rows) == count:
                    return rows
    return rows


def _eval_split_rows(pipeline_root: str, count: int) -> list[dict[str, Any]]:
    import tensorflow as tf

    # tf.io.gfile, not glob: the pipeline root may be on object storage (gs://, `artifact_root`).
    splits = sorted(tf.io.gfile.glob(posixpath.join(pipeline_root, "CsvExampleGen", "examples", "*", "Split-eval")),
                    key=lambda p: int(p.rstrip("/").split("/")[-2]))
    if not splits:
        return []
    files = sorted(tf.io.gfile.glob(posixpath.join(splits[-1], "*.gz")))
    rows = []
    for record in tf.data.TFRecordDataset(files, compression_type="GZIP").take(count):
        example = tf.train.Example.FromString(record.numpy())
        row: dict[str, Any] = {}
        for name, feature in example.features.feature.items():
            values = getattr(feature, feature.WhichOneof("kind") or "bytes_list").value
            value = values[0] if values else ""
            row[name] = value.decode() if isinstance(value, bytes) else value
        rows.append(row)
    return rows


def load_golden_rows(golden_data: str, pipeline_root: str, count: int) -> list[dict[str, Any]]:
    """`count` eval rows: from `golden_data` (a CSV file or a folder of them) or the pipeline's newest eval split, on
    a local disk or object storage (any URI tf.io.gfile reads)."""
    from tensorflow.io import gfile

    if golden_data:
        if not gfile.exists(golden_data):
            raise GoldenDataError(f"rollout.golden_data {golden_data} does not exist; point it at a CSV file or "
                                  "folder of eval rows, or leave it empty to use the pipeline's eval split.")
        rows = _csv_rows(golden_data, count)
    else:
        rows = _eval_split_rows(pipeline_root, count)
    if not rows:
        raise GoldenDataError(f"no golden rows found in {golden_data or pipeline_root + ' (eval split)'}; run the "
                              "pipeline first or set rollout.golden_data to a CSV of eval rows.")
    return rows


@dataclass(frozen=True)
class Limits:
    max_abs_diff: float
    max_error_rate: float
    max_p99_ms: float
    window_seconds: float
    requests_per_second: float
    timeout_s: float
    max_error_rate_increase: float = 0.005
    max_p99_ratio: float = 3.0
    share_tolerance_sigmas: float = 4.0
    min_error_rate_regression: float = 0.05
    detection_power: float = 0.95
    false_rollback_rate: float = 0.01
    max_window_extensions: int = 4
    # Steps with user traffic in the rollout (rollout.steps): the false-rollback rate is shared among them.
    user_steps: int = 1
    # The golden rows' decisions against stable's (rollout.shadow.max_disagreement_rate and max_relative_error).
    max_disagreement_rate: float = 0.01
    max_relative_error: float = 0.05

    def evidence_rules(self) -> EvidenceRules:
        return EvidenceRules(self.max_error_rate, self.max_error_rate_increase, self.min_error_rate_regression,
                             self.detection_power, self.false_rollback_rate, self.user_steps,
                             1 + self.max_window_extensions)


# Below this many user requests in a window the canary's share of them is not judged, nor stable's p99 used as a
# reference: too few to tell.
MIN_SHARE_REQUESTS = 20
# A canary that got none of a window's user requests at a non-zero step fails once that is this improbable by chance
# ((1 - weight)^n, n the user requests): the route sends it no users, whatever its other figures say.
NO_TRAFFIC_CHANCE = 0.001
PASSED, FAILED, INCONCLUSIVE = "passed", "failed", "inconclusive"
# Not a verdict: the window so far holds too few of the canary's user requests to decide, and is watched longer.
EXTEND = "extend"
# How often a shadow window reads the answers the servers kept (each keeps its newest 4096).
SHADOW_READ_S = 2.0


def compare_answers(reference: list[dict[str, Any]], answers: list[dict[str, Any]],
                    decision: str = "") -> tuple[float, str]:
    """The largest difference between two answers' numbers over every row and output, and what else differs (rows,
    output names, non-numeric outputs such as class names, except `decision`, which two versions may differ on);
    "" when nothing does."""
    from serving.clients import numeric_values

    if len(answers) != len(reference):
        return math.inf, f"{len(answers)} rows answered for {len(reference)} asked"
    worst = 0.0
    for index, (expected, got) in enumerate(zip(reference, answers, strict=True)):
        if sorted(expected) != sorted(got):
            return math.inf, f"row {index} has outputs {sorted(got)}, stable answers {sorted(expected)}"
        for name in sorted(expected):
            if name != decision and numeric_values({name: expected[name]}) == [] and expected[name] != got[name]:
                return math.inf, f"row {index} output {name!r} is {got[name]!r}, stable answers {expected[name]!r}"
        a, b = numeric_values(expected), numeric_values(got)
        if len(a) != len(b):
            return math.inf, f"row {index} has {len(b)} numbers, stable answers {len(a)}"
        worst = max([worst, *(abs(x - y) for x, y in zip(a, b, strict=True))])
    return worst, ""


def percentile_99(latencies_ms: list[float]) -> float:
    """The nearest-rank 99th percentile; inf for no latency at all."""
    if not latencies_ms:
        return math.inf
    ordered = sorted(latencies_ms)
    return ordered[math.ceil(0.99 * len(ordered)) - 1]


def share_check(canary: float, stable: float, weight: int, sigmas: float) -> dict[str, Any]:
    """The canary's observed share of `canary + stable` user predictions against the step's weight, with a binomial
    tolerance of `sigmas` standard deviations (at 0% or 100%, as if one request in n went the other way); `error`
    when the canary got none of them at a non-zero step and that is under NO_TRAFFIC_CHANCE by chance."""
    n = canary + stable
    expected = weight / 100.0
    figures: dict[str, Any] = {"user_requests": n, "expected": expected}
    chance = (1.0 - expected) ** n
    if weight > 0 and canary == 0 and n > 0 and chance < NO_TRAFFIC_CHANCE:
        figures["error"] = (f"the canary got none of {n:.0f} user requests at a {weight}% step ({chance:.1e} likely "
                            "by chance): the route sends it no users")
    if n < MIN_SHARE_REQUESTS:
        figures["checked"] = False
        return figures
    observed = canary / n
    spread = math.sqrt(max(expected * (1.0 - expected), 1.0 / n) / n)
    figures.update(checked=True, observed=observed, tolerance=sigmas * spread)
    if abs(observed - expected) > sigmas * spread:
        figures["inconclusive"] = (f"the canary got {observed:.1%} of {n:.0f} user requests at a {weight}% step "
                                   f"(tolerance ±{sigmas * spread:.1%}): the route does not carry the step's weights")
    return figures


class Verifier:
    def __init__(self, backend: Backend, model: str, rows: list[dict[str, Any]], limits: Limits,
                 log: Callable[[str], None] = print, sleep: Callable[[float], None] = time.sleep,
                 clients: Callable[[Endpoint, int | None], tuple[Any, Any]] | None = None,
                 clock: Callable[[], float] = time.monotonic, shadow: ShadowLimits | None = None) -> None:
        self.backend = backend
        self.model = model
        self.rows = rows
        self.limits = limits
        self.log = log
        self.sleep = sleep
        # (REST client, gRPC client) for an endpoint and a number of retries (None: the clients' default); tests
        # script them.
        self.clients = clients or _serving_clients
        self.clock = clock
        # rollout.shadow: the 0% step compares the candidate's answers to copies of the users' requests with stable's.
        self.shadow = shadow

    def _address(self, version: int) -> dict[str, Any]:
        # A KubeDL predictor serves one version under its own numbering: ask it for its model, unversioned.
        return {"version": version} if self.backend.supports_labels else {}

    def golden(self, stable: int, candidate: int) -> dict[str, Any]:
        """Candidate vs stable on every golden row, over REST and over gRPC, on every canary server: the same rows
        and outputs; REST and gRPC answers within rollout.max_abs_diff of each other; and decisions that differ from
        stable's no more often than rollout.shadow.max_disagreement_rate, by the exact binomial test at the deciding
        look's significance. A retrained version's probabilities differ from stable's: how much is reported."""
        from serving.clients import ServingError

        opts = {"timeout": self.limits.timeout_s, "drop_unknown_features": True}
        figures: dict[str, Any] = {"rows": len(self.rows), "rest_max_abs_diff": 0.0, "grpc_max_abs_diff": 0.0,
                                   "rest_grpc_max_abs_diff": 0.0, "disagreements": 0}
        problems, transports_apart = [], []
        try:
            rest, grpc = self.clients(self.backend.endpoints("stable")[0], None)
            with rest, grpc:
                reference = rest.predict_outputs(self.rows, self.model, **self._address(stable), **opts)
            comparison = Comparison.of(self.backend.publication(self.model, stable),
                                       self.backend.publication(self.model, candidate),
                                       sorted(reference[0]) if reference else [])
            for endpoint in self.backend.endpoints("canary"):
                rest, grpc = self.clients(endpoint, None)
                with rest, grpc:
                    by_rest = rest.predict_outputs(self.rows, self.model, **self._address(candidate), **opts)
                    by_grpc = grpc.predict_outputs(self.rows, self.model, **self._address(candidate), **opts)
                for key, answers, transport in (("rest_max_abs_diff", by_rest, "REST"),
                                                ("grpc_max_abs_diff", by_grpc, "gRPC")):
                    diff, problem = compare_answers(reference, answers, decision=comparison.output)
                    figures[key] = max(figures[key], diff)
                    if problem:
                        problems.append(f"{transport} on {endpoint.rest}: {problem}")
                    else:
                        figures["disagreements"] = max(figures["disagreements"],
                                                       self._disagreements(reference, answers, comparison))
                # A shape that differs between the transports differs from stable's on one of them, reported above.
                apart = compare_answers(by_rest, by_grpc)[0]
                figures["rest_grpc_max_abs_diff"] = max(figures["rest_grpc_max_abs_diff"], apart)
                if apart > self.limits.max_abs_diff:
                    transports_apart.append(endpoint.rest)
        except (ServingError, OSError) as e:
            figures["error"] = f"golden requests failed: {e}"
            return figures
        rows, k = len(self.rows), figures["disagreements"]
        alpha = self.limits.evidence_rules().alpha(deciding=True)
        figures.update(disagreement_rate=k / rows if rows else 0.0,
                       disagreement_p=above_limit_p_value(k, rows, self.limits.max_disagreement_rate) if rows else 1.0)
        what = "values" if comparison.kind == "regression" else "decisions"
        if problems:
            figures["error"] = f"candidate {candidate} answers the golden rows unlike stable {stable}: {problems[0]}"
        elif transports_apart:
            figures["error"] = (f"candidate {candidate} answers the golden rows differently over REST and gRPC on "
                                f"{transports_apart[0]}: max |diff| {figures['rest_grpc_max_abs_diff']:.6f} > "
                                f"rollout.max_abs_diff {self.limits.max_abs_diff}")
        elif figures["disagreement_p"] <= alpha:
            figures["error"] = (f"candidate {candidate} disagrees with stable {stable} on the {what} for {k} of {rows} "
                                f"golden rows ({k / rows:.1%}): above rollout.shadow.max_disagreement_rate "
                                f"{self.limits.max_disagreement_rate} (exact binomial test, p "
                                f"{figures['disagreement_p']:.1e} <= {alpha:.1e})")
        return figures

    def _disagreements(self, reference: list[dict[str, Any]], answers: list[dict[str, Any]],
                       comparison: Comparison) -> int:
        """Rows on which the two answers disagree on `comparison`'s output (a one-number list read as its number)."""
        def value(answer: dict[str, Any]) -> Any:
            got = answer.get(comparison.output)
            return got[0] if isinstance(got, list) and len(got) == 1 else got

        return sum(comparison.disagree(value(s), value(c), self.limits.max_relative_error)
                   for s, c in zip(reference, answers, strict=True))

    def _send(self, candidate: int, track: str = "canary") -> tuple[int, list[float]]:
        """Golden rows to the track's servers for window_seconds (REST and gRPC in turn): (requests sent, latencies
        of the ones answered, ms)."""
        from serving.clients import ServingError

        # No retries: a failed request counts as failed.
        pairs = [self.clients(e, 0) for e in self.backend.endpoints(track)]
        clients = [c for pair in pairs for c in pair]
        latencies: list[float] = []
        interval = 1.0 / self.limits.requests_per_second
        deadline = self.clock() + self.limits.window_seconds
        sent = 0
        try:
            while sent == 0 or self.clock() < deadline:
                client = clients[sent % len(clients)]
                row = self.rows[sent % len(self.rows)]
                started = self.clock()
                try:
                    client.predict_outputs(row, self.model, timeout=self.limits.timeout_s,
                                           drop_unknown_features=True, **self._address(candidate))
                    latencies.append((self.clock() - started) * 1000.0)
                except (ServingError, OSError):
                    pass
                sent += 1
                self.sleep(max(0.0, interval - (self.clock() - started)))
        finally:
            for client in clients:
                client.close()
        return sent, latencies

    def window(self, candidate: int, weight: int) -> dict[str, Any]:
        """The candidate watched at `weight`% of the traffic. With a metrics source the figures are the users' requests
        the servers counted (the verifier sends none during the window; its golden requests came before it), judged
        every window_seconds over the whole window so far until the evidence decides or max_window_extensions ran
        out. Without one, and at 0% (no user reaches the canary), the verifier sends the canary golden rows for
        window_seconds and judges its own figures."""
        metrics = self.backend.metrics
        if metrics is None or weight == 0:
            sent, latencies = self._send(candidate)
            errors = sent - len(latencies)
            figures: dict[str, Any] = {"source": "verifier", "traffic": "verifier", "requests": sent,
                                       "errors": errors, "error_rate": errors / sent,
                                       "p99_ms": round(percentile_99(latencies), 3),
                                       "seconds": self.limits.window_seconds, "verifier_requests": sent}
            return self._judge_verifier(figures)
        try:
            before = metrics.snapshot(self.model)
        except MetricsError as e:
            return {"source": metrics.name, "seconds": 0.0, "verdict": INCONCLUSIVE, "inconclusive": str(e)}
        looks = 1 + self.limits.max_window_extensions
        for look in range(1, looks + 1):
            self.sleep(self.limits.window_seconds)
            seconds = look * self.limits.window_seconds
            try:
                after = metrics.snapshot(self.model, fresh_after=time.time())
            except MetricsError as e:
                return {"source": metrics.name, "seconds": seconds, "verdict": INCONCLUSIVE, "inconclusive": str(e)}
            figures = self._measured(metrics.name, before, after, weight)
            figures.update(seconds=seconds, looks=look, verifier_requests=0)
            figures = self._judge_users(figures, weight, last=look == looks)
            if figures["verdict"] != EXTEND:
                return figures
            evidence = figures["evidence"]
            self.log(f"window at {weight}% after {seconds:g}s: {evidence['canary_requests']} of the "
                     f"{evidence['needed']} canary user requests the step needs; watching "
                     f"{self.limits.window_seconds:g}s more")
        raise AssertionError("the last look decides")  # pragma: no cover

    def shadow_window(self, stable: int, candidate: int) -> dict[str, Any]:
        """The shadow step (rollout/shadow.py): while the router copies rollout.shadow.percent of the users' requests
        to the candidate, the answers both tracks' servers kept are read every SHADOW_READ_S, joined by request id and
        judged every window_seconds over the whole window so far, until the evidence decides or max_window_extensions
        ran out. The verifier sends nothing during it."""
        limits = self.shadow
        if limits is None:
            raise ValueError("no rollout.shadow limits were given")
        since = time.time()
        readers = {track: AnswerReader(self.model, lambda path, track=track, v=v: self.backend.server_gets(track, v,
                                                                                                         path),
                                       since, v)
                   for track, v in (("stable", stable), ("canary", candidate))}
        comparison = None
        looks = 1 + self.limits.max_window_extensions
        for look in range(1, looks + 1):
            end = self.clock() + self.limits.window_seconds
            while (left := end - self.clock()) > 0:
                self.sleep(min(SHADOW_READ_S, left))
                for reader in readers.values():
                    reader.read()
            answers = {track: reader.answers for track, reader in readers.items()}
            if comparison is None and answers["canary"]:
                outputs = sorted(set(answers["canary"][0]["outputs"]) & set((answers["stable"] or [{}])[0]
                                                                            .get("outputs", {})))
                comparison = Comparison.of(self.backend.publication(self.model, stable),
                                           self.backend.publication(self.model, candidate), outputs)
            figures = self._shadow_figures(answers, since, stable, candidate, comparison or Comparison("binary", ""),
                                           look)
            unread = sorted(f"{server}: {why}" for reader in readers.values() for server, why in reader.unread.items())
            if unread:
                figures.update(verdict=INCONCLUSIVE,
                               inconclusive=f"the answers of {len(unread)} server(s) could not be read: {unread[0]}")
                return figures
            figures = judge_shadow(figures, limits, self.limits.evidence_rules(), last=look == looks)
            if figures["verdict"] != EXTEND:
                dropped = sorted(server for reader in readers.values() for server in reader.dropped)
                if dropped:
                    figures["dropped"] = dropped
                return figures
            self.log(f"shadow window after {figures['seconds']:g}s: {figures['shadow']['pairs']} requests answered by "
                     f"both versions of the {figures['evidence']['needed']} the step needs; watching "
                     f"{self.limits.window_seconds:g}s more")
        raise AssertionError("the last look decides")  # pragma: no cover

    def _shadow_figures(self, answers: dict[str, list[dict[str, Any]]], since: float, stable: int, candidate: int,
                        comparison: Comparison, look: int) -> dict[str, Any]:
        failed = {}
        for track, version in (("stable", stable), ("canary", candidate)):
            kept, _ = self.backend.failures(self.model, track, version, since)
            failed[track] = sum(1 for f in kept if f.get("traffic") != "verifier")
        shadow = compare(answers["stable"], answers["canary"], comparison, self.shadow)
        n_c = len(answers["canary"]) + failed["canary"]
        n_s = len(answers["stable"]) + failed["stable"]
        # Each track's p99 over every answer it kept; the shadow figures' ratio is over the joined ones.
        p99 = {track: round(percentile_99([a["latency_ms"] for a in kept]), 3) if kept else 0.0
               for track, kept in answers.items()}
        return {"source": "shadow", "traffic": "users", "percent": self.shadow.percent, "requests": n_c,
                "errors": failed["canary"], "error_rate": failed["canary"] / n_c if n_c else 0.0,
                "p99_ms": p99["canary"], "seconds": look * self.limits.window_seconds, "looks": look,
                "verifier_requests": 0,
                "stable": {"requests": n_s, "errors": failed["stable"],
                           "error_rate": failed["stable"] / n_s if n_s else 0.0, "p99_ms": p99["stable"]},
                "shadow": shadow}

    def stable_window(self, version: int) -> dict[str, Any]:
        """The stable servers for window_seconds right after all traffic moved to them: the first users of a promoted
        version (its first answers are the slow ones when it did not warm up), or stable's recovery after a rollback.
        With a metrics source the figures are the users' requests the stable servers counted, failed on a p99 over
        rollout.max_p99_ms once MIN_SHARE_REQUESTS predictions tell it; the errors are shown, not judged (the version
        passed its error tests at its last step, and a new test would spend more of rollout.false_rollback_rate).
        Without one, the verifier's own requests to `version` on the stable servers, judged as its windows are."""
        metrics = self.backend.metrics
        if metrics is None:
            sent, latencies = self._send(version, "stable")
            errors = sent - len(latencies)
            return self._judge_verifier({
                "source": "verifier", "traffic": "verifier", "version": version, "requests": sent, "errors": errors,
                "error_rate": errors / sent, "p99_ms": round(percentile_99(latencies), 3),
                "seconds": self.limits.window_seconds, "verifier_requests": sent})
        try:
            before = metrics.snapshot(self.model)
            self.sleep(self.limits.window_seconds)
            after = metrics.snapshot(self.model, fresh_after=time.time())
        except MetricsError as e:
            return {"source": metrics.name, "version": version, "verdict": INCONCLUSIVE, "inconclusive": str(e)}
        stable = window_figures(before, after, "stable")
        figures: dict[str, Any] = {"source": metrics.name, "traffic": "users", "version": version,
                                   "seconds": self.limits.window_seconds,
                                   **{k: stable[k] for k in ("requests", "errors", "error_rate", "predictions",
                                                             "p99_ms")}}
        if "inconclusive" in stable:
            figures["inconclusive"] = stable["inconclusive"]
        elif stable["predictions"] < MIN_SHARE_REQUESTS:
            figures["inconclusive"] = (f"{stable['predictions']:.0f} user predictions on the stable servers in "
                                       f"{self.limits.window_seconds:g}s, fewer than the {MIN_SHARE_REQUESTS} a p99 "
                                       "needs")
        elif stable["p99_ms"] > self.limits.max_p99_ms:
            figures["error"] = (f"p99 latency {stable['p99_ms']:.1f} ms of version {version} on the stable servers in "
                                f"the {self.limits.window_seconds:g}s after all traffic moved there > "
                                f"rollout.max_p99_ms {self.limits.max_p99_ms}")
        figures["verdict"] = INCONCLUSIVE if "inconclusive" in figures else FAILED if "error" in figures else PASSED
        return figures

    def _measured(self, source: str, before: Snapshot, after: Snapshot, weight: int) -> dict[str, Any]:
        canary = window_figures(before, after, "canary")
        stable = window_figures(before, after, "stable")
        figures: dict[str, Any] = {"source": source, "traffic": "users",
                                   **{k: canary[k] for k in ("requests", "errors", "error_rate", "predictions",
                                                             "p99_ms")},
                                   "stable": stable, **({"joined": canary["joined"]} if "joined" in canary else {})}
        reason = canary.get("inconclusive") or stable.get("inconclusive")
        if reason is not None:
            figures["inconclusive"] = reason
        else:
            # Predictions and failed requests are the users' requests (a canary that fails requests still got them);
            # successful status and metadata reads (probes, the clients' own) are not.
            figures["share"] = share_check(canary["predictions"] + canary["errors"],
                                           stable["predictions"] + stable["errors"], weight,
                                           self.limits.share_tolerance_sigmas)
        return figures

    def _judge_verifier(self, figures: dict[str, Any]) -> dict[str, Any]:
        limits = self.limits
        if figures["error_rate"] > limits.max_error_rate:
            figures["error"] = (f"error rate {figures['error_rate']:.4f} > rollout.max_error_rate "
                                f"{limits.max_error_rate}")
        elif figures["p99_ms"] > limits.max_p99_ms:
            figures["error"] = f"p99 latency {figures['p99_ms']:.1f} ms > rollout.max_p99_ms {limits.max_p99_ms}"
        figures["verdict"] = FAILED if "error" in figures else PASSED
        return figures

    def _judge_users(self, figures: dict[str, Any], weight: int, last: bool) -> dict[str, Any]:
        """The verdict on the users' requests of a window so far: failed on enough evidence of errors, extended while
        the canary has fewer user requests than the step needs (inconclusive at the last look), then the latency
        limits and the share."""
        limits, rules = self.limits, self.limits.evidence_rules()
        share = figures.get("share") or {}
        if "inconclusive" in figures:
            figures["verdict"] = INCONCLUSIVE
            return figures
        if share.get("error"):
            figures["error"] = share["error"]
            figures["verdict"] = FAILED
            return figures
        stable = figures["stable"]
        n_c = int(round(figures["predictions"] + figures["errors"]))
        k_c = int(round(figures["errors"]))
        n_s = int(round(stable["predictions"] + stable["errors"]))
        k_s = int(round(stable["errors"]))
        stable_rate = k_s / n_s if n_s else 0.0
        needed = min_canary_requests(weight, stable_rate, rules)
        deciding = n_c >= needed or last
        alpha = rules.alpha(deciding)
        limit_p = above_limit_p_value(k_c, n_c, limits.max_error_rate)
        stable_p = canary_worse_p_value(k_c, n_c, k_s, n_s) if n_s else 1.0
        rise = (k_c / n_c if n_c else 0.0) - stable_rate
        evidence = figures["evidence"] = {
            "canary_requests": n_c, "canary_errors": k_c, "stable_requests": n_s, "stable_errors": k_s,
            "needed": needed, "alpha": alpha, "limit_p": limit_p, "stable_p": stable_p}
        if n_c and limit_p <= alpha:
            figures["error"] = (f"the canary failed {k_c} of its {n_c} user requests ({k_c / n_c:.1%}): above "
                                f"rollout.max_error_rate {limits.max_error_rate} (exact binomial test, p {limit_p:.1e} "
                                f"<= {alpha:.1e})")
        elif n_c and n_s and rise > limits.max_error_rate_increase and stable_p <= alpha:
            figures["error"] = (f"the canary failed {k_c} of its {n_c} user requests ({k_c / n_c:.1%}) against "
                                f"stable's {k_s} of {n_s} ({stable_rate:.1%}) in the same window: more than "
                                f"rollout.max_error_rate_increase {limits.max_error_rate_increase} above it (Fisher's "
                                f"exact test, p {stable_p:.1e} <= {alpha:.1e})")
        elif n_c < needed and not last:
            figures["verdict"] = EXTEND
            return figures
        elif n_c < needed:
            figures["inconclusive"] = (
                f"the canary got {n_c} user requests at {weight}% in {figures['seconds']:g}s, fewer than the {needed} "
                f"a step needs to catch a rise of {rules.min_error_rate_regression} in its error rate with "
                f"probability {rules.detection_power} (rollout.min_error_rate_regression): send more traffic, or "
                "lengthen rollout.window_seconds or rollout.max_window_extensions")
        elif figures["p99_ms"] > limits.max_p99_ms:
            figures["error"] = f"p99 latency {figures['p99_ms']:.1f} ms > rollout.max_p99_ms {limits.max_p99_ms}"
        elif (stable["predictions"] >= MIN_SHARE_REQUESTS
              and figures["p99_ms"] > limits.max_p99_ratio * stable["p99_ms"]):
            figures["error"] = (f"p99 latency {figures['p99_ms']:.1f} ms against stable's {stable['p99_ms']:.1f} ms "
                                f"in the same window > rollout.max_p99_ratio {limits.max_p99_ratio}x")
        elif share.get("inconclusive"):
            # Judged after the limits: a canary failing its limits fails, whatever share of the traffic it got.
            figures["inconclusive"] = share["inconclusive"]
        evidence["decided_at_look"] = figures["looks"]
        figures["verdict"] = INCONCLUSIVE if "inconclusive" in figures else FAILED if "error" in figures else PASSED
        return figures


def _serving_clients(endpoint: Endpoint, retries: int | None) -> tuple[Any, Any]:
    from serving.clients import GrpcClient, RestClient

    # Marked, so that the servers leave the golden rows out of the request logs `mlops monitor` judges.
    options: dict[str, Any] = {"headers": {TRAFFIC_HEADER: VERIFIER_TRAFFIC}}
    if retries is not None:
        options["retries"] = retries
    return RestClient(endpoint.rest, **options), GrpcClient(endpoint.grpc, **options)
