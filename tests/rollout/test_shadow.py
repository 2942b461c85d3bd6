"""The shadow step's gate (rollout/shadow.py), each rule just inside and just outside its threshold: the candidate's
errors on the copies, how often its decisions (binary, at each version's threshold; multiclass) or values
(regression) differ from stable's, the evidence a pass needs, the distance between the score distributions and the
latency ratio; the join by request id; the reads of the servers' kept answers; and the gate simulated over many
windows at the defaults: how often it catches a candidate failing 5% of the copies or deciding otherwise on 5% of
them, and how often it fails a healthy one."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

from rollout.evidence import EvidenceRules
from rollout.shadow import (
    EXTEND,
    FAILED,
    INCONCLUSIVE,
    MIN_LATENCY_PAIRS,
    PASSED,
    AnswerReader,
    Comparison,
    ShadowLimits,
    compare,
    judge,
    needed_requests,
    total_variation,
    wasserstein,
)
from rollout.verify import Limits
from tests.rollout.memory import MODEL, HookedStore, MemoryBackend, ScriptedVerifier

# The defaults (settings/config.py RolloutShadowConfig and RolloutConfig) with rollout.steps [10, 50, 100] after the
# shadow step: four steps share the false-rollback rate.
LIMITS = ShadowLimits(percent=100, min_requests=200, max_disagreement_rate=0.01, max_relative_error=0.05,
                      max_score_distance=0.05, max_latency_ratio=3.0)
RULES = Limits(max_abs_diff=0.001, max_error_rate=0.01, max_p99_ms=250.0, window_seconds=30.0,
               requests_per_second=20.0, timeout_s=5.0, user_steps=4).evidence_rules()
BINARY = Comparison("binary", "probabilities")
# What a shadow window needs at the defaults with stable failing nothing (docs/concepts/rollout.md lists it).
NEEDED = needed_requests(LIMITS, 0.0, RULES)


def answer(request_id: str, value, latency_ms: float = 2.0, rows: list | None = None, output: str = "probabilities",
           version: int = 1, time: float = 100.0, number: int = 0) -> dict:
    values = value if isinstance(value, list) else [value]
    return {"request_id": request_id, "outputs": {output: values}, "latency_ms": latency_ms,
            "rows": rows if rows is not None else [{"fare": float(i)} for i in range(len(values))],
            "version": version, "time": time, "number": number}


def window(pairs: int, disagreements: int = 0, errors: int = 0, stable_errors: int = 0, distance: float = 0.0,
           latency_ratio: float | None = 1.0, looks: int = 1, candidate_requests: int | None = None) -> dict:
    """A shadow window's figures as Verifier.shadow_window hands them to judge()."""
    n_c = pairs + errors if candidate_requests is None else candidate_requests
    return {"requests": n_c, "errors": errors, "seconds": 30.0 * looks, "looks": looks,
            "stable": {"requests": pairs + stable_errors, "errors": stable_errors},
            "shadow": {"kind": "binary", "output": "probabilities", "pairs": pairs, "unmatched": 0, "rows": pairs,
                       "disagreements": disagreements, "disagreement_rate": disagreements / pairs if pairs else 0.0,
                       "score_distance": distance, "latency_ratio": latency_ratio, "candidate_p99_ms": 3.0,
                       "stable_p99_ms": 1.0}}


def critical(make, low: int, high: int, rules: EvidenceRules = RULES) -> int:
    """The fewest of something (errors, disagreements) judge() fails on at the last look, between low and high."""
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if judge(make(middle), LIMITS, rules, True)["verdict"] == FAILED else (middle, high)
    return high


# ----------------------------------------------------------------------------------------------- comparisons
@pytest.mark.parametrize("stable, candidate, thresholds, disagree", [
    (0.49, 0.5, (0.5, 0.5), True), (0.49, 0.4999, (0.5, 0.5), False), (0.5, 0.5, (0.5, 0.5), False),
    (0.6, 0.6, (0.5, 0.7), True), (0.6, 0.7, (0.5, 0.7), False), (0.6, 0.69999, (0.5, 0.7), True)])
