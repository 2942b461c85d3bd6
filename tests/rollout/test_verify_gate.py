"""The verifier's gate at its edges, with a backend in memory, scripted clients and scripted metrics (no server):
the golden comparison on every row, every output, both transports and every canary server; each window threshold
(error rate, p99, requests; absolute and relative to stable) just inside and just outside its limit, from the
servers' metrics and from the verifier's own requests; and every reason a window is inconclusive."""
from __future__ import annotations

import math

import pytest
from scipy import stats

from rollout.backends import Endpoint
from rollout.controller import describe_figures
from rollout.metrics import MetricsError, Snapshot, window_figures
from rollout.verify import (
    INCONCLUSIVE,
    MIN_SHARE_REQUESTS,
    NO_TRAFFIC_CHANCE,
    Limits,
    Verifier,
    _serving_clients,
    compare_answers,
    share_check,
)
from serving import TRAFFIC_HEADER, VERIFIER_TRAFFIC
from serving.clients import ServingError
from tests.rollout.memory import MODEL, HookedStore, MemoryBackend, ScriptedClient, ScriptedMetrics, counters

ROWS = [{"x": float(i)} for i in range(5)]
LIMITS = Limits(max_abs_diff=0.01, max_error_rate=0.01, max_p99_ms=250.0, window_seconds=1.0,
                requests_per_second=8.0, timeout_s=1.0, max_error_rate_increase=0.005, max_p99_ratio=2.0,
                share_tolerance_sigmas=4.0)
# The verifier's own window (no metrics source, or 0%): 1 s at 8 requests a second on a fake clock, so exactly 8.
SENT = 8


def probability(row: dict) -> dict:
    return {"probability": 0.1 * row["x"]}


def answers(shift: dict[int, float] | None = None) -> callable:
    """Answers as stable gives them, row i moved by shift[i]."""
    shift = shift or {}
    return lambda rows, version: [{"probability": probability(r)["probability"] + shift.get(int(r["x"]), 0.0)}
                                  for r in rows]


def build(tmp_path, rest=None, grpc=None, metrics=None, canaries=1, limits=LIMITS, stable_answers=None):
    """A verifier on a memory backend: stable answers `stable_answers` (default the reference), each canary server
    answers `rest` and `grpc` (functions, or lists of them per canary server)."""
    backend = MemoryBackend(HookedStore(tmp_path), metrics=metrics)
    backend._endpoints = {"stable": [Endpoint("http://stable", "stable:1")],
                          "canary": [Endpoint(f"http://canary-{i}", f"canary-{i}:1") for i in range(canaries)]}
    clock = [0.0]
    per_server = {}
    for i in range(canaries):
        r = rest[i] if isinstance(rest, list) else rest
        g = grpc[i] if isinstance(grpc, list) else grpc
        per_server[f"http://canary-{i}"] = (r or ScriptedClient(answers(), clock=clock),
                                            g or ScriptedClient(answers(), clock=clock))
    stable = ScriptedClient(stable_answers or answers(), clock=clock)
    per_server["http://stable"] = (stable, stable)

    def clients(endpoint, retries):
        retries_asked.append((endpoint.rest, retries))
        return per_server[endpoint.rest]

    retries_asked: list[tuple[str, int | None]] = []
    per_server["retries"] = retries_asked

    def sleep(seconds):
        clock[0] += seconds

    verifier = Verifier(backend, MODEL, ROWS, limits, log=lambda _: None, sleep=sleep, clients=clients,
                        clock=lambda: clock[0])
    return verifier, per_server, clock


# The golden comparison


@pytest.mark.parametrize("transport", ["rest", "grpc"])
@pytest.mark.parametrize("row", [0, 4])
def test_golden_answers_over_rest_and_grpc_within_the_limit_pass_and_one_row_beyond_it_fails(tmp_path, transport,
                                                                                            row):
    inside = {transport: ScriptedClient(answers({row: 0.0099}))}
    verifier, _, _ = build(tmp_path, **inside)
    figures = verifier.golden(1, 2)
    assert "error" not in figures and figures["rest_grpc_max_abs_diff"] == pytest.approx(0.0099)
    outside = {transport: ScriptedClient(answers({row: 0.0101}))}
    verifier, _, _ = build(tmp_path, **outside)
    figures = verifier.golden(1, 2)
    assert figures["rest_grpc_max_abs_diff"] == pytest.approx(0.0101)
    assert figures["error"] == ("candidate 2 answers the golden rows differently over REST and gRPC on "
                                "http://canary-0: max |diff| 0.010100 > rollout.max_abs_diff 0.01")


# With LIMITS the deciding look's significance is 0.01 / 1 step / 2 tests / 2 = 0.0025: of 5 rows, one decided
# otherwise is 4.9% likely at max_disagreement_rate 0.01, two 0.098%.
def test_golden_decisions_unlike_stable_on_one_row_pass_and_on_two_fail(tmp_path):
    assert stats.binom.sf(0, 5, 0.01) > 0.0025 >= stats.binom.sf(1, 5, 0.01)
    # Rows 1 and 3 answer 0.1 and 0.3 on stable: moved by 0.2, beyond max_relative_error 0.05 of them.
    one = answers({1: 0.2})
    verifier, _, _ = build(tmp_path, rest=ScriptedClient(one), grpc=ScriptedClient(one))
    figures = verifier.golden(1, 2)
    assert "error" not in figures and figures["disagreements"] == 1
    assert figures["rest_max_abs_diff"] == pytest.approx(0.2)
    assert figures["disagreement_p"] == pytest.approx(stats.binom.sf(0, 5, 0.01))
    two = answers({1: 0.2, 3: 0.2})
    verifier, _, _ = build(tmp_path, rest=ScriptedClient(two), grpc=ScriptedClient(two))
    figures = verifier.golden(1, 2)
    assert figures["disagreements"] == 2 and figures["disagreement_rate"] == 0.4
    assert figures["error"] == ("candidate 2 disagrees with stable 1 on the values for 2 of 5 golden rows (40.0%): "
                                "above rollout.shadow.max_disagreement_rate 0.01 (exact binomial test, p 9.8e-04 <= "
                                "2.5e-03)")


