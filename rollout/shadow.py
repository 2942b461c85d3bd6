"""The shadow step (rollout.shadow): before any user gets the candidate's answers, the router copies a share of the
live requests to it (rollout/mirror.py), and each copy's answer is joined with stable's answer to the same request by
the request id both servers kept it under (serving/server/answers.py).

A shadow window is judged on those pairs, in order:
- the candidate's errors on the copies, by the user steps' tests (rollout/evidence.py: the exact binomial test
  against rollout.max_error_rate, Fisher's exact test against stable's errors in the same window);
- how often the two disagree: on the decision at each version's own threshold (binary; publication.json's calibrated
  threshold, 0.5 without one), on the class (multiclass), or by more than rollout.shadow.max_relative_error
  (regression); failed when the exact binomial test finds the rate above rollout.shadow.max_disagreement_rate;
- too few joined requests (rollout.shadow.min_requests, and the errors' own minimum) extend the window, then leave it
  inconclusive, never passed; a mirror that brought the candidate nothing while stable answered enough fails;
- the distance between the two score distributions, above rollout.shadow.max_score_distance, fails: the Wasserstein
  (earth mover's) distance between the probabilities (binary), the same relative to stable's mean absolute value
  (regression), or the total variation distance between the classes' shares (multiclass). Unlike the
  Kolmogorov-Smirnov statistic, it stays small for a small shift of scores that all lie close together;
- the candidate's p99 of the server's time to answer against stable's on the same requests, above
  rollout.shadow.max_latency_ratio fails.
The pairs that disagree most are kept with their inputs for the report."""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import quote

from rollout.evidence import (
    MAX_REQUESTS,
    EvidenceRules,
    above_limit_p_value,
    canary_worse_p_value,
    min_canary_requests,
)
from serving.server.answers import ANSWERS_PATH

PASSED, FAILED, INCONCLUSIVE, EXTEND = "passed", "failed", "inconclusive", "extend"
# Below this many joined requests the latency ratio is not judged: a p99 of fewer is its largest value.
MIN_LATENCY_PAIRS = 20
# Reads overlap by this much: an answer kept while a read ran is read by the next one (each counted once).
READ_OVERLAP_S = 0.5
# A mirror that sent the candidate none of stable's requests fails once that is this improbable by chance.
NO_TRAFFIC_CHANCE = 0.001
BINARY_OUTPUT, CLASS_OUTPUT, VALUE_OUTPUT = "probabilities", "class", "value"


@dataclass(frozen=True)
class ShadowLimits:
    percent: int
    min_requests: int
    max_disagreement_rate: float
    max_relative_error: float
    max_score_distance: float
    max_latency_ratio: float
    examples: int = 5


@dataclass(frozen=True)
class Comparison:
    """How two versions' answers are compared: the task, the output, and each version's decision threshold."""

    kind: str  # "binary", "multiclass" or "regression"
    output: str
    stable_threshold: float = 0.5
    candidate_threshold: float = 0.5

    @classmethod
    def of(cls, stable: Mapping[str, Any], candidate: Mapping[str, Any], outputs: Sequence[str]) -> Comparison:
        """From the versions' publication.json (task and calibrated threshold) and the outputs both answered; a
        version published without them is compared by its outputs' names (components/model.py)."""
        kind = (candidate.get("task") or {}).get("kind") or (stable.get("task") or {}).get("kind")
        if kind not in ("binary", "multiclass", "regression"):
            kind = ("multiclass" if CLASS_OUTPUT in outputs else "binary" if BINARY_OUTPUT in outputs
                    else "regression")
        output = {"binary": BINARY_OUTPUT, "multiclass": CLASS_OUTPUT, "regression": VALUE_OUTPUT}[kind]
        if output not in outputs:
            output = sorted(outputs)[0] if outputs else output

        def threshold(publication: Mapping[str, Any]) -> float:
            value = (publication.get("calibration") or {}).get("threshold")
            return float(value) if isinstance(value, (int, float)) else 0.5

        return cls(kind, output, threshold(stable), threshold(candidate))

    def disagree(self, stable: Any, candidate: Any, max_relative_error: float) -> bool:
        if self.kind == "binary":
            return (float(stable) >= self.stable_threshold) != (float(candidate) >= self.candidate_threshold)
        if self.kind == "multiclass":
            return stable != candidate
        return abs(float(candidate) - float(stable)) > max_relative_error * abs(float(stable))

    def distance(self, stable: Sequence[Any], candidate: Sequence[Any]) -> float:
        if not stable or not candidate:
            return 0.0
        if self.kind == "multiclass":
            return total_variation(stable, candidate)
        distance = wasserstein([float(v) for v in stable], [float(v) for v in candidate])
        if self.kind == "binary":
            return distance
        scale = sum(abs(float(v)) for v in stable) / len(stable)
        return distance / scale if scale > 0 else distance