def test_a_binary_decision_is_at_each_versions_own_threshold(stable, candidate, thresholds, disagree):
    comparison = Comparison("binary", "probabilities", *thresholds)
    assert comparison.disagree(stable, candidate, 0.05) is disagree


@pytest.mark.parametrize("stable, candidate, disagree", [
    (100.0, 105.0, False), (100.0, 105.001, True), (100.0, 94.999, True), (-10.0, -10.5, False), (0.0, 1e-9, True)])
def test_a_regression_value_disagrees_beyond_the_relative_error(stable, candidate, disagree):
    assert Comparison("regression", "value").disagree(stable, candidate, 0.05) is disagree


def test_a_multiclass_answer_disagrees_on_its_class():
    comparison = Comparison("multiclass", "class")
    assert comparison.disagree("a", "b", 0.05) and not comparison.disagree("a", "a", 0.05)


def test_the_comparison_follows_the_publication_else_the_outputs():
    stable = {"task": {"kind": "binary"}, "calibration": {"threshold": 0.4}}
    candidate = {"task": {"kind": "binary"}, "calibration": {"threshold": 0.6}}
    assert Comparison.of(stable, candidate, ["probabilities"]) == Comparison("binary", "probabilities", 0.4, 0.6)
    assert Comparison.of({}, {}, ["class", "probabilities"]) == Comparison("multiclass", "class")
    assert Comparison.of({}, {}, ["value"]) == Comparison("regression", "value")
    assert Comparison.of({}, {"task": {"kind": "regression"}}, ["prediction"]) == Comparison("regression",
                                                                                             "prediction")


def test_the_distances_are_wasserstein_and_total_variation():
    assert wasserstein([0.1, 0.2], [0.1, 0.2]) == 0.0
    assert wasserstein([0.1, 0.2], [0.15, 0.25]) == pytest.approx(0.05)
    # A small shift of scores lying close together moves them little (Kolmogorov-Smirnov would say 1).
    assert wasserstein([0.02] * 50, [0.0205] * 50) == pytest.approx(0.0005)
    assert total_variation(["a", "a", "b", "b"], ["a", "b", "b", "b"]) == pytest.approx(0.25)
    regression = Comparison("regression", "value")
    assert regression.distance([100.0, 200.0], [110.0, 210.0]) == pytest.approx(10.0 / 150.0)


def test_answers_are_joined_by_request_id_row_by_row_and_the_worst_kept_with_their_inputs():
    stable = [answer("a", [0.1, 0.2], 1.0), answer("b", 0.7, 2.0), answer("c", 0.3, 3.0), answer("a", 0.9)]
    candidate = [answer("a", [0.1, 0.6], 2.0, rows=[{"fare": 1.0}, {"fare": 2.0}]), answer("b", 0.69, 4.0),
                 answer("z", 0.5, 50.0)]
    figures = compare(stable, candidate, BINARY, LIMITS)
    assert (figures["pairs"], figures["unmatched"], figures["rows"], figures["disagreements"]) == (2, 1, 3, 1)
    assert figures["disagreement_rate"] == pytest.approx(1 / 3)
    assert (figures["stable_p99_ms"], figures["candidate_p99_ms"], figures["latency_ratio"]) == (2.0, 4.0, 2.0)
    first, second = figures["examples"]
    assert (first["request_id"], first["stable"], first["candidate"], first["disagree"], first["inputs"]) == (
        "a", 0.2, 0.6, True, {"fare": 2.0})
    assert (second["request_id"], second["disagree"]) == ("b", False)
    assert figures["score_distance"] == pytest.approx(wasserstein([0.1, 0.2, 0.7], [0.1, 0.6, 0.69]), abs=1e-6)