@pytest.mark.parametrize("user_steps", [3, 4])  # rollout.steps [10, 50, 100], without and with the shadow step
def test_with_the_defaults_four_of_64_golden_rows_decided_otherwise_pass_and_five_fail(tmp_path, user_steps):
    defaults = Limits(max_abs_diff=0.001, max_error_rate=0.01, max_p99_ms=250.0, window_seconds=30.0,
                      requests_per_second=20.0, timeout_s=10.0, user_steps=user_steps)
    for moved, failed in ((4, False), (5, True)):
        shifted = answers({x: 1.0 for x in range(1, 1 + moved)})
        verifier, _, _ = build(tmp_path, rest=ScriptedClient(shifted), grpc=ScriptedClient(shifted), limits=defaults)
        verifier.rows = [{"x": float(i)} for i in range(64)]
        figures = verifier.golden(1, 2)
        assert (figures["disagreements"], "error" in figures) == (moved, failed), figures


def test_golden_values_within_max_relative_error_agree_and_a_p_value_at_the_significance_fails(tmp_path):
    # Row 3 answers 0.3 on stable: 0.009 more is 3%, within max_relative_error 0.05 (above max_disagreement_rate).
    close = answers({3: 0.009})
    verifier, _, _ = build(tmp_path, rest=ScriptedClient(close), grpc=ScriptedClient(close))
    assert verifier.golden(1, 2)["disagreements"] == 0
    # The significance set to exactly the p-value of 2 rows of 5: 0.01 / 1 step / 2 tests / 2 looks' share.
    p_two = stats.binom.sf(1, 5, 0.01)
    at_p = Limits(**{**LIMITS.__dict__, "false_rollback_rate": 4 * p_two})
    two = answers({1: 0.2, 3: 0.2})
    verifier, _, _ = build(tmp_path, rest=ScriptedClient(two), grpc=ScriptedClient(two), limits=at_p)
    figures = verifier.golden(1, 2)
    assert figures["disagreement_p"] == at_p.evidence_rules().alpha(deciding=True) and "error" in figures


def test_golden_outputs_of_one_number_lists_are_compared_as_numbers(tmp_path):
    def listed(shift: dict[int, float]):
        return lambda rows, version: [{"probability": [0.1 * r["x"] + shift.get(int(r["x"]), 0.0)]} for r in rows]

    verifier, _, _ = build(tmp_path, stable_answers=listed({}), rest=ScriptedClient(listed({1: 0.2})),
                           grpc=ScriptedClient(listed({1: 0.2})))
    figures = verifier.golden(1, 2)
    assert figures["disagreements"] == 1 and "error" not in figures


@pytest.mark.parametrize("more", ["rest", "grpc"])
def test_golden_decisions_are_counted_on_each_transport_and_server_and_the_most_is_judged(tmp_path, more):
    one, two = answers({1: 0.2}), answers({1: 0.2, 3: 0.2})
    # REST and gRPC then differ by 0.2 on row 3: allow that, to see the decisions alone.
    wide = Limits(**{**LIMITS.__dict__, "max_abs_diff": 1.0})
    clients = {"rest": ScriptedClient(one), "grpc": ScriptedClient(one), more: ScriptedClient(two)}
    verifier, _, _ = build(tmp_path, limits=wide, **clients)
    assert verifier.golden(1, 2)["disagreements"] == 2
    good = ScriptedClient(answers())
    verifier, _, _ = build(tmp_path, canaries=2, rest=[good, ScriptedClient(two)], grpc=[good, ScriptedClient(two)])
    assert verifier.golden(1, 2)["disagreements"] == 2


def test_golden_decisions_of_a_binary_model_are_taken_at_each_versions_threshold(tmp_path):
    def binary(shift: float):
        return lambda rows, version: [{"probabilities": 0.1 * r["x"] + shift} for r in rows]

    publications = {1: {"task": {"kind": "binary"}, "calibration": {"threshold": 0.25}},
                    2: {"task": {"kind": "binary"}, "calibration": {"threshold": 0.35}}}
    # Stable decides yes on rows 3 and 4 (0.3, 0.4 >= 0.25); the candidate, 0.1 higher at its threshold 0.35, on
    # rows 3 and 4 too (0.4, 0.5): the same decisions though every probability moved by 0.1.
    verifier, _, _ = build(tmp_path, stable_answers=binary(0.0), rest=ScriptedClient(binary(0.1)),
                           grpc=ScriptedClient(binary(0.1)))
    verifier.backend.publication = lambda model, version: publications[version]
    figures = verifier.golden(1, 2)
    assert (figures["disagreements"], figures["rest_max_abs_diff"]) == (0, pytest.approx(0.1))
    # 0.2 higher, rows 2 to 4 (0.4, 0.5, 0.6) are yes: row 2 decided otherwise.
    verifier, _, _ = build(tmp_path, stable_answers=binary(0.0), rest=ScriptedClient(binary(0.2)),
                           grpc=ScriptedClient(binary(0.2)))
    verifier.backend.publication = lambda model, version: publications[version]
    assert verifier.golden(1, 2)["disagreements"] == 1


def test_golden_classes_that_differ_are_decisions_not_another_shape(tmp_path):
    def multiclass(flipped: set[int]):
        return lambda rows, version: [{"class": "b" if int(r["x"]) in flipped else "a", "classes": ["a", "b"]}
                                      for r in rows]

    verifier, _, _ = build(tmp_path, stable_answers=multiclass(set()), rest=ScriptedClient(multiclass({2})),
                           grpc=ScriptedClient(multiclass({2})))
    figures = verifier.golden(1, 2)
    assert "error" not in figures and figures["disagreements"] == 1
    verifier, _, _ = build(tmp_path, stable_answers=multiclass(set()), rest=ScriptedClient(multiclass({2, 4})),
                           grpc=ScriptedClient(multiclass({2, 4})))
    assert verifier.golden(1, 2)["error"].startswith("candidate 2 disagrees with stable 1 on the decisions for 2 of 5")


