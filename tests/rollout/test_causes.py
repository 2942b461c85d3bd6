"""A failed verification names its causes (rollout/causes.py): the messages and the input values most common among
the failed requests the canary's servers kept, in the console line, the state's figures and the report. The servers'
side (what they keep and answer) is in tests/serving/test_failures.py; the local stack's in test_local_stack.py."""
from __future__ import annotations

import html
import time
from typing import Any

import pytest

from rollout.causes import MIN_VALUE_SHARE, describe_causes, summarize_failures
from rollout.report import render_html
from tests.rollout.memory import MODEL, HookedStore, MemoryBackend, ScriptedVerifier
from tests.rollout.test_phases import Fleet


def failure(rows: list[dict[str, Any]], message: str = "boom", traffic: str = "users", version: int | None = 2,
            at: float | None = None) -> dict[str, Any]:
    return {"time": time.time() + 3600 if at is None else at, "model": MODEL, "version": version, "transport": "rest",
            "code": "INVALID_ARGUMENT", "message": message, "traffic": traffic, "rows": rows, "row_count": len(rows)}


def test_a_value_is_named_from_half_of_the_failed_requests_and_two_of_them():
    assert MIN_VALUE_SHARE == 0.5
    # 4 failed requests: a value in 2 of them is named (just inside), one in 1 is not (just outside).
    failures = [failure([{"pay": "Card", "fare": 1.0}]), failure([{"pay": "Card", "fare": 2.0}]),
                failure([{"pay": "Cash", "fare": 2.0}]), failure([{"pay": "Cash", "fare": 3.0}])]
    causes = summarize_failures(failures, "users")
    assert causes["values"] == [{"feature": "fare", "value": 2.0, "count": 2},
                                {"feature": "pay", "value": "Card", "count": 2},
                                {"feature": "pay", "value": "Cash", "count": 2}]
    # 5 failed requests: 2 of them is under half (just outside), 3 is over it (just inside).
    causes = summarize_failures([*failures, failure([{"pay": "Card", "fare": 9.0}])], "users")
    assert causes["values"] == [{"feature": "pay", "value": "Card", "count": 3}]
    # One failed request names no value: nothing is common to one.
    assert summarize_failures([failure([{"pay": "Card"}])], "users")["values"] == []


def test_a_value_counts_once_per_request_and_only_the_traffic_asked_for():
    batch = failure([{"pay": "Card"}, {"pay": "Card"}, {"pay": "Card"}])
    other = failure([{"pay": "Cash"}], message="other")
    verifier = failure([{"pay": "Card"}], message="verifier's", traffic="verifier")
    causes = summarize_failures([batch, other, verifier], "users")
    assert causes["failed_requests"] == 2 and causes["values"] == []
    assert causes["messages"] == [{"message": "boom", "count": 1}, {"message": "other", "count": 1}]
    assert summarize_failures([batch, other, verifier], "verifier")["messages"] == [
        {"message": "verifier's", "count": 1}]


def test_the_commonest_messages_come_first_and_at_most_three():
    failures = [failure([], message=m) for m in "abbcccdddd"]
    assert [(m["message"], m["count"]) for m in summarize_failures(failures, "users")["messages"]] == [
        ("d", 4), ("c", 3), ("b", 2)]


class UsersWindowVerifier(ScriptedVerifier):
    """A window judged on users' requests, as rollout/verify.py Verifier.window with a metrics source."""

    def window(self, candidate: int, weight: int) -> dict[str, Any]:
        return {**super().window(candidate, weight), "traffic": "users"}