def wasserstein(first: Sequence[float], second: Sequence[float]) -> float:
    """The first Wasserstein (earth mover's) distance between two samples: how far, on average, the scores moved."""
    from scipy import stats

    return float(stats.wasserstein_distance(first, second))


def total_variation(first: Sequence[Any], second: Sequence[Any]) -> float:
    """Half the sum of the differences between two samples' shares of each value."""
    values = set(first) | set(second)
    return 0.5 * sum(abs(first.count(v) / len(first) - second.count(v) / len(second)) for v in values)


def percentile_99(values: Sequence[float]) -> float:
    """The nearest-rank 99th percentile (0 without values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def compare(stable: Sequence[Mapping[str, Any]], candidate: Sequence[Mapping[str, Any]], comparison: Comparison,
            limits: ShadowLimits) -> dict[str, Any]:
    """The pairs' figures: stable's and the candidate's answers (as kept, serving/server/answers.py) joined by
    request id, compared row by row on `comparison`'s output."""
    by_id: dict[str, Mapping[str, Any]] = {}
    for answer in stable:
        by_id.setdefault(answer["request_id"], answer)
    pairs = [(by_id[c["request_id"]], c) for c in candidate if c["request_id"] in by_id]
    stable_values: list[Any] = []
    candidate_values: list[Any] = []
    compared: list[dict[str, Any]] = []
    for s, c in pairs:
        s_out, c_out = s["outputs"].get(comparison.output, []), c["outputs"].get(comparison.output, [])
        for i in range(min(len(s_out), len(c_out))):
            disagree = comparison.disagree(s_out[i], c_out[i], limits.max_relative_error)
            stable_values.append(s_out[i])
            candidate_values.append(c_out[i])
            gap = float(disagree) if comparison.kind == "multiclass" else abs(float(c_out[i]) - float(s_out[i]))
            compared.append({"request_id": c["request_id"], "stable": s_out[i], "candidate": c_out[i],
                             "disagree": disagree, "gap": gap,
                             "inputs": (c.get("rows") or [])[i] if i < len(c.get("rows") or []) else {}})
    disagreements = sum(1 for row in compared if row["disagree"])
    stable_p99 = percentile_99([s["latency_ms"] for s, _ in pairs])
    candidate_p99 = percentile_99([c["latency_ms"] for _, c in pairs])
    worst = sorted(compared, key=lambda row: (row["disagree"], row["gap"]), reverse=True)[:limits.examples]
    return {"kind": comparison.kind, "output": comparison.output,
            "thresholds": ({"stable": comparison.stable_threshold, "candidate": comparison.candidate_threshold}
                           if comparison.kind == "binary" else None),
            "pairs": len(pairs), "unmatched": len(candidate) - len(pairs), "rows": len(compared),
            "disagreements": disagreements, "disagreement_rate": disagreements / len(compared) if compared else 0.0,
            "score_distance": round(comparison.distance(stable_values, candidate_values), 6),
            "stable_p99_ms": round(stable_p99, 3), "candidate_p99_ms": round(candidate_p99, 3),
            "latency_ratio": round(candidate_p99 / stable_p99, 4) if stable_p99 > 0 else None,
            "examples": [{k: v for k, v in row.items() if k != "gap"} for row in worst if row["gap"] > 0]}