def test_golden_asks_the_stable_and_candidate_versions_for_every_row(tmp_path):
    verifier, per_server, _ = build(tmp_path)
    figures = verifier.golden(1, 2)
    assert figures == {"rows": 5, "rest_max_abs_diff": 0.0, "grpc_max_abs_diff": 0.0, "rest_grpc_max_abs_diff": 0.0,
                       "disagreements": 0, "disagreement_rate": 0.0, "disagreement_p": 1.0}
    options = {"timeout": 1.0, "drop_unknown_features": True}
    assert per_server["http://stable"][0].requests == [(MODEL, 1, options)]
    assert [c.requests for c in per_server["http://canary-0"]] == [[(MODEL, 2, options)], [(MODEL, 2, options)]]


def test_a_difference_exactly_at_the_limit_passes(tmp_path):
    # Row 0 answers 0.0 on stable: moved by 0.01 it differs by exactly rollout.max_abs_diff.
    verifier, _, _ = build(tmp_path, rest=ScriptedClient(answers({0: 0.01})))
    figures = verifier.golden(1, 2)
    assert figures["rest_max_abs_diff"] == 0.01 and "error" not in figures


def test_golden_compares_rest_with_grpc_on_the_canary(tmp_path):
    verifier, _, _ = build(tmp_path, grpc=ScriptedClient(answers({2: -0.004})),
                           rest=ScriptedClient(answers({2: 0.004})))
    figures = verifier.golden(1, 2)
    assert figures["rest_grpc_max_abs_diff"] == pytest.approx(0.008) and "error" not in figures


def test_golden_checks_every_canary_server(tmp_path):
    good, bad = ScriptedClient(answers()), ScriptedClient(answers({3: 0.5}))
    verifier, _, _ = build(tmp_path, canaries=2, rest=[good, bad], grpc=[good, good])
    figures = verifier.golden(1, 2)
    assert figures["rest_max_abs_diff"] == pytest.approx(0.5) and "error" in figures


def test_golden_compares_every_output_of_every_row(tmp_path):
    def multiclass(shift: float, second_class: str = "b"):
        return lambda rows, version: [{"class": "a", "classes": ["a", second_class],
                                       "probabilities": [0.7, 0.3 + (shift if i == len(rows) - 1 else 0.0)]}
                                      for i, _ in enumerate(rows)]

    verifier, _, _ = build(tmp_path, stable_answers=multiclass(0.0), rest=ScriptedClient(multiclass(0.02)),
                           grpc=ScriptedClient(multiclass(0.0)))
    assert verifier.golden(1, 2)["rest_max_abs_diff"] == pytest.approx(0.02)
    verifier, _, _ = build(tmp_path, stable_answers=multiclass(0.0), rest=ScriptedClient(multiclass(0.0)),
                           grpc=ScriptedClient(multiclass(0.0, second_class="c")))
    figures = verifier.golden(1, 2)
    assert "gRPC on http://canary-0: row 0 output 'classes'" in figures["error"]


@pytest.mark.parametrize("answer, problem", [
    (lambda rows, version: [probability(r) for r in rows[:-1]], "4 rows answered for 5 asked"),
    (lambda rows, version: [{"value": 0.1 * r["x"]} for r in rows],
     "row 0 has outputs ['value'], stable answers ['probability']"),
])
def test_golden_answers_of_another_shape_fail(tmp_path, answer, problem):
    verifier, _, _ = build(tmp_path, grpc=ScriptedClient(answer))
    figures = verifier.golden(1, 2)
    # The first problem found: gRPC against stable (then REST against gRPC, the same rows).
    assert figures["error"] == (f"candidate 2 answers the golden rows unlike stable 1: gRPC on http://canary-0: "
                                f"{problem}")
    assert figures["grpc_max_abs_diff"] == math.inf and figures["rest_grpc_max_abs_diff"] == math.inf
    verifier, _, _ = build(tmp_path, rest=ScriptedClient(answer))
    assert verifier.golden(1, 2)["error"].endswith(f"unlike stable 1: REST on http://canary-0: {problem}")


def test_golden_requests_that_fail_fail_the_step(tmp_path):
    verifier, _, _ = build(tmp_path, grpc=ScriptedClient(answers(), error=ServingError("refused", "UNAVAILABLE")))
    assert verifier.golden(1, 2)["error"] == "golden requests failed: refused"


def test_compare_answers_reports_the_largest_difference_anywhere():
    reference = [{"p": [0.1, 0.2]}, {"p": [0.3, 0.4]}]
    assert compare_answers(reference, [{"p": [0.1, 0.2]}, {"p": [0.3, 0.45]}]) == (pytest.approx(0.05), "")
    assert compare_answers(reference, reference) == (0.0, "")


# Windows measured by the verifier (no metrics source)


def failing_on(calls: set[int], latency_ms: dict[int, float] | None = None, clock=None):
    """A client that fails its calls numbered in `calls` (1-based) and takes latency_ms[n] on call n."""
    state = {"n": 0}
    latency_ms = latency_ms or {}

    def answer(rows, version):
        state["n"] += 1
        if clock is not None:
            clock[0] += latency_ms.get(state["n"], 0.0) / 1000.0
        if state["n"] in calls:
            raise ServingError("boom", "INTERNAL")
        return [probability(r) for r in rows]

    return ScriptedClient(answer)


@pytest.mark.parametrize("errors, verdict", [(1, "passed"), (2, "failed")])
def test_the_verifiers_own_error_rate_at_the_limit(tmp_path, errors, verdict):
    # 100 requests (REST and gRPC in turn): 1 error is a rate of 0.01, at the limit; 2 are over it.
    limits = Limits(**{**LIMITS.__dict__, "requests_per_second": 100.0, "window_seconds": 1.0})
    rest = failing_on(set(range(1, errors + 1)))
    verifier, _, _ = build(tmp_path, rest=rest, limits=limits)
    figures = verifier.window(2, 10)
    assert figures["source"] == "verifier" and figures["requests"] == 100 and figures["errors"] == errors
    assert figures["error_rate"] == pytest.approx(errors / 100) and figures["verdict"] == verdict