# ---------------------------------------------------------------------------------------------------- the gate
def test_the_errors_on_the_copies_fail_at_the_exact_tests_critical_count():
    k = critical(lambda errors: window(NEEDED, errors=errors), 0, NEEDED)
    assert judge(window(NEEDED, errors=k), LIMITS, RULES, True)["error"].startswith(
        f"the candidate failed {k} of the {NEEDED + k} requests copied to it")
    assert judge(window(NEEDED, errors=k - 1), LIMITS, RULES, True)["verdict"] == PASSED
    print(f"errors: {k} of {NEEDED + k} copies fail the shadow step")
    assert 3 <= k <= 12


def test_errors_above_stables_in_the_same_window_fail_by_fishers_test():
    # A lax limit (50%), so that the rise over stable's 4% is what decides: k - 1 passes, k fails.
    rules = EvidenceRules(0.5, 0.005, 0.05, 0.95, 0.01, 4, 5)
    k = critical(lambda errors: window(1000, errors=errors, stable_errors=40), 0, 1000, rules)
    figures = judge(window(1000, errors=k, stable_errors=40), LIMITS, rules, True)
    assert f"the candidate failed {k} of the {1000 + k} requests copied to it" in figures["error"]
    assert "against stable's 40 of 1040" in figures["error"] and "Fisher's exact test" in figures["error"]
    assert judge(window(1000, errors=k - 1, stable_errors=40), LIMITS, rules, True)["verdict"] == PASSED
    assert 50 <= k <= 80


def test_disagreements_fail_at_the_exact_tests_critical_count():
    k = critical(lambda d: window(NEEDED, disagreements=d), 0, NEEDED)
    assert "decisions disagree with stable's on" in judge(window(NEEDED, disagreements=k), LIMITS, RULES, True)["error"]
    assert judge(window(NEEDED, disagreements=k - 1), LIMITS, RULES, True)["verdict"] == PASSED
    print(f"disagreements: {k} of {NEEDED} rows fail the shadow step")
    assert 5 <= k <= 16


def test_the_defaults_need_these_joined_requests():
    assert NEEDED == 336
    # rollout.shadow.min_requests decides where the evidence needs fewer.
    assert needed_requests(ShadowLimits(**{**LIMITS.__dict__, "min_requests": 500}), 0.0, RULES) == 500


def test_too_few_joined_requests_extend_the_window_then_leave_it_inconclusive_never_passed():
    assert judge(window(NEEDED - 1), LIMITS, RULES, last=False)["verdict"] == EXTEND
    figures = judge(window(NEEDED - 1, looks=5), LIMITS, RULES, last=True)
    assert figures["verdict"] == INCONCLUSIVE
    assert figures["inconclusive"].startswith(f"{NEEDED - 1} requests answered by both")
    assert judge(window(NEEDED), LIMITS, RULES, last=False)["verdict"] == PASSED


def test_a_mirror_that_brings_the_candidate_nothing_fails():
    # Stable answered 10 requests: at 100% copied, none reaching the candidate is certain to be the mirror's fault.
    assert judge(window(0, candidate_requests=0) | {"stable": {"requests": 10, "errors": 0}}, LIMITS, RULES,
                 False)["verdict"] == FAILED
    half = ShadowLimits(**{**LIMITS.__dict__, "percent": 50})
    # At 50%, 9 of stable's requests all missed by chance: 0.2%, above the 0.1% the gate accepts.
    assert judge(window(0, candidate_requests=0) | {"stable": {"requests": 9, "errors": 0}}, half, RULES,
                 False)["verdict"] == EXTEND
    assert judge(window(0, candidate_requests=0) | {"stable": {"requests": 10, "errors": 0}}, half, RULES,
                 False)["verdict"] == FAILED