def needed_requests(limits: ShadowLimits, stable_error_rate: float, rules: EvidenceRules) -> int:
    """The fewest requests answered by both a shadow window needs: rollout.shadow.min_requests, and enough to catch,
    with probability rollout.detection_power, a candidate failing rollout.min_error_rate_regression more often than
    stable (stable answers every request: at `percent` copied, the step compares as a user step at weight
    percent / (100 + percent) does) or deciding otherwise on max_disagreement_rate + min_error_rate_regression of
    them."""
    weight = max(1, round(100 * limits.percent / (100 + limits.percent)))
    return max(limits.min_requests, min_canary_requests(weight, stable_error_rate, rules),
               _min_rows(limits.max_disagreement_rate, limits.max_disagreement_rate + rules.min_error_rate_regression,
                         rules))


@lru_cache(maxsize=64)
def _min_rows(limit: float, bad: float, rules: EvidenceRules) -> int:
    """The fewest rows at which the exact binomial test against `limit`, at the deciding look's significance, fails a
    rate of `bad` with probability detection_power."""
    alpha = rules.alpha(deciding=True)

    def power(n: int) -> float:
        critical = 0
        while above_limit_p_value(critical, n, limit) > alpha and critical <= n:
            critical += 1
        return above_limit_p_value(critical, n, bad) if critical <= n else 0.0

    high = 1
    while power(high) < rules.detection_power:
        high *= 2
        if high > MAX_REQUESTS:
            return MAX_REQUESTS
    low = high // 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if power(middle) >= rules.detection_power else (middle, high)
    return high


def judge(figures: dict[str, Any], limits: ShadowLimits, rules: EvidenceRules, last: bool) -> dict[str, Any]:
    """The verdict on a shadow window so far (`figures`: the candidate's and stable's request and error counts, and
    compare()'s figures under "shadow"); EXTEND while it holds too few joined requests and the last look is to come."""
    shadow = figures["shadow"]
    n_c, k_c = figures["requests"], figures["errors"]
    n_s, k_s = figures["stable"]["requests"], figures["stable"]["errors"]
    stable_rate = k_s / n_s if n_s else 0.0
    needed = needed_requests(limits, stable_rate, rules)
    deciding = shadow["pairs"] >= needed or last
    alpha = rules.alpha(deciding)
    limit_p = above_limit_p_value(k_c, n_c, rules.max_error_rate) if n_c else 1.0
    stable_p = canary_worse_p_value(k_c, n_c, k_s, n_s) if n_c and n_s else 1.0
    rise = (k_c / n_c if n_c else 0.0) - stable_rate
    rows = shadow["rows"]
    disagreement_p = above_limit_p_value(shadow["disagreements"], rows, limits.max_disagreement_rate) if rows else 1.0
    figures["evidence"] = {"canary_requests": n_c, "canary_errors": k_c, "stable_requests": n_s,
                           "stable_errors": k_s, "needed": needed, "alpha": alpha, "limit_p": limit_p,
                           "stable_p": stable_p, "disagreement_p": disagreement_p}
    what = "decisions" if shadow["kind"] != "regression" else "values"
    if n_c and limit_p <= alpha:
        figures["error"] = (f"the candidate failed {k_c} of the {n_c} requests copied to it ({k_c / n_c:.1%}): above "
                            f"rollout.max_error_rate {rules.max_error_rate} (exact binomial test, p {limit_p:.1e} <= "
                            f"{alpha:.1e})")
    elif n_c and n_s and rise > rules.max_error_rate_increase and stable_p <= alpha:
        figures["error"] = (f"the candidate failed {k_c} of the {n_c} requests copied to it ({k_c / n_c:.1%}) against "
                            f"stable's {k_s} of {n_s} ({stable_rate:.1%}): more than rollout.max_error_rate_increase "
                            f"{rules.max_error_rate_increase} above it (Fisher's exact test, p {stable_p:.1e} <= "
                            f"{alpha:.1e})")
    elif rows and disagreement_p <= alpha:
        figures["error"] = (f"the candidate's {what} disagree with stable's on {shadow['disagreements']} of {rows} "
                            f"rows ({shadow['disagreement_rate']:.1%}): above rollout.shadow.max_disagreement_rate "
                            f"{limits.max_disagreement_rate} (exact binomial test, p {disagreement_p:.1e} <= "
                            f"{alpha:.1e})")
    elif n_c == 0 and n_s and (1 - limits.percent / 100) ** n_s < NO_TRAFFIC_CHANCE:
        figures["error"] = (f"the router copied none of stable's {n_s} requests to the candidate at "
                            f"rollout.shadow.percent {limits.percent}: the mirror does not reach it")
    elif shadow["pairs"] < needed and not last:
        figures["verdict"] = EXTEND
        return figures
    elif shadow["pairs"] < needed:
        figures["inconclusive"] = (
            f"{shadow['pairs']} requests answered by both versions in {figures['seconds']:g}s "
            f"({shadow['unmatched']} of the candidate's without stable's answer), fewer than the {needed} the shadow "
            "step needs (rollout.shadow.min_requests, and the requests that catch a rise of "
            f"{rules.min_error_rate_regression} in the error or disagreement rate): send more traffic, raise "
            "rollout.shadow.percent, "
            "or lengthen rollout.window_seconds")
    elif shadow["score_distance"] > limits.max_score_distance:
        measure = {"multiclass": "total variation distance", "binary": "Wasserstein distance"}.get(
            shadow["kind"], "Wasserstein distance relative to stable's mean")
        figures["error"] = (f"the candidate's {shadow['output']} are distributed unlike stable's on the same requests: "
                            f"{measure} {shadow['score_distance']:.4f} > rollout.shadow.max_score_distance "
                            f"{limits.max_score_distance}")
    elif (shadow["pairs"] >= MIN_LATENCY_PAIRS and shadow["latency_ratio"] is not None
          and shadow["latency_ratio"] > limits.max_latency_ratio):
        figures["error"] = (f"the candidate's p99 time to answer {shadow['candidate_p99_ms']:.1f} ms against stable's "
                            f"{shadow['stable_p99_ms']:.1f} ms on the same requests > rollout.shadow.max_latency_ratio "
                            f"{limits.max_latency_ratio}x")
    figures["evidence"]["decided_at_look"] = figures["looks"]
    figures["verdict"] = INCONCLUSIVE if "inconclusive" in figures else FAILED if "error" in figures else PASSED
    return figures