@pytest.mark.parametrize("slow, verdict", [(1, "passed"), (2, "failed")])
def test_the_verifiers_own_p99_is_the_99th_percentile(tmp_path, slow, verdict):
    limits = Limits(**{**LIMITS.__dict__, "requests_per_second": 100.0, "window_seconds": 2.0})
    verifier, per_server, clock = build(tmp_path, limits=limits)
    # Between 101 and 200 answers, of which `slow` take 300 ms: the nearest-rank p99 is the second largest.
    latency = {n: (300.0 if n <= slow else 1.0) for n in range(1, 201)}
    per_server["http://canary-0"] = (failing_on(set(), latency, clock), failing_on(set(), {}, clock))
    figures = verifier.window(2, 10)
    assert 101 <= figures["requests"] <= 200
    assert figures["verdict"] == verdict
    assert figures["p99_ms"] == pytest.approx(300.0 if slow == 2 else 1.0, abs=0.01)


# Windows of the users' requests, as the servers' metrics counted them


def snap(canary: dict[str, object], stable: dict[str, object] | None = None, missing=None) -> Snapshot:
    return Snapshot({"canary": canary, "stable": stable if stable is not None else {"stable-0": counters()}},
                    missing or {})


def metrics_window(tmp_path, before: Snapshot, *afters: Snapshot | Exception, weight: int = 100, limits=LIMITS,
                   log=None):
    """The window on scripted snapshots: `before`, then one per look."""
    source = ScriptedMetrics(before, *afters)
    verifier, per_server, _ = build(tmp_path, metrics=source, limits=limits)
    if log is not None:
        verifier.log = log.append
    figures = verifier.window(2, weight)
    assert per_server["http://canary-0"][0].calls == 0, "the verifier sends nothing during a window of users"
    assert source.calls[0] is None and all(c is not None for c in source.calls[1:]), "later looks wait for a scrape"
    assert set(source.models) == {MODEL}
    return figures


def test_a_window_judges_the_users_requests_the_servers_counted(tmp_path):
    before = snap({"c-0": counters(ok=100), "c-1": counters(ok=50, errors=1)}, {"s-0": counters(ok=10)})
    after = snap({"c-0": counters(ok=100 + 400), "c-1": counters(ok=50 + 100, errors=1 + 2)},
                 {"s-0": counters(ok=10 + 500)})
    figures = metrics_window(tmp_path, before, after, weight=50)
    assert figures["verdict"] == "passed", figures
    assert (figures["requests"], figures["errors"], figures["traffic"], figures["verifier_requests"]) == (
        502, 2, "users", 0)
    # Every prediction in the 1 ms bucket: the 99th percentile is 0.99 of the way through it.
    assert figures["p99_ms"] == pytest.approx(0.99) and figures["source"] == "prometheus"
    assert (figures["seconds"], figures["looks"]) == (1.0, 1)
    assert figures["evidence"] == {"canary_requests": 502, "canary_errors": 2, "stable_requests": 500,
                                   "stable_errors": 0, "needed": 286, "alpha": 0.0025, "decided_at_look": 1,
                                   "limit_p": pytest.approx(stats.binom.sf(1, 502, 0.01)),
                                   "stable_p": pytest.approx(stats.fisher_exact([[2, 500], [0, 500]],
                                                                                alternative="greater")[1])}
    assert figures["share"] == {"user_requests": 1002, "expected": 0.5, "checked": True,
                                "observed": pytest.approx(502 / 1002),
                                "tolerance": pytest.approx(4 * 0.5 / math.sqrt(1002))}


@pytest.mark.parametrize("errors, verdict", [(20, "passed"), (21, "failed")])
def test_the_canary_error_rate_above_the_limit_by_the_exact_binomial_test(tmp_path, errors, verdict):
    # 1000 user requests at 100%: at 0.01, 20 or more errors have chance 0.0033, 21 or more 0.0015 (alpha 0.0025).
    after = snap({"c-0": counters(ok=1000 - errors, errors=errors)})
    figures = metrics_window(tmp_path, snap({"c-0": counters()}), after)
    assert figures["evidence"]["canary_requests"] == 1000 and figures["verdict"] == verdict
    if verdict == "failed":
        assert figures["error"] == ("the canary failed 21 of its 1000 user requests (2.1%): above "
                                    "rollout.max_error_rate 0.01 (exact binomial test, p 1.5e-03 <= 2.5e-03)")


@pytest.mark.parametrize("canary_errors, verdict", [(27, "passed"), (28, "failed")])
def test_the_canary_error_rate_against_stables_by_fishers_exact_test(tmp_path, canary_errors, verdict):
    # 1000 requests a track at 50%, stable failing 10: 27 canary errors have p 0.0035, 28 have 0.0023 (alpha 0.0025).
    limits = Limits(**{**LIMITS.__dict__, "max_error_rate": 0.5})
    before = snap({"c-0": counters()}, {"s-0": counters()})
    after = snap({"c-0": counters(ok=1000 - canary_errors, errors=canary_errors)}, {"s-0": counters(ok=990, errors=10)})
    figures = metrics_window(tmp_path, before, after, weight=50, limits=limits)
    assert figures["verdict"] == verdict
    if verdict == "failed":
        assert figures["error"] == ("the canary failed 28 of its 1000 user requests (2.8%) against stable's 10 of 1000 "
                                    "(1.0%) in the same window: more than rollout.max_error_rate_increase 0.005 above "
                                    "it (Fisher's exact test, p 2.3e-03 <= 2.5e-03)")


@pytest.mark.parametrize("canary_errors, verdict", [(20, "passed"), (21, "failed")])
def test_a_significant_rise_within_max_error_rate_increase_passes(tmp_path, canary_errors, verdict):
    # Stable failed none of 1000: 20 canary errors of 1000 are a rise of 0.02, exactly the increase allowed here.
    limits = Limits(**{**LIMITS.__dict__, "max_error_rate": 0.5, "max_error_rate_increase": 0.02})
    before = snap({"c-0": counters()}, {"s-0": counters()})
    after = snap({"c-0": counters(ok=1000 - canary_errors, errors=canary_errors)}, {"s-0": counters(ok=1000)})
    figures = metrics_window(tmp_path, before, after, weight=50, limits=limits)
    assert figures["evidence"]["stable_p"] < 1e-6 and figures["verdict"] == verdict