@pytest.mark.parametrize("distance, verdict", [(0.05, PASSED), (0.0501, FAILED)])
def test_the_score_distance_fails_above_its_limit(distance, verdict):
    figures = judge(window(NEEDED, distance=distance), LIMITS, RULES, True)
    assert figures["verdict"] == verdict
    if verdict == FAILED:
        assert "Wasserstein distance 0.0501 > rollout.shadow.max_score_distance 0.05" in figures["error"]


@pytest.mark.parametrize("pairs, ratio, verdict", [(NEEDED, 3.0, PASSED), (NEEDED, 3.01, FAILED),
                                                   (NEEDED - 1, 10.0, EXTEND)])
def test_the_latency_ratio_fails_above_its_limit_once_enough_pairs_tell_it(pairs, ratio, verdict):
    # Fewer pairs than the step needs are not judged on latency: the window is extended first.
    assert judge(window(pairs, latency_ratio=ratio), LIMITS, RULES, last=False)["verdict"] == verdict


def test_the_latency_ratio_needs_min_latency_pairs_where_the_evidence_needs_fewer():
    small = ShadowLimits(**{**LIMITS.__dict__, "min_requests": 1})
    # A lax error limit and a large regression worth catching: a handful of requests decide.
    rules = EvidenceRules(0.5, 0.005, 0.45, 0.5, 0.01, 4, 5)
    assert needed_requests(small, 0.0, rules) < MIN_LATENCY_PAIRS
    assert judge(window(MIN_LATENCY_PAIRS, latency_ratio=3.01), small, rules, True)["verdict"] == FAILED
    assert judge(window(MIN_LATENCY_PAIRS - 1, latency_ratio=3.01), small, rules, True)["verdict"] == PASSED


# ----------------------------------------------------------------------------------------- the gate simulated
def simulate(rng: np.random.Generator, error_rate: float, disagreement_rate: float, stable_error_rate: float,
             pairs: int) -> str:
    """One window of `pairs` requests copied at 100% (the window was extended until it held what the step needs)."""
    errors = int(rng.binomial(pairs, error_rate))
    stable_errors = int(rng.binomial(pairs, stable_error_rate))
    disagreements = int(rng.binomial(pairs - errors, disagreement_rate))
    return judge(window(pairs - errors, disagreements=disagreements, errors=errors, stable_errors=stable_errors),
                 LIMITS, RULES, True)["verdict"]


@pytest.mark.parametrize("error_rate, disagreement_rate", [(0.05, 0.0), (0.0, 0.06)])
def test_a_candidate_failing_5_percent_or_deciding_otherwise_on_6_is_caught_in_95_percent_of_shadow_windows(
        error_rate, disagreement_rate):
    # 6%: rollout.shadow.max_disagreement_rate plus rollout.min_error_rate_regression, the rise worth catching.
    rng = np.random.default_rng(7)
    caught = sum(simulate(rng, error_rate, disagreement_rate, 0.0, NEEDED) == FAILED for _ in range(2000))
    print(f"error rate {error_rate}, disagreement rate {disagreement_rate}: caught in {caught / 2000:.1%} of shadow "
          f"windows of {NEEDED} requests")
    assert caught / 2000 >= 0.95


@pytest.mark.parametrize("rate", [0.0, 0.005, 0.01])
def test_a_healthy_candidate_fails_the_shadow_step_in_under_1_percent_of_windows(rate):
    # Failing as often as stable, within max_error_rate, and deciding otherwise at most at the limit.
    rng = np.random.default_rng(11)
    failed = sum(simulate(rng, rate, rate, rate, NEEDED) == FAILED for _ in range(4000))
    print(f"healthy candidate at {rate}: failed in {failed / 4000:.2%} of shadow windows")
    assert failed / 4000 <= 0.01


