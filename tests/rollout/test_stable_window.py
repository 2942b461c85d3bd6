"""The window on the stable servers once all traffic is theirs (rollout/verify.py Verifier.stable_window): after a
promotion it rolls back a promoted version whose first users wait past rollout.max_p99_ms (one that did not warm up);
after every rollback it shows whether stable recovered, and the report's chart runs on to its end."""
from __future__ import annotations

import html
import math

import pytest

from rollout.controller import UserError
from rollout.metrics import MetricsError
from rollout.report import render_html
from rollout.verify import MIN_SHARE_REQUESTS
from tests.rollout.memory import MODEL, ScriptedMetrics, ScriptedVerifier, counters
from tests.rollout.test_phases import Fleet
from tests.rollout.test_verify_gate import LIMITS, SENT, build, failing_on, snap


def stable_window(tmp_path, before, after):
    source = ScriptedMetrics(before, after)
    verifier, per_server, _ = build(tmp_path, metrics=source)
    figures = verifier.stable_window(3)
    assert per_server["http://stable"][0].calls == 0, "the users' requests are judged: the verifier sends none"
    assert source.calls[0] is None and source.calls[1] is not None, "the second snapshot waits for a scrape"
    assert source.models == [MODEL, MODEL]
    return figures


@pytest.mark.parametrize("p99, verdict", [(249.9, "passed"), (250.0, "passed"), (250.1, "failed")])
def test_the_first_users_of_the_stable_servers_are_judged_on_the_p99_limit(tmp_path, p99, verdict):
    # 980 of 1000 predictions in the 1 ms bucket, 20 in the next: the p99 lies half way through it (rank 990).
    bound_us = 1000.0 + (p99 * 1000.0 - 1000.0) / 0.5
    after = snap({}, {"s-0": counters(ok=1000, latency_us={1000.0: 980, bound_us: 1000, math.inf: 1000})})
    figures = stable_window(tmp_path, snap({}, {"s-0": counters()}), after)
    assert figures["p99_ms"] == pytest.approx(p99, abs=1e-6) and figures["verdict"] == verdict, figures
    assert {k: v for k, v in figures.items() if k not in ("p99_ms", "error")} == {
        "source": "prometheus", "traffic": "users", "version": 3, "seconds": 1.0, "requests": 1000, "errors": 0,
        "error_rate": 0.0, "predictions": 1000, "verdict": verdict}
    if verdict == "failed":
        assert figures["error"] == (f"p99 latency {p99:.1f} ms of version 3 on the stable servers in the 1s after "
                                    "all traffic moved there > rollout.max_p99_ms 250.0")


@pytest.mark.parametrize("predictions, verdict", [(MIN_SHARE_REQUESTS - 1, "inconclusive"),
                                                  (MIN_SHARE_REQUESTS, "failed")])
def test_a_p99_needs_twenty_predictions(tmp_path, predictions, verdict):
    slow = {"s-0": counters(ok=predictions, latency_us={900_000.0: predictions, math.inf: predictions})}
    figures = stable_window(tmp_path, snap({}, {"s-0": counters()}), snap({}, slow))
    assert figures["verdict"] == verdict, figures
    if verdict == "inconclusive":
        assert figures["inconclusive"] == ("19 user predictions on the stable servers in 1s, fewer than the 20 a p99 "
                                           "needs")


def test_errors_after_the_traffic_moved_are_shown_not_judged(tmp_path):
    after = snap({}, {"s-0": counters(ok=100, errors=100)})
    figures = stable_window(tmp_path, snap({}, {"s-0": counters()}), after)
    assert (figures["errors"], figures["error_rate"], figures["verdict"]) == (100, 0.5, "passed")


def test_figures_that_cannot_be_trusted_are_inconclusive(tmp_path):
    figures = stable_window(tmp_path, snap({}, {"s-0": counters()}), snap({}, {"s-0": counters()}, {"stable": ["s-1"]}))
    assert figures["verdict"] == "inconclusive" and "s-1" in figures["inconclusive"]
    verifier, _, _ = build(tmp_path, metrics=ScriptedMetrics(MetricsError("Prometheus is down")))
    assert verifier.stable_window(3) == {"source": "prometheus", "version": 3, "verdict": "inconclusive",
                                         "inconclusive": "Prometheus is down"}