@pytest.mark.parametrize("canary, verdict", [(216, INCONCLUSIVE), (217, "passed")])
def test_a_step_passes_only_with_the_canary_user_requests_it_needs(tmp_path, canary, verdict):
    limits = Limits(**{**LIMITS.__dict__, "max_window_extensions": 0})
    figures = metrics_window(tmp_path, snap({"c-0": counters()}), snap({"c-0": counters(ok=canary)}), limits=limits)
    assert figures["evidence"]["needed"] == 217 and figures["verdict"] == verdict
    if verdict == INCONCLUSIVE:
        assert figures["inconclusive"] == (
            "the canary got 216 user requests at 100% in 1s, fewer than the 217 a step needs to catch a rise of 0.05 "
            "in its error rate with probability 0.95 (rollout.min_error_rate_regression): send more traffic, or "
            "lengthen rollout.window_seconds or rollout.max_window_extensions")


def test_a_window_short_of_requests_is_watched_longer_and_judged_over_all_of_it(tmp_path):
    lines: list[str] = []
    looks = [snap({"c-0": counters(ok=100 * i)}) for i in (1, 2, 3)]
    figures = metrics_window(tmp_path, snap({"c-0": counters()}), *looks, log=lines)
    assert (figures["verdict"], figures["looks"], figures["seconds"]) == ("passed", 3, 3.0)
    assert figures["evidence"]["canary_requests"] == 300 and figures["evidence"]["decided_at_look"] == 3
    assert lines == ["window at 100% after 1s: 100 of the 217 canary user requests the step needs; watching 1s more",
                     "window at 100% after 2s: 200 of the 217 canary user requests the step needs; watching 1s more"]


def test_the_last_extension_short_of_requests_is_inconclusive(tmp_path):
    limits = Limits(**{**LIMITS.__dict__, "max_window_extensions": 2})
    looks = [snap({"c-0": counters(ok=50 * i)}) for i in (1, 2, 3)]
    figures = metrics_window(tmp_path, snap({"c-0": counters()}), *looks, limits=limits)
    assert (figures["verdict"], figures["looks"]) == (INCONCLUSIVE, 3)
    assert figures["inconclusive"].startswith("the canary got 150 user requests at 100% in 3s, fewer than the 217")


@pytest.mark.parametrize("errors, verdict", [(4, "extend"), (5, "failed")])
def test_an_earlier_look_fails_only_on_stronger_evidence(tmp_path, errors, verdict):
    # 50 requests at the first of 5 looks (alpha 0.000625): at 0.01, 4 or more errors have chance 0.0016, which a
    # deciding look (alpha 0.0025) would fail; 5 or more 0.00015.
    first = snap({"c-0": counters(ok=50 - errors, errors=errors)})
    later = snap({"c-0": counters(ok=1000 - errors, errors=errors)})
    figures = metrics_window(tmp_path, snap({"c-0": counters()}), first, later)
    assert figures["looks"] == (1 if verdict == "failed" else 2)
    assert figures["verdict"] == ("failed" if verdict == "failed" else "passed")


@pytest.mark.parametrize("p99, verdict", [(249.999, "passed"), (250.001, "failed")])
def test_the_servers_p99_at_the_limit(tmp_path, p99, verdict):
    # 980 of 1000 predictions in the 1 ms bucket, 20 in the next: the 99th percentile lies half way through it (rank
    # 990), interpolated as Prometheus' histogram_quantile does.
    bound_us = 1000.0 + (p99 * 1000.0 - 1000.0) / 0.5
    slow = {1000.0: 980, bound_us: 1000, math.inf: 1000}
    figures = metrics_window(tmp_path, snap({"c-0": counters()}), snap({"c-0": counters(ok=1000, latency_us=slow)}))
    assert figures["p99_ms"] == pytest.approx(p99) and figures["verdict"] == verdict
    if verdict == "failed":
        assert figures["error"] == "p99 latency 250.0 ms > rollout.max_p99_ms 250.0"


def judged(verifier: Verifier, p99: float, stable_p99: float = 0.0, stable_predictions: int = 0) -> dict:
    """The judgement on figures given exactly: 1000 canary predictions at 50%, no error."""
    stable = {"requests": stable_predictions, "errors": 0, "error_rate": 0.0, "predictions": stable_predictions,
              "p99_ms": stable_p99}
    return verifier._judge_users({"requests": 1000, "errors": 0, "error_rate": 0.0, "predictions": 1000,
                                  "p99_ms": p99, "stable": stable,
                                  "seconds": 1.0, "looks": 1,
                                  "share": share_check(1000, stable_predictions, 50, 1000.0)}, 50, last=True)


@pytest.mark.parametrize("p99, verdict", [(250.0, "passed"), (math.nextafter(250.0, math.inf), "failed")])
def test_a_p99_exactly_at_the_limit_passes_and_the_next_float_fails(tmp_path, p99, verdict):
    # The interpolated figures above cannot land on the limit itself; the judgement is taken on figures given exactly.
    verifier, _, _ = build(tmp_path)
    assert judged(verifier, p99)["verdict"] == verdict


@pytest.mark.parametrize("p99, verdict", [(4.0, "passed"), (math.nextafter(4.0, math.inf), "failed")])
def test_a_p99_exactly_at_the_ratio_to_stables_passes_and_the_next_float_fails(tmp_path, p99, verdict):
    verifier, _, _ = build(tmp_path)  # max_p99_ratio 2.0: stable's 2.0 ms allows 4.0 ms
    figures = judged(verifier, p99, stable_p99=2.0, stable_predictions=1000)
    assert figures["verdict"] == verdict
    if verdict == "failed":
        assert figures["error"].endswith("> rollout.max_p99_ratio 2.0x")