# ------------------------------------------------------------------------------------------------- the reader
def test_the_reader_counts_each_kept_answer_once_and_keeps_the_windows_version():
    served = {"s1": [answer("a", 0.1, time=99.0, number=1), answer("b", 0.2, time=101.0, number=2),
                     answer("c", 0.3, time=102.0, number=3, version=2)]}
    paths = []

    def get(path: str):
        paths.append(path)
        return [(server, 200, json.dumps({"answers": kept, "instance": server, "oldest": 99.0, "dropped": False}))
                for server, kept in served.items()]

    reader = AnswerReader("tiny model", get, since=100.0, version=1)
    reader.read()
    served["s1"].append(answer("d", 0.4, time=103.0, number=4))
    reader.read()
    assert [a["request_id"] for a in reader.answers] == ["b", "d"]
    assert paths == ["/monitoring/answers/tiny%20model/100000", "/monitoring/answers/tiny%20model/101500"]
    assert reader.unread == {} and reader.dropped == set()


def test_the_reader_names_servers_it_cannot_read_and_those_that_dropped_answers():
    def get(path: str):
        return [("s1", 0, "GET ...: connection refused"),
                ("s2", 200, json.dumps({"answers": [answer("x", 0.1, time=205.0, number=9)], "instance": "i",
                                        "oldest": 205.0, "dropped": True}))]

    reader = AnswerReader("m", get, since=100.0, version=1)
    reader.read()
    assert reader.unread == {"s1": "no answer GET ...: connection refused"} and reader.dropped == {"s2"}


# ------------------------------------------------------------------------------------ the window and the controller
class CopyingBackend(MemoryBackend):
    """A memory backend whose router copied every request: each read of the answers finds `per_read` more answered by
    both tracks (the candidate's values from `candidate_value`), with `canary_failures` of the copies failed."""

    def __init__(self, tmp_path, per_read: int, candidate_value: float = 0.2, canary_failures: int = 0) -> None:
        super().__init__(HookedStore(tmp_path))
        self.mirrors = True
        self.per_read, self.candidate_value, self.canary_failures = per_read, candidate_value, canary_failures
        self.reads = 0

    def server_gets(self, track: str, version: int, path: str) -> list[tuple[str, int, str]]:
        if track == "stable" and path.startswith("/monitoring/answers/"):
            self.reads += 1
            now = time.time()
            for i in range(self.per_read):
                key = f"r{self.reads}-{i}"
                self.kept_answers["stable"].append(answer(key, 0.2, 1.0, version=1, time=now, number=len(
                    self.kept_answers["stable"])))
                self.kept_answers["canary"].append(answer(key, self.candidate_value, 1.5, version=2, time=now,
                                                          number=len(self.kept_answers["canary"])))
            self.kept_failures["canary"] = [{"time": now, "version": 2, "traffic": "users", "code": "INTERNAL",
                                             "message": "broken", "rows": [], "row_count": 1}] * self.canary_failures
        return super().server_gets(track, version, path)


def shadow_verifier(backend, limits: ShadowLimits = LIMITS, window_seconds: float = 4.0):
    from rollout.verify import Verifier

    clock = [0.0]
    lines: list[str] = []
    settings = Limits(max_abs_diff=0.001, max_error_rate=0.01, max_p99_ms=250.0, window_seconds=window_seconds,
                      requests_per_second=20.0, timeout_s=5.0, user_steps=4)
    verifier = Verifier(backend, MODEL, [], settings, log=lines.append,
                        sleep=lambda s: clock.__setitem__(0, clock[0] + s), clock=lambda: clock[0], shadow=limits)
    return verifier, lines


def test_a_shadow_window_reads_both_tracks_every_few_seconds_and_decides_once_it_has_the_evidence(tmp_path):
    backend = CopyingBackend(tmp_path, per_read=60)
    verifier, lines = shadow_verifier(backend)
    figures = verifier.shadow_window(1, 2)
    # 4 s windows read every 2 s: 120 pairs a look, so the third look holds the 336 the step needs.
    assert (figures["verdict"], figures["looks"], figures["seconds"]) == ("passed", 3, 12.0)
    assert figures["shadow"]["pairs"] == 360 and figures["requests"] == figures["stable"]["requests"] == 360
    assert (figures["p99_ms"], figures["stable"]["p99_ms"], figures["shadow"]["latency_ratio"]) == (1.5, 1.0, 1.5)
    assert lines == [f"shadow window after {s}s: {n} requests answered by both versions of the {NEEDED} the step "
                     f"needs; watching 4s more" for s, n in ((4, 120), (8, 240))]