@pytest.mark.parametrize("errors, verdict", [(0, "passed"), (1, "failed")])
def test_without_metrics_the_verifier_asks_the_stable_servers_for_the_version(tmp_path, errors, verdict):
    limits = type(LIMITS)(**{**LIMITS.__dict__, "max_error_rate": 0.0})
    verifier, per_server, clock = build(tmp_path, limits=limits)
    # The last answer takes 1.2345678 ms: the p99 of 8 latencies is the largest, kept to microseconds.
    latency = {SENT - errors: 1.2345678}
    per_server["http://stable"] = (failing_on(set(range(1, errors + 1)), latency, clock),) * 2
    figures = verifier.stable_window(3)
    assert {k: v for k, v in figures.items() if k != "error"} == {
        "source": "verifier", "traffic": "verifier", "version": 3, "requests": SENT, "errors": errors,
        "error_rate": errors / SENT, "p99_ms": 1.235, "seconds": 1.0, "verifier_requests": SENT, "verdict": verdict}
    assert {version for _, version, _ in per_server["http://stable"][0].requests} == {3}
    assert per_server["http://canary-0"][0].calls == 0


def test_a_promoted_version_slow_for_its_first_users_is_rolled_back_to_the_previous_one(tmp_path):
    fleet = Fleet(tmp_path)
    lines: list[str] = []
    verifier = ScriptedVerifier(fail_after_promotion=True)
    record = fleet.controller(verifier, log=lines.append).start(2)
    assert record["outcome"] == "rolled_back"
    assert record["reason"] == ("the window after promotion failed: p99 latency 900.0 ms of version 2 on the stable "
                                "servers > rollout.max_p99_ms 500")
    assert verifier.stable_windows == [2, 1], "the promoted version's first users, then stable's recovery"
    assert fleet.backend.configs["stable"] == ([1], {"stable": 1}) and fleet.backend.weight == 0
    watched = [e["watch"] for e in record["events"] if "watch" in e]
    assert [(w["after"], w["window"]["version"], "error" in w["window"]) for w in watched] == [
        ("promotion", 2, True), ("rollback", 1, False)]
    assert any(line.startswith("window after promotion: 0s (scripted, users' requests) of version 2: 40 requests, "
                               "error rate 0.0000, p99 900.0 ms; FAILED: ") for line in lines), lines
    page = html.unescape(render_html(record))
    assert "<h2>After all traffic moved to the stable servers</h2>" in page
    assert "<td>promotion</td><td class='num'>2</td>" in page and "<td>rollback</td><td class='num'>1</td>" in page


def test_a_promotion_is_watched_once_and_every_rollback_shows_the_recovery(tmp_path):
    fleet = Fleet(tmp_path)
    verifier = ScriptedVerifier()
    promoted = fleet.controller(verifier).start(2)
    assert promoted["outcome"] == "promoted" and verifier.stable_windows == [2]
    [watch] = [e["watch"] for e in promoted["events"] if "watch" in e]
    assert (watch["after"], watch["window"]["verdict"]) == ("promotion", "passed")
    failed = ScriptedVerifier(fail_at=(50,))
    assert fleet.controller(failed).start(3)["outcome"] == "rolled_back" and failed.stable_windows == [2]


@pytest.mark.parametrize("slow_after_promotion", [False, True])
def test_one_verifier_serves_the_steps_and_the_windows_after(tmp_path, slow_after_promotion):
    fleet = Fleet(tmp_path)
    verifier, made = ScriptedVerifier(fail_after_promotion=slow_after_promotion), []
    controller = fleet.controller(verifier)
    controller.verifier_factory = lambda: made.append(verifier) or verifier
    controller.start(2)
    assert verifier.stable_windows == ([2, 1] if slow_after_promotion else [2])
    assert len(made) == 1, "golden rows are read once per command"


def test_golden_rows_that_cannot_be_read_do_not_stop_a_rollback_from_finishing(tmp_path):
    fleet = Fleet(tmp_path)
    controller = fleet.controller(ScriptedVerifier(), keep_previous_s=60.0)
    assert controller.start(2, wait_retain=False)["phase"] == "retain"

    def unreadable():
        raise UserError("rollout.golden_data /nowhere.csv does not exist; point it at a CSV.")

    controller.verifier_factory, controller._verifier = unreadable, None
    record = controller.rollback()
    assert record["outcome"] == "rolled_back"
    [watch] = [e["watch"] for e in record["events"] if "watch" in e and e["watch"]["after"] == "rollback"]
    assert watch["window"] == {"verdict": "inconclusive", "inconclusive": (
        "no window: rollout.golden_data /nowhere.csv does not exist; point it at a CSV.")}