class AnswerReader:
    """Reads what a track's servers kept (serving/server/answers.py) since `since`, each answer once; `get` is the
    backend's server_gets for the track and version."""

    def __init__(self, model: str, get: Callable[[str], list[tuple[str, int, str]]], since: float,
                 version: int) -> None:
        self.model = model
        self.get = get
        self.since = since
        self.version = version
        self._read_from = since
        self._seen: set[tuple[str, int]] = set()
        self.answers: list[dict[str, Any]] = []
        self.unread: dict[str, str] = {}
        # Servers that dropped answers of the window before they were read (more kept than they hold).
        self.dropped: set[str] = set()

    def read(self) -> None:
        import json

        newest = self._read_from
        path = f"{ANSWERS_PATH}/{quote(self.model, safe='')}/{int(self._read_from * 1000)}"
        for server, status, body in self.get(path):
            try:
                document = json.loads(body) if status == 200 else None
                kept = document["answers"] if isinstance(document, dict) else None
            except (ValueError, KeyError):
                kept = None
            if not isinstance(kept, list):
                self.unread[server] = f"{status or 'no answer'} {body[:200]}".strip()
                continue
            self.unread.pop(server, None)
            oldest = document.get("oldest")
            if document.get("dropped") and isinstance(oldest, (int, float)) and oldest > self._read_from:
                self.dropped.add(server)  # answers after the last read were dropped before this one
            for answer in kept:
                key = (str(document.get("instance")), int(answer["number"]))
                if key in self._seen:
                    continue
                self._seen.add(key)
                newest = max(newest, float(answer["time"]))
                # No version: a REST answer through `mlops log-proxy` (TF Serving's names none); during a shadow
                # window each track's servers serve one version, so it is that one.
                if answer["time"] >= self.since and answer.get("version") in (self.version, None):
                    self.answers.append(answer)
        self._read_from = max(self._read_from, newest - READ_OVERLAP_S)