@pytest.mark.parametrize("canary_p99, stable_predictions, verdict", [
    (3.979, 1000, "passed"), (3.981, 1000, "failed"), (3.981, 20, "failed"), (3.981, 19, "passed")])
def test_the_canary_p99_against_stable_in_the_same_window(tmp_path, canary_p99, stable_predictions, verdict):
    # Every prediction in the bucket above 1 ms (the first, empty, from the counters before): the 99th percentile is
    # 0.99 of the way through it. Stable's (1, 2] ms gives 1.99 ms; at most 2x (max_p99_ratio here) is 3.98 ms; stable
    # needs 20 predictions to be a reference.
    before = snap({"c-0": counters()}, {"s-0": counters()})
    canary = {1000.0 + (canary_p99 * 1000 - 1000) / 0.99: 1000.0, math.inf: 1000.0}
    stable = {2000.0: stable_predictions, math.inf: stable_predictions}
    after = snap({"c-0": counters(ok=1000, latency_us=canary)},
                 {"s-0": counters(ok=stable_predictions, latency_us=stable)})
    limits = Limits(**{**LIMITS.__dict__, "share_tolerance_sigmas": 100.0})
    figures = metrics_window(tmp_path, before, after, weight=50, limits=limits)
    assert (figures["p99_ms"], figures["stable"]["p99_ms"]) == pytest.approx((canary_p99, 1.99))
    assert figures["verdict"] == verdict
    if verdict == "failed":
        assert figures["error"] == ("p99 latency 4.0 ms against stable's 2.0 ms in the same window > "
                                    "rollout.max_p99_ratio 2.0x")


@pytest.mark.parametrize("joined_errors, verdict", [(20, "passed"), (21, "failed")])
def test_a_server_the_hpa_added_during_the_window_is_counted_from_zero(tmp_path, joined_errors, verdict):
    """A canary pod unknown to the first snapshot started during the window: all it counted is the window's, so its
    errors decide with the others' (before, a new pod made every window inconclusive and the rollout rolled back)."""
    before = snap({"c-0": counters(ok=700, errors=7)})
    after = snap({"c-0": counters(ok=700 + 500, errors=7), "c-1": counters(ok=500 - joined_errors,
                                                                           errors=joined_errors)})
    figures = metrics_window(tmp_path, before, after)
    assert (figures["verdict"], figures["requests"], figures["errors"]) == (verdict, 1000, joined_errors)
    assert figures["joined"] == ["c-1"]


def test_without_stable_users_the_limit_alone_judges_the_errors(tmp_path):
    after = snap({"c-0": counters(ok=995, errors=5)}, {"s-0": counters()})
    figures = metrics_window(tmp_path, snap({"c-0": counters()}, {"s-0": counters()}), after)
    assert figures["verdict"] == "passed" and figures["evidence"]["stable_p"] == 1.0


@pytest.mark.parametrize("before, after, reason", [
    (snap({"c-0": counters()}), snap({"c-0": counters(ok=500)}, missing={"canary": ["c-1"]}),
     "no metrics from the canary server(s) c-1 (failed scrape)"),
    (snap({"c-0": counters()}, missing={"stable": ["s-1"]}), snap({"c-0": counters(ok=500)}),
     "no metrics from the stable server(s) s-1 (failed scrape)"),
    (snap({"c-0": counters(), "c-1": counters()}), snap({"c-0": counters(ok=500)}),
     "the canary server(s) c-1 left during the window (scaled down or replaced): what they answered after the first "
     "snapshot is unknown"),
    (snap({"c-0": counters(ok=800)}), snap({"c-0": counters(ok=500)}),
     "the counters of canary server c-0 went down (it restarted)"),
])
def test_windows_the_figures_of_which_cannot_be_trusted_are_inconclusive(tmp_path, before, after, reason):
    figures = metrics_window(tmp_path, before, after)
    assert figures["verdict"] == INCONCLUSIVE and reason in figures["inconclusive"], figures
    assert "error" not in figures


def test_a_metrics_source_that_cannot_be_read_makes_the_window_inconclusive(tmp_path):
    refused = MetricsError("Prometheus at http://p:9090 refused")
    assert metrics_window(tmp_path, snap({"c-0": counters()}), refused) == {
        "source": "prometheus", "seconds": 1.0, "verdict": INCONCLUSIVE,
        "inconclusive": "Prometheus at http://p:9090 refused"}
    verifier, per_server, _ = build(tmp_path, metrics=ScriptedMetrics(refused))
    assert verifier.window(2, 10) == {"source": "prometheus", "seconds": 0.0, "verdict": INCONCLUSIVE,
                                      "inconclusive": "Prometheus at http://p:9090 refused"}
    assert per_server["http://canary-0"][0].calls == 0, "no request is sent for a window that cannot be measured"


def test_at_0_percent_no_user_reaches_the_canary_and_the_verifier_sends_its_own_requests(tmp_path):
    source = ScriptedMetrics()
    verifier, per_server, _ = build(tmp_path, metrics=source)
    figures = verifier.window(2, 0)
    assert (figures["source"], figures["traffic"], figures["requests"], figures["verdict"]) == (
        "verifier", "verifier", SENT, "passed")
    assert source.calls == [] and per_server["http://canary-0"][0].calls > 0


def test_the_window_asks_the_candidate_once_per_request_without_retries(tmp_path):
    limits = Limits(**{**LIMITS.__dict__, "window_seconds": 0.0})
    verifier, per_server, _ = build(tmp_path, limits=limits)
    figures = verifier.window(2, 10)
    assert figures["requests"] == 1 and figures["seconds"] == 0.0 and figures["verdict"] == "passed"
    rest, grpc = per_server["http://canary-0"]
    assert rest.requests == [(MODEL, 2, {"timeout": 1.0, "drop_unknown_features": True})] and grpc.requests == []
    assert per_server["retries"] == [("http://canary-0", 0)]
    verifier.golden(1, 2)
    assert per_server["retries"][1:] == [("http://stable", None), ("http://canary-0", None)]