def test_a_shadow_window_short_of_evidence_at_its_last_look_is_inconclusive(tmp_path):
    backend = CopyingBackend(tmp_path, per_read=10)
    figures = shadow_verifier(backend)[0].shadow_window(1, 2)
    assert figures["verdict"] == INCONCLUSIVE and figures["looks"] == 5 and figures["shadow"]["pairs"] == 100


def test_a_shadow_window_fails_on_the_copies_errors_and_on_decisions(tmp_path):
    failing = shadow_verifier(CopyingBackend(tmp_path / "a", per_read=60, canary_failures=30))[0].shadow_window(1, 2)
    assert failing["verdict"] == FAILED and failing["errors"] == 30 and "copied to it" in failing["error"]
    deciding = shadow_verifier(CopyingBackend(tmp_path / "b", per_read=60, candidate_value=0.7))[0].shadow_window(1, 2)
    assert deciding["verdict"] == FAILED and deciding["looks"] == 1 and "decisions disagree" in deciding["error"]
    assert deciding["shadow"]["examples"][0] == {"request_id": "r1-0", "stable": 0.2, "candidate": 0.7,
                                                 "disagree": True, "inputs": {"fare": 0.0}}


def test_a_shadow_window_that_cannot_read_a_server_is_inconclusive(tmp_path):
    backend = CopyingBackend(tmp_path, per_read=60)
    real = backend.server_gets
    backend.server_gets = lambda track, version, path: (
        [("canary-0", 0, "GET http://canary-0/monitoring/answers: connection refused")]
        if track == "canary" and "answers" in path else real(track, version, path))
    figures = shadow_verifier(backend)[0].shadow_window(1, 2)
    assert figures["verdict"] == INCONCLUSIVE and figures["inconclusive"].startswith(
        "the answers of 1 server(s) could not be read: canary-0: no answer GET http://canary-0")


def test_the_controller_mirrors_at_the_shadow_step_only_and_never_after_a_rollback(tmp_path):
    from tests.rollout.test_phases import Fleet

    fleet = Fleet(tmp_path)
    fleet.backend.mirrors = True
    verifier = ScriptedVerifier()
    record = fleet.controller(verifier, shadow_percent=100).start(2)
    assert record["outcome"] == "promoted" and verifier.windows == ["shadow", 50, 100]
    assert [w for w in fleet.backend.writes if w[0] in ("mirror", "weight")] == [
        ("mirror", 100), ("mirror", 0), ("weight", 50), ("weight", 100), ("weight", 0)]
    failed = ScriptedVerifier(fail_at=("shadow",))
    fleet.backend.writes.clear()
    record = fleet.controller(failed, shadow_percent=100).start(3)
    assert record["outcome"] == "rolled_back" and record["reason"].startswith("verification at 0% failed: the "
                                                                              "candidate's decisions disagree")
    assert [w for w in fleet.backend.writes if w[0] in ("mirror", "weight")] == [("mirror", 100), ("mirror", 0)]
    assert fleet.backend.shadow_percent() == 0 and fleet.backend.weight == 0


def test_without_a_router_that_mirrors_the_zero_step_is_the_verifiers_window(tmp_path):
    from tests.rollout.test_phases import Fleet

    fleet = Fleet(tmp_path)
    verifier = ScriptedVerifier()
    assert fleet.controller(verifier, shadow_percent=100).start(2)["outcome"] == "promoted"
    assert verifier.windows == [0, 50, 100] and not [w for w in fleet.backend.writes if w[0] == "mirror"]