def test_a_failed_window_names_its_causes_in_the_console_the_state_and_the_report(tmp_path):
    fleet = Fleet(tmp_path)
    refused = "The model rejected the inputs: Graph execution error: unknown payment_type 'Prcard'"
    fleet.backend.kept_failures["canary"] = [
        *(failure([{"payment_type": "Prcard", "fare": float(i)}], message=refused) for i in range(5)),
        failure([{"payment_type": "Prcard"}], message="timeout"),
        failure([{"payment_type": "Cash"}], at=time.time() - 3600),  # before the window: not this window's
        failure([{"payment_type": "Cash"}], version=1),  # another version's
        failure([{"payment_type": "Cash"}], traffic="verifier"),  # the verifier's, in a users' window
    ]
    lines: list[str] = []
    record = fleet.controller(UsersWindowVerifier(fail_at=(50,)), log=lines.append).start(2)
    assert record["outcome"] == "rolled_back"
    [failed] = [e["figures"] for e in record["events"] if e.get("figures", {}).get("error")]
    assert failed["window"]["causes"] == {
        "traffic": "users", "failed_requests": 6,
        "messages": [{"message": refused, "count": 5}, {"message": "timeout", "count": 1}],
        "values": [{"feature": "payment_type", "value": "Prcard", "count": 6}]}
    [line] = [line for line in lines if "FAILED" in line]
    assert line.endswith(f"causes: 6 of the users' failed requests kept: 5x {refused!r}; 1x 'timeout'; common to "
                         "them: payment_type=\"Prcard\" (6 of 6)"), line
    page = html.unescape(render_html(record))
    assert "Why step 1 at 50% failed: 6 of the users' failed requests, as the canary's servers kept them" in page
    assert f"<pre>{refused}</pre>" in page and '<td>payment_type</td><td>"Prcard"</td>' in page


def test_servers_that_cannot_be_read_are_named_and_a_passed_window_reads_none(tmp_path):
    class UnreadBackend(MemoryBackend):
        reads = 0

        def server_gets(self, track: str, version: int, path: str) -> list[tuple[str, int, str]]:
            UnreadBackend.reads += 1
            return [("canary-0", 0, "GET http://canary/monitoring/failures/tiny: connection refused"),
                    ("canary-1", 404, "{\"error\": \"Unknown path\"}")]

    fleet = Fleet(tmp_path, backend=UnreadBackend)
    record = fleet.controller(UsersWindowVerifier(fail_at=(100,))).start(2)
    assert UnreadBackend.reads == 1, "only the failed window reads the servers' failures"
    [failed] = [e["figures"] for e in record["events"] if e.get("figures", {}).get("error")]
    causes = failed["window"]["causes"]
    assert causes["unread"] == ["canary-0: no answer GET http://canary/monitoring/failures/tiny: connection refused",
                                'canary-1: 404 {"error": "Unknown path"}']
    assert describe_causes(causes).startswith("the canary's servers kept none of the users' failed requests (not "
                                              "read: canary-0: no answer")


def test_a_failed_step_rolls_back_even_when_its_servers_cannot_be_listed(tmp_path):
    class UnlistedBackend(MemoryBackend):
        def server_gets(self, track: str, version: int, path: str) -> list[tuple[str, int, str]]:
            raise RuntimeError("the API server is gone")

    fleet = Fleet(tmp_path, backend=UnlistedBackend)
    record = fleet.controller(UsersWindowVerifier(fail_at=(50,))).start(2)
    assert record["outcome"] == "rolled_back" and fleet.backend.weight == 0
    [failed] = [e["figures"] for e in record["events"] if e.get("figures", {}).get("error")]
    assert failed["window"]["causes"]["unread"] == [
        "the canary's servers could not be listed (RuntimeError: the API server is gone)"]


@pytest.mark.parametrize("golden_error", ["golden requests failed: HTTP 500 Internal error", ""])
def test_a_failed_golden_check_names_the_verifiers_failures_and_a_clean_failure_names_none(tmp_path, golden_error):
    fleet = Fleet(tmp_path)
    fleet.backend.kept_failures["canary"] = [failure([{"fare": 1.0}], traffic="verifier") for _ in range(2)]
    verifier = ScriptedVerifier(golden_error=golden_error or "candidate 2 disagrees with stable 1 on the golden rows")
    if not golden_error:
        fleet.backend.kept_failures["canary"] = []
    record = fleet.controller(verifier).start(2)
    [failed] = [e["figures"] for e in record["events"] if e.get("figures", {}).get("error")]
    if golden_error:
        assert failed["golden"]["causes"]["failed_requests"] == 2
        assert failed["golden"]["causes"]["values"] == [{"feature": "fare", "value": 1.0, "count": 2}]
    else:
        assert "causes" not in failed["golden"], "a failure of the answers, not of requests, has no failed requests"


def test_the_kept_failures_are_read_from_the_canary_track_only(tmp_path):
    store = HookedStore(tmp_path)
    backend = MemoryBackend(store)
    backend.kept_failures["stable"] = [failure([{"fare": 1.0}])]
    assert backend.failures(MODEL, "canary", 2, 0.0) == ([], [])
    assert backend.failures(MODEL, "stable", 2, 0.0)[0] == backend.kept_failures["stable"]