def test_the_verifiers_own_p99_keeps_microseconds(tmp_path):
    limits = Limits(**{**LIMITS.__dict__, "window_seconds": 0.0})
    verifier, per_server, clock = build(tmp_path, limits=limits)
    per_server["http://canary-0"] = (ScriptedClient(answers(), latency_ms=1.23456, clock=clock),
                                     ScriptedClient(answers(), clock=clock))
    assert verifier.window(2, 10)["p99_ms"] == 1.235


def test_a_canary_failing_its_limits_fails_whatever_share_it_got(tmp_path):
    after = snap({"c-0": counters(ok=0, errors=100)}, {"s-0": counters(ok=1000)})
    figures = metrics_window(tmp_path, snap({"c-0": counters()}, {"s-0": counters()}), after, weight=50)
    assert figures["verdict"] == "failed" and figures["share"]["inconclusive"]


@pytest.mark.parametrize("canary_user, weight, verdict", [
    (560, 50, "passed"), (565, 50, INCONCLUSIVE), (440, 50, "passed"), (435, 50, INCONCLUSIVE),
    (997, 100, "passed"), (995, 100, INCONCLUSIVE),
])
def test_the_canary_share_of_user_traffic_must_match_the_step_within_a_binomial_tolerance(
        tmp_path, canary_user, weight, verdict):
    # 1000 user requests: at 50%, 4 sigma is 6.3 points; at 100%, 4 requests in 1000.
    before = snap({"c-0": counters()}, {"s-0": counters()})
    after = snap({"c-0": counters(ok=canary_user)}, {"s-0": counters(ok=1000 - canary_user)})
    limits = Limits(**{**LIMITS.__dict__, "max_window_extensions": 0})
    figures = metrics_window(tmp_path, before, after, weight=weight, limits=limits)
    assert figures["share"]["observed"] == pytest.approx(canary_user / 1000)
    assert figures["share"]["user_requests"] == 1000
    assert figures["verdict"] == verdict
    if verdict == INCONCLUSIVE:
        assert "the route does not carry the step's weights" in figures["inconclusive"]


def test_failed_stable_requests_count_toward_the_share(tmp_path):
    before = snap({"c-0": counters()}, {"s-0": counters()})
    after = snap({"c-0": counters(ok=500)}, {"s-0": counters(ok=400, errors=100)})
    figures = metrics_window(tmp_path, before, after, weight=50)
    assert figures["share"]["user_requests"] == 1000 and figures["share"]["observed"] == 0.5


def test_a_share_exactly_at_the_tolerance_passes():
    # 64 requests at 50%: one standard deviation is 0.0625, 4 of them 0.25; 48 of 64 is 0.75, exactly at the edge.
    figures = share_check(48, 16, 50, 4.0)
    assert figures["tolerance"] == 0.25 and figures["observed"] == 0.75 and "inconclusive" not in figures
    outside = share_check(49, 15, 50, 4.0)
    assert outside["inconclusive"] == ("the canary got 76.6% of 64 user requests at a 50% step (tolerance ±25.0%): "
                                       "the route does not carry the step's weights")


def test_the_share_is_judged_only_with_enough_user_traffic():
    assert share_check(1, MIN_SHARE_REQUESTS - 2, 50, 4.0)["checked"] is False
    assert share_check(1, MIN_SHARE_REQUESTS - 1, 50, 4.0)["checked"] is True
    assert "inconclusive" in share_check(1, MIN_SHARE_REQUESTS - 1, 50, 4.0)


@pytest.mark.parametrize("stable, weight, fails", [
    # (1 - weight)^n against NO_TRAFFIC_CHANCE: 0.9^65 = 0.00106, 0.9^66 = 0.00096; 0.5^9 = 0.0020, 0.5^10 = 0.00098.
    (65, 10, False), (66, 10, True), (9, 50, False), (10, 50, True), (687, 1, False), (688, 1, True),
    (5000, 0, False), (1, 100, True),
])
def test_a_canary_that_gets_no_user_at_a_non_zero_step_fails_once_that_is_no_chance(stable, weight, fails):
    assert NO_TRAFFIC_CHANCE == 0.001
    figures = share_check(0, stable, weight, 4.0)
    if fails:
        assert figures["error"].startswith(f"the canary got none of {stable} user requests at a {weight}% step (")
        assert figures["error"].endswith("likely by chance): the route sends it no users")
    else:
        assert "error" not in figures
    assert "error" not in share_check(1, stable, weight, 4.0), "one user request is traffic"


def test_a_window_whose_canary_got_no_user_fails_at_once(tmp_path):
    before = snap({"c-0": counters()}, {"s-0": counters()})
    figures = metrics_window(tmp_path, before, snap({"c-0": counters()}, {"s-0": counters(ok=200)}), weight=10)
    assert figures["verdict"] == "failed" and figures["looks"] == 1
    assert figures["error"].startswith("the canary got none of 200 user requests at a 10% step (7.1e-10 likely")


def test_window_figures_add_up_every_server_of_the_track():
    before = Snapshot({"canary": {"a": counters(ok=1), "b": counters(ok=2)}})
    after = Snapshot({"canary": {"a": counters(ok=11, errors=1), "b": counters(ok=32, errors=2)}})
    figures = window_figures(before, after, "canary")
    assert (figures["requests"], figures["errors"], figures["predictions"], figures["servers"]) == (43, 3, 40, 2)
    assert figures["error_rate"] == pytest.approx(3 / 43)


# The window arithmetic itself


def test_p99_is_interpolated_inside_its_bucket_as_prometheus_does():
    from rollout.metrics import p99_ms

    assert p99_ms({}) == 0.0 and p99_ms({1000.0: 0.0, math.inf: 0.0}) == 0.0
    # One request under 1 ms: the first bucket starts at 0, and its 0.99th share is at 0.99 ms.
    assert p99_ms({1000.0: 1.0, math.inf: 1.0}) == pytest.approx(0.99)
    # 99 of 100 at or under 1 ms: the 99th percentile is that bucket's bound exactly.
    assert p99_ms({1000.0: 99.0, 2000.0: 100.0, math.inf: 100.0}) == pytest.approx(1.0)
    # TF Serving's buckets around 200 ms (10 µs * 1.8^i): (218.6, 393.5] ms. 90 below, 10 inside: the 99th is 9/10 of
    # the way through that bucket, not its bound.
    low, high = 10 * 1.8 ** 17, 10 * 1.8 ** 18
    assert p99_ms({low: 90.0, high: 100.0, math.inf: 100.0}) == pytest.approx((low + 0.9 * (high - low)) / 1000)
    # The review's case: a p99 just above 218.6 ms stays under a 250 ms limit; the bucket's bound, 393.5 ms, did not.
    assert p99_ms({low: 989.0, high: 1000.0, math.inf: 1000.0}) == pytest.approx((low + (high - low) / 11) / 1000)
    assert p99_ms({low: 989.0, high: 1000.0, math.inf: 1000.0}) < 250 < high / 1000
    # Half of the 99th's bucket: 10 µs + 0.98 * 10 µs.
    assert p99_ms({10.0: 50.0, 20.0: 100.0, math.inf: 100.0}) == pytest.approx(0.0198)
    # The total is the last (the +Inf) bucket's count: 2 of 100 under 20 µs put the 99th beyond every bound.
    assert p99_ms({10.0: 1.0, 20.0: 2.0, math.inf: 100.0}) == math.inf
    # Only the total (the last bucket) says whether there was any request.
    assert p99_ms({10.0: 0.0, 20.0: 0.0, math.inf: 5.0}) == math.inf


def test_a_window_of_no_server_counts_nothing_and_an_untrusted_one_says_why_with_no_figure():
    empty = Snapshot({})
    assert window_figures(empty, empty, "canary") == {"servers": 0, "requests": 0.0, "errors": 0.0, "error_rate": 0.0,
                                                      "predictions": 0.0, "p99_ms": 0.0}
    missing = window_figures(Snapshot({"canary": {}}), Snapshot({"canary": {}}, {"canary": ["c-1", "c-2"]}), "canary")
    assert missing == {"servers": 0, "requests": 0.0, "errors": 0.0, "error_rate": 0.0, "predictions": 0.0,
                       "p99_ms": 0.0, "inconclusive": "no metrics from the canary server(s) c-1, c-2 (failed scrape)"}
    changed = window_figures(Snapshot({"canary": {"a": counters(), "b": counters()}}),
                             Snapshot({"canary": {"b": counters(), "c": counters()}}), "canary")
    assert changed["inconclusive"] == ("the canary server(s) a left during the window (scaled down or replaced): "
                                       "what they answered after the first snapshot is unknown")


def test_a_counter_that_went_down_anywhere_makes_the_window_untrusted():
    from rollout.metrics import ModelCounters

    before = Snapshot({"canary": {"a": counters(ok=5)}})
    requests_reset = Snapshot({"canary": {"a": ModelCounters({"OK": 3.0}, {1000.0: 5.0, math.inf: 5.0})}})
    latency_reset = Snapshot({"canary": {"a": ModelCounters({"OK": 6.0}, {1000.0: 4.0, math.inf: 4.0})}})
    for after in (requests_reset, latency_reset):
        assert window_figures(before, after, "canary")["inconclusive"] == (
            "the counters of canary server a went down (it restarted)")


def test_errors_are_every_request_not_ok_and_a_counter_seen_once_at_zero_is_no_change():
    from rollout.metrics import ModelCounters, _delta

    assert _delta({"INTERNAL": 0.0}, {}) == {"INTERNAL": 0.0}
    before = Snapshot({"canary": {"a": ModelCounters({}, {})}})
    after = Snapshot({"canary": {"a": ModelCounters({"INTERNAL": 3.0}, {})}})
    figures = window_figures(before, after, "canary")
    assert (figures["requests"], figures["errors"], figures["error_rate"]) == (3.0, 3.0, 1.0)
    idle = window_figures(before, before, "canary")
    assert (idle["requests"], idle["error_rate"], idle["servers"]) == (0.0, 0.0, 1)


def test_the_verifiers_clients_mark_its_requests_so_that_the_servers_leave_them_out_of_the_logs():
    """tests/serving/test_request_log.py and test_log_proxy.py show the servers honouring the mark."""
    rest, rpc = _serving_clients(Endpoint("http://127.0.0.1:8501", "127.0.0.1:8500"), retries=2)
    try:
        for client in (rest, rpc):
            assert client.headers == {TRAFFIC_HEADER: VERIFIER_TRAFFIC} and client.retries == 2
    finally:
        rest.close()
        rpc.close()


def test_the_log_line_says_whose_requests_a_window_judged_and_how_many_the_step_needed(tmp_path):
    before = snap({"c-0": counters()}, {"s-0": counters()})
    after = snap({"c-0": counters(ok=500, errors=2)}, {"s-0": counters(ok=499, errors=1)})
    line = describe_figures({"window": metrics_window(tmp_path, before, after, weight=50)})
    assert line.startswith("window 1.0s (prometheus, users' requests) 502 requests, error rate 0.0040")
    assert "; users: the canary failed 2 of 502 (needs 299), stable 1 of 500; " in line and line.endswith("; passed")
    verifier, _, _ = build(tmp_path)
    assert describe_figures({"window": verifier.window(2, 0)}).startswith(
        f"window 1.0s (verifier, the verifier's requests) {SENT} requests")


def test_the_golden_rows_decisions_are_held_to_the_configured_shadow_limits(tmp_path):
    from rollout.factory import build_controller
    from settings.config import load_config

    golden = tmp_path / "golden.csv"
    golden.write_text("x\n1\n2\n")
    config = load_config(None, [f"rollout.golden_data={golden}", "rollout.shadow.max_disagreement_rate=0.02",
                                "rollout.shadow.max_relative_error=0.2", f"output_root={tmp_path}"])
    controller = build_controller(config, MemoryBackend(HookedStore(tmp_path)), log=lambda _: None)
    limits = controller.verifier_factory().limits
    assert (limits.max_disagreement_rate, limits.max_relative_error) == (0.02, 0.2)
