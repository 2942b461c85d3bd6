"""Every phase of the state machine, stopped right after its backend write and right after its state commit, then
resumed or rolled back: the tracks' versions and labels and the canary weight read back from the backend are exactly
the promoted state or the state before the rollout, and each rollout records one outcome. Then two controllers at
every step: the second is refused while the first holds the lock, and one that acts anyway (its lease expired) makes
the first stop without touching traffic. A backend in memory (tests/rollout/memory.py): milliseconds a case."""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable

import pytest

from rollout.backends import BackendError, ServerView
from rollout.controller import ROLLBACK_PHASES, Controller, RolloutError
from rollout.state import ControllerBusyError, Holding, StateConflictError
from tests.rollout.memory import MODEL, HookedStore, MemoryBackend, OneVersionBackend, ScriptedVerifier, Stop

BEFORE = {"stable": {"versions": [1], "labels": {"stable": 1}}, "canary": {"versions": [1], "labels": {"canary": 1}},
          "canary_weight": 0}
PROMOTED = {"stable": {"versions": [2], "labels": {"stable": 2}}, "canary": {"versions": [2], "labels": {"canary": 2}},
            "canary_weight": 0}


# The controller's wall clock: it moves only when the controller sleeps (waiting out a kept version takes no time).
CLOCK = [0.0]


@pytest.fixture(autouse=True)
def fake_clock(monkeypatch):
    from rollout import controller

    CLOCK[0] = 1_800_000_000.0
    monkeypatch.setattr(controller, "_now", lambda: CLOCK[0])


def _sleep(seconds: float) -> None:
    CLOCK[0] += seconds


class Fleet:
    """One model's backend and state folder; controllers made on it share both, as processes on one machine do."""

    def __init__(self, folder, backend: type[MemoryBackend] = MemoryBackend) -> None:
        self.folder = folder
        self.store = HookedStore(folder)
        self.backend = backend(self.store)
        self.events: list[tuple[str, str, object]] = []
        self.stop_at: int | None = None
        self.on_event: Callable[[int], None] = lambda index: None
        self.backend.after_write = lambda write: self._event("write", write)
        self.store.after_save = lambda document: self._event("commit", (document.get("current") or {}).get(
            "phase", "done"))

    def _phase(self) -> str:
        current = self.store.load()[0].get("current")
        return current["phase"] if current else "done"

    def _event(self, kind: str, what: object) -> None:
        phase = self._phase() if kind == "write" else ""
        self.events.append((kind, phase, what))
        index = len(self.events) - 1
        self.on_event(index)
        if index == self.stop_at:
            raise Stop(f"stopped after event {index}: {kind} {what}")

    def controller(self, verifier: ScriptedVerifier | None = None, store=None, keep_previous_s: float = 0.0,
                   log: Callable[[str], None] = lambda _: None, **options) -> Controller:
        # Another process's controller: its own store object on the same state folder, the same servers.
        backend = self.backend if store is None else _OtherProcess(self.backend, store)
        verifier = verifier or ScriptedVerifier()
        return Controller(backend, MODEL, [50, 100], lambda: verifier, load_timeout_s=0.2,
                          keep_previous_s=keep_previous_s, poll_s=0.01, log=log, sleep=_sleep,
                          **options)


class _OtherProcess:
    """The fleet's backend seen by a second controller: the same servers and weight, another state store object."""

    def __init__(self, shared: MemoryBackend, store) -> None:
        self._shared, self.store = shared, store

    def __getattr__(self, name):
        return getattr(self._shared, name)


# The three rollouts whose every event is a stopping point: (name, run it, the outcome it ends with).
def promoted(fleet: Fleet) -> None:
    fleet.controller().start(2)


def failed_at_50(fleet: Fleet) -> None:
    fleet.controller(ScriptedVerifier(fail_at=(50,))).start(2)


def rolled_back_after_promotion(fleet: Fleet) -> None:
    fleet.controller(keep_previous_s=600).start(2, wait_retain=False)
    fleet.controller(keep_previous_s=600).rollback()


SCENARIOS = {"promoted": (promoted, PROMOTED, "promoted"),
             "failed at 50%": (failed_at_50, BEFORE, "rolled_back"),
             "rolled back after promotion": (rolled_back_after_promotion, BEFORE, "rolled_back")}
# What the candidate does when verified again after a resume: the same as in the uninterrupted run.
FAILING_AT = {"failed at 50%": (50,)}


def events_of(scenario: str, tmp_path) -> list[tuple[str, str, object]]:
    fleet = Fleet(tmp_path / "uninterrupted")
    SCENARIOS[scenario][0](fleet)
    return fleet.events


def _cases():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        for scenario in SCENARIOS:
            for index, (kind, phase, what) in enumerate(events_of(scenario, Path(folder) / scenario)):
                for then in ("resume", "rollback"):
                    yield pytest.param(scenario, index, then, id=f"{scenario}-{index}-{kind}-{phase or what}-{then}")


def stop_after(fleet: Fleet, scenario: str, kind: str, phase: str) -> None:
    """Runs `scenario` on `fleet` and stops it right after its first `kind` event ("commit" recording `phase`, or a
    backend "write" made in `phase`), as a SIGKILL there would."""
    events = events_of(scenario, fleet.folder / "uninterrupted")
    fleet.stop_at = next(i for i, e in enumerate(events)
                         if (e == ("commit", "", phase) if kind == "commit" else e[:2] == ("write", phase)))
    with pytest.raises(Stop):
        SCENARIOS[scenario][0](fleet)
    fleet.stop_at = None


def test_an_uninterrupted_promotion_writes_each_phase_once(tmp_path):
    events = events_of("promoted", tmp_path)
    assert [(kind, phase, what) for kind, phase, what in events] == [
        ("commit", "", "load"), ("write", "load", ("set_track", "canary", [1, 2], {"canary": 1})),
        ("commit", "", "label"), ("write", "label", ("set_track", "canary", [2], {"canary": 2})),
        ("commit", "", "verify"), ("commit", "", "verify"), ("write", "verify", ("weight", 50)),
        ("commit", "", "verify"), ("write", "verify", ("weight", 100)), ("commit", "", "promote_load"),
        ("write", "promote_load", ("set_track", "stable", [1, 2], {"stable": 1})), ("commit", "", "promote_label"),
        ("write", "promote_label", ("set_track", "stable", [1, 2], {"stable": 2})), ("commit", "", "promote_route"),
        ("write", "promote_route", ("weight", 0)), ("commit", "", "retain"),
        ("write", "retain", ("set_track", "stable", [2], {"stable": 2})), ("commit", "", "done")]


@pytest.mark.parametrize("scenario, index, then", list(_cases()))
def test_stopped_after_any_write_or_commit_then_resumed_or_rolled_back(tmp_path, scenario, index, then, capsys):
    run, resumed_state, resumed_outcome = SCENARIOS[scenario]
    fleet = Fleet(tmp_path)
    fleet.stop_at = index
    with pytest.raises(Stop):
        run(fleet)
    stopped_at = fleet.events[index]
    fleet.stop_at = None
    document = fleet.store.load()[0]
    finished = document["current"] is None
    if then == "resume":
        record = fleet.controller(ScriptedVerifier(fail_at=FAILING_AT.get(scenario, ()))).start(2)
        wanted_state, wanted_outcome = resumed_state, resumed_outcome
        if (scenario == "rolled back after promotion" and not finished
                and document["current"]["phase"] not in ROLLBACK_PHASES):
            # Stopped before the rollback was recorded: resuming the rollout finishes its promotion.
            wanted_state, wanted_outcome = PROMOTED, "promoted"
    elif finished:
        with pytest.raises(RolloutError, match="no rollout of 'tiny' is in progress"):
            fleet.controller().rollback()
        record = fleet.store.load()[0]["history"][-1]
        wanted_state, wanted_outcome = resumed_state, resumed_outcome
    else:
        record = fleet.controller().rollback()
        wanted_state, wanted_outcome = BEFORE, "rolled_back"
    served = fleet.backend.served()
    print(f"{scenario} | stopped after {stopped_at[0]} {stopped_at[1] or stopped_at[2]} | {then} | "
          f"{record['outcome']} | {served}")
    assert served == wanted_state, f"stopped after {stopped_at}"
    assert fleet.backend.refused_labels == [], "no label moved to a version its servers did not serve yet"
    assert record["outcome"] == wanted_outcome and record["served"] == served
    history = fleet.store.load()[0]["history"]
    assert len(history) == 1 and fleet.store.load()[0]["current"] is None, "one outcome, recorded once"
    # What the controller says it left is what the backend shows.
    assert record["events"][-1]["message"].startswith(wanted_outcome.replace("_", " "))
    assert f"the stable track serves {served['stable']['versions']}" in record["events"][-1]["message"]


def test_a_promotion_stopped_after_its_label_write_then_rolled_back_serves_the_previous_version_again(tmp_path):
    """The case a rollback used to get wrong: the stable track already answered the candidate under `stable`."""
    fleet = Fleet(tmp_path)
    promote_label_write = next(i for i, e in enumerate(events_of("promoted", tmp_path / "x"))
                               if e[:2] == ("write", "promote_label"))
    fleet.stop_at = promote_label_write
    with pytest.raises(Stop):
        promoted(fleet)
    fleet.stop_at = None
    assert fleet.backend.configs["stable"] == ([1, 2], {"stable": 2})
    record = fleet.controller().rollback()
    assert fleet.backend.served() == BEFORE and record["outcome"] == "rolled_back"
    assert record["events"][-1]["message"].startswith(
        "rolled back: the stable track serves [1] (stable -> 1) and the canary track serves [1] (canary -> 1), 0% of "
        "the traffic on the canary")
    # The next rollout starts from version 1 as stable.
    assert fleet.controller().start(3)["stable"] == 1


# Two controllers


COMMANDS = {"start": lambda c: c.start(2), "rollback": lambda c: c.rollback(), "promote": lambda c: c.promote()}


def _interleavings():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        count = len(events_of("promoted", Path(folder)))
    for second in COMMANDS:
        for index in range(count - 1):  # the last event ends the rollout: nothing is left to interleave with
            yield pytest.param(second, index, id=f"start-with-{second}-after-event-{index}")


@pytest.mark.parametrize("second, index", list(_interleavings()))
def test_a_second_controller_is_refused_while_the_first_runs(tmp_path, second, index):
    fleet = Fleet(tmp_path)
    refusals: list[str] = []

    def second_controller(at: int) -> None:
        if at != index:
            return
        before = (fleet.backend.served(), fleet.store.load())
        with pytest.raises(ControllerBusyError) as refused:
            COMMANDS[second](fleet.controller(store=HookedStore(tmp_path)))
        refusals.append(str(refused.value))
        assert (fleet.backend.served(), fleet.store.load()) == before, "the refused controller changed nothing"

    fleet.on_event = second_controller
    record = fleet.controller().start(2)
    assert record["outcome"] == "promoted" and fleet.backend.served() == PROMOTED
    [message] = refusals
    assert message.startswith("another rollout controller (pid ") and "has held this model's rollout for" in message
    assert "rollout.lease_wait_seconds" in message


class LockIgnoringStore(HookedStore):
    """A controller whose lock did not stop it: as after the first one's Lease expired while it was stalled."""

    @contextlib.contextmanager
    def exclusive(self, wait_s: float = 0.0):
        yield Holding()


@pytest.mark.parametrize("second, index", list(_interleavings()))
def test_a_controller_whose_rollout_was_moved_by_another_stops_without_touching_traffic(tmp_path, second, index):
    fleet = Fleet(tmp_path)
    writes_when_second_finished: list[int] = []
    outcomes: list[dict] = []

    def second_controller(at: int) -> None:
        if at != index or writes_when_second_finished:
            return
        fleet.on_event = lambda _: None
        outcomes.append(COMMANDS[second](fleet.controller(store=LockIgnoringStore(tmp_path), keep_previous_s=0)))
        writes_when_second_finished.append(len(fleet.backend.writes))

    fleet.on_event = second_controller
    try:
        fleet.controller().start(2)
        first = "finished"
    except (StateConflictError, RolloutError) as e:
        first = str(e)
    assert writes_when_second_finished, "the second controller ran"
    print(f"start, {second} after event {index} {fleet.events[index][:2]} | second: {outcomes[0]['outcome']} | first: "
          f"{first} | {fleet.backend.served()}")
    assert outcomes[0]["outcome"] == ("rolled_back" if second == "rollback" else "promoted")
    assert first != "finished", "the first controller noticed that another one moved its rollout"
    assert len(fleet.backend.writes) == writes_when_second_finished[0], (
        f"the first controller touched traffic after the second one finished: {fleet.backend.writes[-3:]}")
    document = fleet.store.load()[0]
    if document["current"] is None:
        assert len(document["history"]) == 1, "one outcome"
        wanted = PROMOTED if document["history"][0]["outcome"] == "promoted" else BEFORE
        assert fleet.backend.served() == wanted


# Inconclusive windows, the downgrade, the bounded history


def test_inconclusive_windows_are_retried_then_roll_back(tmp_path):
    fleet = Fleet(tmp_path)
    verifier = ScriptedVerifier(inconclusive_at=[50, 50, 50])
    record = fleet.controller(verifier, max_inconclusive=3).start(2)
    assert verifier.windows == [0, 50, 50, 50]
    assert record["outcome"] == "rolled_back" and fleet.backend.served() == BEFORE
    assert record["reason"].startswith("3 inconclusive windows in a row at 50%: no metrics from the canary")


def test_an_inconclusive_window_then_a_conclusive_one_moves_on(tmp_path):
    fleet = Fleet(tmp_path)
    verifier = ScriptedVerifier(inconclusive_at=[50, 50, 100, 100])
    record = fleet.controller(verifier, max_inconclusive=3).start(2)
    assert verifier.windows == [0, 50, 50, 50, 100, 100, 100] and record["outcome"] == "promoted"
    assert record["inconclusive"] == 0, "the count of inconclusive windows in a row ends with the conclusive one"


def test_inconclusive_windows_can_pause_the_rollout_instead(tmp_path):
    fleet = Fleet(tmp_path)
    state = fleet.controller(ScriptedVerifier(inconclusive_at=[50, 50]), max_inconclusive=2,
                             on_inconclusive="pause").start(2)
    assert state["paused"].startswith("2 inconclusive windows in a row at 50%")
    assert fleet.backend.weight == 50, "traffic stays where it was"
    assert fleet.store.load()[0]["current"]["paused"] == state["paused"]
    record = fleet.controller(on_inconclusive="pause").start(2)
    assert record["outcome"] == "promoted" and "paused" not in record


def test_a_downgrade_needs_to_be_asked_for(tmp_path):
    fleet = Fleet(tmp_path)
    fleet.backend.configs.update(stable=([3], {"stable": 3}), canary=([3], {"canary": 3}))
    with pytest.raises(RolloutError) as refused:
        fleet.controller().start(2)
    assert str(refused.value) == ("version 2 is older than the stable version 3 of 'tiny'; pass --allow-downgrade to "
                                  "roll it back in (while both are loaded, unversioned requests go to the higher "
                                  "version).")
    assert fleet.store.load()[0]["current"] is None and fleet.backend.writes == []
    assert fleet.controller().start(2, allow_downgrade=True)["outcome"] == "promoted"


def test_the_state_keeps_only_the_newest_outcomes(tmp_path):
    fleet = Fleet(tmp_path)
    for candidate in (2, 3, 4, 5):
        fleet.controller(history_limit=2).start(candidate)
    history = fleet.store.load()[0]["history"]
    assert [h["candidate"] for h in history] == [4, 5]


def test_reports_are_written_after_the_final_commit_and_again_when_missing(tmp_path):
    fleet = Fleet(tmp_path)
    reports = tmp_path / "reports"
    pages_at_commit: list[bool] = []
    fleet.store.after_save = lambda document: pages_at_commit.append(any(reports.glob("*.html")))
    record = fleet.controller(report_dir=str(reports)).start(2)
    assert pages_at_commit[-1] is False, "no page before the outcome is committed"
    [page] = reports.glob("*.html")
    page.unlink()
    again = fleet.controller(report_dir=str(reports)).start(2)
    assert again == record and [p.name for p in reports.glob("*.html")] == [page.name]


# Promotion by hand, reasons, and what a rollback before promotion leaves alone


def test_a_rollback_before_promotion_never_writes_the_stable_track_and_records_why(tmp_path):
    fleet = Fleet(tmp_path)
    record = fleet.controller(ScriptedVerifier(fail_at=(50,))).start(2)
    assert record["outcome"] == "rolled_back" and fleet.backend.served() == BEFORE
    assert [w for w in fleet.backend.writes if w[:2] == ("set_track", "stable")] == []
    assert record["reason"] == "verification at 50% failed: error rate 0.5 > rollout.max_error_rate 0.01 at 50%"
    [failed] = [e for e in record["events"] if e["next"] == "rollback_route"]
    assert failed["figures"]["window"]["error"].startswith("error rate 0.5") and failed["figures"]["weight"] == 50


def test_a_manual_rollback_records_its_reason(tmp_path):
    fleet = Fleet(tmp_path)
    fleet.controller(ScriptedVerifier(inconclusive_at=[50, 50]), max_inconclusive=2, on_inconclusive="pause").start(2)
    record = fleet.controller().rollback()
    assert record["reason"] == "asked for by hand" and fleet.backend.served() == BEFORE
    assert [w for w in fleet.backend.writes if w[:2] == ("set_track", "stable")] == []


def test_promotion_by_hand_skips_the_remaining_steps(tmp_path):
    fleet = Fleet(tmp_path)
    verifier = ScriptedVerifier(inconclusive_at=[50, 50])
    fleet.controller(verifier, max_inconclusive=2, on_inconclusive="pause").start(2)
    record = fleet.controller(verifier).promote()
    assert record["outcome"] == "promoted" and fleet.backend.served() == PROMOTED
    assert record["manual"] is True and "paused" not in record
    assert verifier.windows == [0, 50, 50], "no verification after the promotion was asked for"
    assert any(e["message"] == "promotion of version 2 asked for by hand: skipping the remaining steps"
               for e in record["events"])


def test_promotion_by_hand_during_the_kept_time_retires_the_previous_version_now(tmp_path):
    fleet = Fleet(tmp_path)
    state = fleet.controller(keep_previous_s=600).start(2, wait_retain=False)
    assert state["phase"] == "retain" and fleet.backend.configs["stable"] == ([1, 2], {"stable": 2})
    record = fleet.controller(keep_previous_s=600).promote(wait_retain=False)
    assert record["outcome"] == "promoted" and fleet.backend.served() == PROMOTED


def test_promotion_waits_out_the_kept_time_unless_told_not_to(tmp_path):
    fleet = Fleet(tmp_path)
    fleet.controller(ScriptedVerifier(inconclusive_at=[50, 50]), max_inconclusive=2, on_inconclusive="pause").start(2)
    state = fleet.controller(keep_previous_s=600).promote(wait_retain=False)
    assert state["phase"] == "retain" and "outcome" not in state
    assert fleet.controller(keep_previous_s=600).promote()["outcome"] == "promoted"


def test_a_rollout_rolling_back_cannot_be_promoted(tmp_path):
    fleet = Fleet(tmp_path)
    rollback_commit = next(i for i, e in enumerate(events_of("failed at 50%", tmp_path / "x"))
                           if e == ("commit", "", "rollback_route"))
    fleet.stop_at = rollback_commit
    with pytest.raises(Stop):
        failed_at_50(fleet)
    fleet.stop_at = None
    with pytest.raises(RolloutError, match=r"^the rollout of version 2 is rolling back; it cannot be promoted. Run "
                                           r"`mlops rollout start` to let the rollback finish.$"):
        fleet.controller().promote()
    with pytest.raises(RolloutError, match="no rollout of 'tiny' is in progress"):
        Fleet(tmp_path / "empty").controller().promote()


def test_each_verification_records_its_weight_servers_and_figures(tmp_path):
    fleet = Fleet(tmp_path)
    record = fleet.controller(ScriptedVerifier(inconclusive_at=[50])).start(2)
    verifications = [e for e in record["events"] if "figures" in e]
    assert [(e["figures"]["weight"], e["figures"]["canary_servers"]) for e in verifications] == [
        (0, 1), (50, 1), (50, 1), (100, 1)]
    assert all(e["figures"]["golden"]["rows"] == 3 for e in verifications)
    inconclusive = verifications[1]
    assert inconclusive["message"] == ("the window at 50% is inconclusive (1 of 3 in a row): no metrics from the "
                                       "canary server(s) canary-0 (failed scrape); verifying again")
    assert "error" not in inconclusive["figures"] and inconclusive["figures"]["window"]["inconclusive"]


def test_a_paused_rollout_records_the_window_that_paused_it(tmp_path):
    fleet = Fleet(tmp_path)
    state = fleet.controller(ScriptedVerifier(inconclusive_at=[50, 50]), max_inconclusive=2,
                             on_inconclusive="pause").start(2)
    last = state["events"][-1]
    assert last["message"].startswith("PAUSED at 50% canary traffic (2 inconclusive windows in a row at 50%")
    assert last["figures"]["window"]["inconclusive"] and state["inconclusive"] == 0


@pytest.mark.parametrize("failing, reason", [
    ({"canary": {2: "Loading servable failed"}}, "version 2 did not load on the canary servers: canary-0: Loading "
                                                 "servable failed"),
    ({"stable": {2: "out of memory"}}, "version 2 did not load on the stable servers: stable-0: out of memory"),
])
def test_a_version_that_fails_to_load_on_either_track_is_rolled_back(tmp_path, failing, reason):
    fleet = Fleet(tmp_path)
    fleet.backend.failing.update(failing)
    record = fleet.controller().start(2)
    assert record["outcome"] == "rolled_back" and record["reason"] == reason
    fleet.backend.failing = {"stable": {}, "canary": {}}
    assert fleet.backend.served() == BEFORE


def test_routes_that_carry_no_traffic_refuse_the_start_and_roll_back_a_running_rollout(tmp_path):
    """Issue 42 item 10: a route no gateway took would let windows judge traffic the weights never send."""
    fleet = Fleet(tmp_path)
    fleet.backend.detached = "the routes do not carry traffic: HTTPRoute mlops-serving/tfserving: no gateway took it"
    with pytest.raises(BackendError, match="^the routes do not carry traffic: "):
        fleet.controller().start(2)
    assert fleet.backend.writes == [] and fleet.store.load()[0]["current"] is None, "nothing started"
    fleet.backend.detached = ""
    # Detached after the canary loaded, before the first step's verification: rolled back with the reason.
    fleet.backend.after_write = lambda write: setattr(fleet.backend, "detached", "route lost its gateway") if write[
        1] == "canary" and write[3] == {"canary": 2} else None
    record = fleet.controller().start(2)
    assert record["outcome"] == "rolled_back" and record["reason"] == "route lost its gateway"
    assert fleet.backend.weight == 0


def test_the_routes_are_checked_after_each_steps_weight_is_written_before_its_window(tmp_path):
    """A weight the gateway has not taken (or a route it dropped on that write) must not be judged as if it carried
    traffic: the step's window comes only after check_routing has seen the route as the write left it."""
    fleet = Fleet(tmp_path)
    stale = "HTTPRoute mlops-serving/tfserving: Accepted judged generation 3, the route is at 4"
    fleet.backend.after_write = lambda write: setattr(fleet.backend, "detached", stale) if write == (
        "weight", 50) else None
    record = fleet.controller().start(2)
    assert record["outcome"] == "rolled_back" and record["reason"] == stale
    messages = [e["message"] for e in record["events"]]
    assert not any(m.startswith("verified at 50%") for m in messages), "no window judged at the untaken weight"
    assert fleet.backend.weight == 0


def test_a_candidate_not_available_or_unpublished_at_a_step_is_rolled_back(tmp_path):
    fleet = Fleet(tmp_path)
    # Published at the start, gone before the first verification.
    fleet.backend.after_write = lambda write: fleet.backend.published.discard(2) if write[1] == "canary" and write[
        3] == {"canary": 2} else None
    record = fleet.controller().start(2)
    assert record["reason"] == "version 2 of 'tiny' is not published." and fleet.backend.served() == BEFORE
    fleet = Fleet(tmp_path / "views")
    original = fleet.backend.version_views
    fleet.backend.version_views = lambda model, track, version: (
        [] if track == "canary" and fleet.store.load()[0]["current"]["phase"] == "verify" else
        original(model, track, version))
    record = fleet.controller().start(2)
    assert record["reason"] == "verification at 0% failed: no canary server is running"


# What each rollout records, step by step

STARTED = [
    ("start", "load", "rollout of version 2 over stable 1 started"),
    ("load", "label", "version 2 is AVAILABLE on every canary server"),
    ("label", "verify", "label canary -> 2 on every canary server (version 1 unloaded there)"),
    ("verify", "verify", "verified at 0%; the canary's share of the traffic moves to 50%")]


def promotion(kept_until: str) -> list[tuple[str, str, str]]:
    return [
        ("verify", "verify", "verified at 50%; the canary's share of the traffic moves to 100%"),
        ("verify", "promote_load", "verified at 100%: promoting version 2"),
        ("promote_load", "promote_label", "version 2 is AVAILABLE on every stable server"),
        ("promote_label", "promote_route", "label stable -> 2; version 1 stays loaded"),
        ("promote_route", "retain", f"all traffic on the stable servers, now version 2; version 1 stays loaded until "
                                    f"{kept_until} for an instant rollback")]


def rolled_back(reason: str) -> list[tuple[str, str, str]]:
    return [
        ("rollback_route", "rollback_canary_load", "all traffic on the stable servers"),
        ("rollback_canary_load", "rollback_canary_label", "version 1 is AVAILABLE on every canary server"),
        ("rollback_canary_label", "done", "rolled back: the stable track serves [1] (stable -> 1) and the canary "
                                          "track serves [1] (canary -> 1), 0% of the traffic on the canary "
                                          f"({reason})")]


FAILED_AT_50 = "verification at 50% failed: error rate 0.5 > rollout.max_error_rate 0.01 at 50%"
TRANSCRIPTS = {
    "promoted": STARTED + promotion("2027-01-15T08:00:00Z") + [
        ("retain", "done", "promoted: the stable track serves [2] (stable -> 2) and the canary track serves [2] "
                           "(canary -> 2), 0% of the traffic on the canary")],
    "failed at 50%": STARTED + [("verify", "rollback_route", f"ROLLING BACK version 2: {FAILED_AT_50}")]
    + rolled_back(FAILED_AT_50),
    "rolled back after promotion": STARTED + promotion("2027-01-15T08:10:00Z") + [
        ("retain", "revert_label", "ROLLING BACK version 2: asked for by hand"),
        ("revert_label", "revert_unload", "label stable -> 1 again (it was still loaded)"),
        ("revert_unload", "rollback_route", "version 2 unloaded from the stable servers")]
    + rolled_back("asked for by hand"),
}


@pytest.mark.parametrize("scenario", list(TRANSCRIPTS))
def test_each_rollout_records_every_phase_it_went_through_and_why(tmp_path, scenario):
    fleet = Fleet(tmp_path)
    SCENARIOS[scenario][0](fleet)
    [record] = fleet.store.load()[0]["history"]
    assert [(e["phase"], e["next"], e["message"]) for e in record["events"]] == TRANSCRIPTS[scenario]
    assert {e["at"] for e in record["events"]} == {"2027-01-15T08:00:00Z"}, "each event at its time (a fake clock)"
    assert fleet.backend.refused_labels == []


def test_a_rollback_keeps_the_canary_label_on_a_served_version_while_stable_loads_again(tmp_path):
    fleet = Fleet(tmp_path)
    failed_at_50(fleet)
    canary_writes = [w for w in fleet.backend.writes if w[:2] == ("set_track", "canary")]
    assert canary_writes[-2:] == [("set_track", "canary", [1, 2], {"canary": 2}),
                                  ("set_track", "canary", [1], {"canary": 1})]
    # Rolled back before the canary label moved: it stays on version 1 throughout.
    fleet = Fleet(tmp_path / "before-label")
    fleet.backend.failing["canary"][2] = "Loading servable failed"
    fleet.controller().start(2)
    fleet.backend.failing["canary"].clear()
    assert [w for w in fleet.backend.writes if w[:2] == ("set_track", "canary")] == [
        ("set_track", "canary", [1, 2], {"canary": 1}), ("set_track", "canary", [1], {"canary": 1})]
    assert fleet.backend.served() == BEFORE and fleet.backend.refused_labels == []


# Where a server serves one version, the stable track has no label to move back.
ONE_VERSION_MESSAGES = {"label stable -> 1 again (it was still loaded)": "the stable servers serve version 1 again"}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_backend_serving_one_version_per_server_rolls_out_and_back_from_every_commit(tmp_path, scenario):
    """KubeDL's shape: no labels, a track's servers serve the highest version its config names."""
    run, wanted_state, outcome = SCENARIOS[scenario]
    fleet = Fleet(tmp_path / "uninterrupted", OneVersionBackend)
    run(fleet)
    [record] = fleet.store.load()[0]["history"]
    assert fleet.backend.served() == wanted_state and record["outcome"] == outcome
    assert fleet.backend.writes[0] == ("set_track", "canary", [2], {"canary": 2}), "the canary servers serve 2 now"
    wanted = [ONE_VERSION_MESSAGES.get(m, m) for _, _, m in TRANSCRIPTS[scenario]]
    assert [e["message"] for e in record["events"]] == wanted
    commits = [i for i, e in enumerate(fleet.events) if e[0] == "commit"]
    for index in commits[:-1]:
        stopped = Fleet(tmp_path / f"stopped-{index}", OneVersionBackend)
        stopped.stop_at = index
        with pytest.raises(Stop):
            run(stopped)
        stopped.stop_at = None
        record = stopped.controller().rollback()
        assert stopped.backend.served() == BEFORE and record["outcome"] == "rolled_back", f"stopped after {index}"


@pytest.mark.parametrize("phase", ["load", "label"])
def test_promotion_by_hand_before_verification_still_brings_the_canary_servers_to_the_candidate(tmp_path, phase):
    fleet = Fleet(tmp_path)
    stop_after(fleet, "promoted", "commit", phase)
    verifier = ScriptedVerifier()
    record = fleet.controller(verifier).promote()
    assert record["outcome"] == "promoted" and fleet.backend.served() == PROMOTED and record["manual"] is True
    assert verifier.windows == [], "nothing verified after the promotion was asked for"
    assert (phase, phase, "promotion of version 2 asked for by hand: skipping the remaining steps") in [
        (e["phase"], e["next"], e["message"]) for e in record["events"]]
    assert fleet.backend.refused_labels == []


def test_promotion_by_hand_waits_out_the_kept_time_by_default(tmp_path):
    fleet = Fleet(tmp_path)
    fleet.controller(ScriptedVerifier(inconclusive_at=[50, 50]), max_inconclusive=2, on_inconclusive="pause").start(2)
    started = CLOCK[0]
    record = fleet.controller(keep_previous_s=2).promote()
    assert record["outcome"] == "promoted" and fleet.backend.served() == PROMOTED
    assert CLOCK[0] - started == pytest.approx(2.0), "it waited the kept time, then retired version 1"


@pytest.mark.parametrize("scenario, phase, track", [
    ("rolled back after promotion", "revert_label", "stable"),
    ("failed at 50%", "rollback_canary_load", "canary"),
    ("failed at 50%", "rollback_canary_label", "canary"),
])
def test_a_rollback_whose_servers_do_not_follow_stops_and_resumes_when_they_do(tmp_path, scenario, phase, track):
    """A rollback has nowhere else to go: it waits for the servers, then stops with a sentence, never half-done."""
    fleet = Fleet(tmp_path)
    stop_after(fleet, scenario, "commit", phase)
    fleet.backend.failing[track][1] = "disk full"
    with pytest.raises(RolloutError, match=r"^the servers did not reach the state this step needs within 0s \(.*\); "
                                           r"fix them and run the same command again to resume.$"):
        fleet.controller().rollback()
    assert fleet.store.load()[0]["current"]["phase"] == phase
    fleet.backend.failing[track].clear()
    assert fleet.controller().rollback()["outcome"] == "rolled_back" and fleet.backend.served() == BEFORE


def test_a_rollback_after_the_previous_version_was_retired_loads_it_before_labelling_it(tmp_path):
    fleet = Fleet(tmp_path)
    stop_after(fleet, "promoted", "write", "retain")
    assert fleet.backend.configs["stable"] == ([2], {"stable": 2}), "retired, the outcome not recorded yet"
    written = len(fleet.backend.writes)
    record = fleet.controller().rollback()
    assert [w for w in fleet.backend.writes[written:] if w[:2] == ("set_track", "stable")] == [
        ("set_track", "stable", [1, 2], {"stable": 2}), ("set_track", "stable", [1, 2], {"stable": 1}),
        ("set_track", "stable", [1], {"stable": 1})]
    assert ("revert_label", "revert_unload", "label stable -> 1 again (loaded again first)") in [
        (e["phase"], e["next"], e["message"]) for e in record["events"]]
    assert fleet.backend.served() == BEFORE and fleet.backend.refused_labels == []


# Waiting for the servers, and what the controller reads back before it records an outcome


def _views_in_phase(fleet: Fleet, phase: str, track: str, views: list[ServerView]) -> None:
    """The track's servers answer `views` about every version while the rollout is in `phase`."""
    original = fleet.backend.version_views

    def version_views(model: str, asked_track: str, version: int) -> list[ServerView]:
        current = fleet.store.load()[0]["current"]
        if asked_track == track and current is not None and current["phase"] == phase:
            return list(views)
        return original(model, asked_track, version)

    fleet.backend.version_views = version_views


@pytest.mark.parametrize("views, why", [
    ([ServerView("canary-0", "LOADING")], "canary-0 LOADING"),
    ([], "no server"),
    ([ServerView("canary-0", "AVAILABLE"), ServerView("canary-1", "END")], "canary-1 END"),  # unloading: waited for
])
def test_a_candidate_that_never_becomes_available_is_waited_for_then_rolled_back(tmp_path, views, why):
    fleet = Fleet(tmp_path)
    _views_in_phase(fleet, "load", "canary", views)
    record = fleet.controller().start(2)
    assert record["reason"] == f"version 2 did not load on the canary servers: not AVAILABLE after 0s ({why})"
    assert fleet.backend.served() == BEFORE and CLOCK[0] > 1_800_000_000.0, "it polled meanwhile"


@pytest.mark.parametrize("answers", [[], [1], [2, 1]])
def test_a_canary_label_that_does_not_move_is_waited_for_then_rolled_back(tmp_path, answers):
    fleet = Fleet(tmp_path)
    original = fleet.backend.label_views
    fleet.backend.label_views = lambda model, track, label: (
        list(answers) if fleet.store.load()[0]["current"]["phase"] == "label" else original(model, track, label))
    record = fleet.controller().start(2)
    assert record["reason"] == (f"the canary label did not move to version 2: not AVAILABLE after 0s (label canary "
                                f"answers {answers})")
    assert fleet.backend.served() == BEFORE


def test_a_candidate_not_available_on_every_canary_server_at_a_step_is_rolled_back(tmp_path):
    fleet = Fleet(tmp_path)
    _views_in_phase(fleet, "verify", "canary", [ServerView("canary-0", "AVAILABLE"), ServerView("canary-1", "LOADING"),
                                                ServerView("canary-2", "END", "Loading servable failed")])
    record = fleet.controller().start(2)
    assert record["reason"] == ("verification at 0% failed: candidate not AVAILABLE: canary-1 LOADING, canary-2 END "
                                "Loading servable failed")
    [failed] = [e for e in record["events"] if e["next"] == "rollback_route"]
    assert failed["figures"]["canary_servers"] == 3 and "golden" not in failed["figures"]


def test_a_rollout_moved_by_another_command_while_waiting_for_servers_stops_there(tmp_path, monkeypatch):
    fleet = Fleet(tmp_path)
    _views_in_phase(fleet, "load", "canary", [ServerView("canary-0", "LOADING")])
    moved = []

    def sleep_while_another_command_rolls_back(seconds: float) -> None:
        CLOCK[0] += seconds
        if not moved:
            other = LockIgnoringStore(tmp_path)
            document, token = other.load()
            other.save({**document, "current": {**document["current"], "phase": "rollback_route"}}, token)
            moved.append(True)

    monkeypatch.setattr(sys.modules[__name__], "_sleep", sleep_while_another_command_rolls_back)
    with pytest.raises(StateConflictError) as stopped:
        fleet.controller().start(2)
    assert str(stopped.value) == ("the rollout state changed since this controller read it (another command moved or "
                                  "ended the rollout); it stopped without touching traffic; see `mlops rollout "
                                  "status`.")
    assert moved and fleet.backend.configs["canary"] == ([1, 2], {"canary": 1}), "nothing written after the move"


def test_an_outcome_is_recorded_only_when_the_backend_shows_it(tmp_path):
    fleet = Fleet(tmp_path)
    stop_after(fleet, "promoted", "write", "retain")
    fleet.backend.weight = 10  # someone moved the route by hand
    with pytest.raises(RolloutError) as refused:
        fleet.controller().start(2)
    assert str(refused.value) == (
        "the backend does not show the promoted state (the stable track serves [2] (stable -> 2) and the canary track "
        "serves [2] (canary -> 2), 10% of the traffic on the canary; wanted the stable track serves [2] (stable -> 2) "
        "and the canary track serves [2] (canary -> 2), 0% of the traffic on the canary); fix the servers and run the "
        "same command again to resume.")
    assert fleet.store.load()[0]["current"]["phase"] == "retain" and fleet.store.load()[0]["history"] == []
    fleet.backend.weight = 0
    record = fleet.controller().start(2)
    assert record["outcome"] == "promoted" and record["served"] == PROMOTED
    assert record["finished_at"] == record["events"][-1]["at"] == "2027-01-15T08:00:00Z" and record["phase"] == "done"
    # And a rollback's end the same way: in words, with no underscore.
    fleet = Fleet(tmp_path / "rolled-back")
    stop_after(fleet, "failed at 50%", "write", "rollback_canary_label")
    fleet.backend.weight = 5
    with pytest.raises(RolloutError, match=r"^the backend does not show the rolled back state \(.*5% of the traffic on "
                                           r"the canary; wanted .*0% of the traffic on the canary\)"):
        fleet.controller().rollback()


def test_a_rollback_recorded_before_the_candidate_reached_the_stable_servers_leaves_them_alone(tmp_path):
    fleet = Fleet(tmp_path)
    stop_after(fleet, "promoted", "commit", "promote_load")
    written = len(fleet.backend.writes)
    record = fleet.controller().rollback()
    assert [w for w in fleet.backend.writes[written:] if w[:2] == ("set_track", "stable")] == []
    assert [e["next"] for e in record["events"]][-4:] == ["rollback_route", "rollback_canary_load",
                                                          "rollback_canary_label", "done"]
    assert fleet.backend.served() == BEFORE


def test_a_retired_version_that_does_not_load_again_stops_the_rollback_until_it_does(tmp_path):
    fleet = Fleet(tmp_path)
    stop_after(fleet, "promoted", "write", "retain")
    fleet.backend.failing["stable"][1] = "disk full"
    with pytest.raises(RolloutError, match=r"^the servers did not reach the state this step needs within 0s \(failed: "
                                           r"stable-0: disk full\)"):
        fleet.controller().rollback()
    assert fleet.backend.configs["stable"] == ([1, 2], {"stable": 2}), "version 2 still answers under stable"
    fleet.backend.failing["stable"].clear()
    assert fleet.controller().rollback()["outcome"] == "rolled_back" and fleet.backend.served() == BEFORE


def test_a_kept_version_retires_at_the_end_of_its_kept_time_exactly(tmp_path):
    fleet = Fleet(tmp_path)
    state = fleet.controller(keep_previous_s=600).start(2, wait_retain=False)
    CLOCK[0] = state["retain_until"] - 0.5
    assert fleet.controller(keep_previous_s=600).start(2, wait_retain=False)["phase"] == "retain"
    CLOCK[0] = state["retain_until"]
    record = fleet.controller(keep_previous_s=600).start(2, wait_retain=False)
    assert record["outcome"] == "promoted" and fleet.backend.served() == PROMOTED


@pytest.mark.parametrize("meanwhile", ["rolled back and ended", "rolling back", "another rollout kept"])
def test_a_controller_waiting_out_the_kept_time_stops_when_another_command_moved_the_rollout(tmp_path, monkeypatch,
                                                                                         meanwhile):
    fleet = Fleet(tmp_path)
    moved: list[bool] = []

    def sleep_while_another_command_acts(seconds: float) -> None:
        CLOCK[0] += seconds
        if moved:
            return
        other = LockIgnoringStore(tmp_path)
        document, token = other.load()
        current = document["current"]
        changed = {"rolled back and ended": None, "rolling back": {**current, "phase": "revert_label"},
                   "another rollout kept": {**current, "id": "another"}}[meanwhile]
        other.save({**document, "current": changed}, token)
        moved.append(True)

    monkeypatch.setattr(sys.modules[__name__], "_sleep", sleep_while_another_command_acts)
    with pytest.raises(RolloutError) as stopped:
        fleet.controller(keep_previous_s=5).start(2)
    assert str(stopped.value) == ("the rollout state changed while waiting (another command rolled it back); see "
                                  "`mlops rollout status`.")
    assert fleet.backend.configs["stable"] == ([1, 2], {"stable": 2}), "the previous version was not retired"


def test_one_verifier_serves_every_step_of_a_command(tmp_path):
    fleet = Fleet(tmp_path)
    made: list[ScriptedVerifier] = []

    def factory() -> ScriptedVerifier:
        made.append(ScriptedVerifier())
        return made[-1]

    controller = Controller(fleet.backend, MODEL, [50, 100], factory, load_timeout_s=0.2, keep_previous_s=0,
                            poll_s=0.01, log=lambda _: None, sleep=_sleep)
    assert controller.start(2)["outcome"] == "promoted"
    assert len(made) == 1 and made[0].windows == [0, 50, 100], "its clients and connections are opened once"


def test_a_stable_label_that_does_not_move_stops_the_promotion_until_it_does(tmp_path):
    fleet = Fleet(tmp_path)
    original = fleet.backend.label_views
    stuck = [True]
    fleet.backend.label_views = lambda model, track, label: (
        [1] if stuck[0] and track == "stable" else original(model, track, label))
    with pytest.raises(RolloutError, match=r"^the servers did not reach the state this step needs within 0s \(label "
                                           r"stable answers \[1\]\); fix them and run the same command again"):
        fleet.controller().start(2)
    assert fleet.store.load()[0]["current"]["phase"] == "promote_label"
    stuck[0] = False
    assert fleet.controller().start(2)["outcome"] == "promoted" and fleet.backend.served() == PROMOTED


def test_a_golden_comparison_that_fails_rolls_back_before_any_window(tmp_path):
    fleet = Fleet(tmp_path)
    verifier = ScriptedVerifier(golden_error="row 3: max|diff| 0.2 > rollout.max_abs_diff 0.0001 over REST")
    record = fleet.controller(verifier).start(2)
    assert record["reason"] == "verification at 0% failed: row 3: max|diff| 0.2 > rollout.max_abs_diff 0.0001 over REST"
    assert verifier.windows == [] and fleet.backend.served() == BEFORE


def test_the_first_window_inconclusive_counts_one_and_a_rollback_for_inconclusive_windows_keeps_their_figures(
        tmp_path):
    fleet = Fleet(tmp_path)
    record = fleet.controller(ScriptedVerifier(inconclusive_at=[0, 0, 0]), max_inconclusive=3).start(2)
    retries = [e["message"] for e in record["events"] if e["next"] == "verify" and e["phase"] == "verify"]
    assert retries == [f"the window at 0% is inconclusive ({n} of 3 in a row): no metrics from the canary server(s) "
                       "canary-0 (failed scrape); verifying again" for n in (1, 2)]
    [rolled_back] = [e for e in record["events"] if e["next"] == "rollback_route"]
    assert rolled_back["figures"]["window"]["inconclusive"].startswith("no metrics from the canary")
    assert rolled_back["figures"]["weight"] == 0 and "error" not in rolled_back["figures"]


def test_a_paused_rollout_says_how_to_go_on(tmp_path):
    fleet = Fleet(tmp_path)
    verifier = ScriptedVerifier(inconclusive_at=[0])
    state = fleet.controller(verifier, max_inconclusive=1, on_inconclusive="pause").start(2)
    assert state["events"][-1]["message"] == (
        "PAUSED at 0% canary traffic (1 inconclusive windows in a row at 0%: no metrics from the canary server(s) "
        "canary-0 (failed scrape)); fix what keeps the figures from being trusted, then run `mlops rollout start "
        "--version 2` to verify again, or `mlops rollout rollback`")


def test_what_is_served_is_described_with_every_label_or_none():
    from rollout.controller import describe_served

    served = {"stable": {"versions": [1, 2], "labels": {"stable": 1, "canary": 2}},
              "canary": {"versions": [3], "labels": {}}, "canary_weight": 5}
    assert describe_served(served) == ("the stable track serves [1, 2] (canary -> 2, stable -> 1) and the canary track "
                                       "serves [3] (no label), 5% of the traffic on the canary")


def test_a_rollback_on_one_version_servers_waits_for_the_previous_version_then_stops(tmp_path):
    fleet = Fleet(tmp_path, OneVersionBackend)
    fleet.controller(keep_previous_s=600).start(2, wait_retain=False)
    fleet.backend.failing["stable"][1] = "disk full"
    with pytest.raises(RolloutError, match=r"^the servers did not reach the state this step needs within 0s \(failed: "
                                           r"stable-0: disk full\)"):
        fleet.controller().rollback()
    fleet.backend.failing["stable"].clear()
    assert fleet.controller().rollback()["outcome"] == "rolled_back" and fleet.backend.served() == BEFORE



class LosingStore(HookedStore):
    """A store whose lock (the Lease) is lost at `lose()`, as a renewal that found another holder marks it."""

    def __init__(self, base_dir) -> None:
        super().__init__(base_dir)
        self.holding = Holding()

    @contextlib.contextmanager
    def exclusive(self, wait_s: float = 0.0):
        yield self.holding

    def lose(self) -> None:
        self.holding.lost = "Lease mlops/rollout-tiny is held by other-7 now"


@pytest.mark.parametrize("lost_after, message", [
    ("commit", "this controller lost its lease (Lease mlops/rollout-tiny is held by other-7 now); it stopped without "
               "touching traffic; see `mlops rollout status`."),
    ("write", "this controller lost its lease (Lease mlops/rollout-tiny is held by other-7 now); nothing was recorded; "
              "see `mlops rollout status`."),
])
def test_a_controller_that_lost_its_lease_stops_before_its_next_write(tmp_path, lost_after, message):
    store = LosingStore(tmp_path)
    backend = MemoryBackend(store)
    controller = Controller(backend, MODEL, [50, 100], ScriptedVerifier, load_timeout_s=0.2, keep_previous_s=0,
                            poll_s=0.01, log=lambda _: None, sleep=_sleep)
    label_write = ("set_track", "canary", [2], {"canary": 2})
    if lost_after == "commit":  # between a commit and the next phase's backend write
        store.after_save = lambda doc: store.lose() if (doc["current"] or {}).get("phase") == "label" else None
    else:  # between a backend write and its commit
        backend.after_write = lambda write: store.lose() if write == label_write else None
    with pytest.raises(StateConflictError) as stopped:
        controller.start(2)
    assert str(stopped.value) == message
    written = [w for w in backend.writes if w[0] == "set_track"]
    assert written[-1] == (("set_track", "canary", [1, 2], {"canary": 1}) if lost_after == "commit" else
                           ("set_track", "canary", [2], {"canary": 2})), "nothing written after the lease was lost"
    assert store.load()[0]["current"]["phase"] == "label"


def test_a_state_file_without_a_history_gets_one(tmp_path):
    fleet = Fleet(tmp_path)
    fleet.store.path.parent.mkdir(parents=True, exist_ok=True)
    fleet.store.path.write_text('{"current": null}')  # written by hand, or by an older version
    record = fleet.controller().start(2)
    assert fleet.store.load()[0]["history"] == [record]


def test_a_finished_rollout_run_again_says_so_and_how_to_retry_a_rolled_back_one(tmp_path):
    logged: list[str] = []
    fleet = Fleet(tmp_path)
    reports = tmp_path / "reports"
    record = fleet.controller(report_dir=str(reports)).start(2)
    [page] = reports.glob("*.html")
    page.write_text("kept")
    assert fleet.controller(log=logged.append, report_dir=str(reports)).start(2) == record
    assert logged == [f"the rollout of version 2 already finished at {record['finished_at']}: promoted"]
    assert page.read_text() == "kept", "a report that is there is not written again"
    fleet.controller(ScriptedVerifier(fail_at=(50,))).start(3)
    logged.clear()
    assert fleet.controller(log=logged.append).start(3)["outcome"] == "rolled_back"
    assert logged == ["the rollout of version 3 already finished at 2027-01-15T08:00:00Z: rolled_back; pass --retry to "
                      "roll it out again"]


def test_a_new_rollout_retires_a_kept_version_first_and_refuses_while_another_is_under_way(tmp_path):
    fleet = Fleet(tmp_path)
    fleet.controller(keep_previous_s=600).start(2, wait_retain=False)
    record = fleet.controller().start(3)
    assert record["outcome"] == "promoted" and record["stable"] == 2
    assert [h["outcome"] for h in fleet.store.load()[0]["history"]] == ["promoted", "promoted"]
    assert fleet.backend.served()["stable"] == {"versions": [3], "labels": {"stable": 3}}
    fleet.controller(ScriptedVerifier(inconclusive_at=[50]), max_inconclusive=1, on_inconclusive="pause").start(4)
    with pytest.raises(RolloutError) as refused:
        fleet.controller().start(5)
    assert str(refused.value) == ("a rollout of version 4 is in progress (phase verify); finish it with `mlops rollout "
                                  "start --version 4`, or `mlops rollout promote` / `rollback` first.")


def test_a_paused_rollout_resumes_with_a_fresh_count_of_inconclusive_windows(tmp_path):
    fleet = Fleet(tmp_path)
    fleet.controller(ScriptedVerifier(inconclusive_at=[50, 50]), max_inconclusive=2, on_inconclusive="pause").start(2)
    verifier = ScriptedVerifier(inconclusive_at=[50])
    record = fleet.controller(verifier, max_inconclusive=2, on_inconclusive="pause").start(2)
    assert record["outcome"] == "promoted" and verifier.windows == [50, 50, 100]
    assert ("verify", "verify", "resuming the paused rollout: verifying again") in [
        (e["phase"], e["next"], e["message"]) for e in record["events"]]


def test_a_kept_version_not_waited_for_says_how_long_it_stays(tmp_path):
    logged: list[str] = []
    Fleet(tmp_path).controller(keep_previous_s=600, log=logged.append).start(2, wait_retain=False)
    assert logged[-1] == "version 1 stays loaded for 600s more; the next rollout command after that retires it"


def test_a_new_rollout_records_what_it_starts_from_and_refuses_what_it_cannot_roll_out(tmp_path):
    fleet = Fleet(tmp_path)
    state = fleet.controller(ScriptedVerifier(inconclusive_at=[0]), max_inconclusive=1, on_inconclusive="pause",
                             limits={"max_error_rate": 0.01}).start(2)
    assert len(state["id"]) == 12 and int(state["id"], 16) >= 0
    assert {k: state[k] for k in ("model", "backend", "stable", "candidate", "steps", "step", "started_at",
                                  "limits")} == {
        "model": "tiny", "backend": "memory", "stable": 1, "candidate": 2, "steps": [50, 100], "step": 0,
        "started_at": "2027-01-15T08:00:00Z", "limits": {"max_error_rate": 0.01}}
    assert state["events"][0] == {"at": "2027-01-15T08:00:00Z", "phase": "start", "next": "load",
                                  "message": "rollout of version 2 over stable 1 started"}
    fleet.controller().rollback()
    assert "limits" not in fleet.controller().start(3), "no limits given, none recorded"
    with pytest.raises(RolloutError, match=r"^version 3 is already the stable version of 'tiny'.$"):
        fleet.controller().start(3, retry=True)
    written = list(fleet.backend.writes)
    with pytest.raises(BackendError, match=r"^version 7 of 'tiny' is not published.$"):
        fleet.controller().start(7)
    assert fleet.backend.writes == written and fleet.store.load()[0]["current"] is None, "nothing started"
    empty = Fleet(tmp_path / "no-stable")
    empty.backend.configs["stable"] = ([], {})
    with pytest.raises(RolloutError, match=r"^no version of 'tiny' is labelled stable yet; publish one first \(the "
                                           r"first published version serves as stable\).$"):
        empty.controller().start(2)


def test_a_rolled_back_version_is_rolled_out_again_only_when_asked_to(tmp_path):
    fleet = Fleet(tmp_path)
    fleet.controller(ScriptedVerifier(fail_at=(50,))).start(2)
    assert fleet.controller().start(2)["outcome"] == "rolled_back", "the recorded outcome, nothing run"
    record = fleet.controller().start(2, retry=True)
    assert record["outcome"] == "promoted" and fleet.backend.served() == PROMOTED
    assert [h["outcome"] for h in fleet.store.load()[0]["history"]] == ["rolled_back", "promoted"]


def test_servers_that_load_after_a_few_polls_are_waited_for(tmp_path):
    fleet = Fleet(tmp_path)
    polls = []
    original = fleet.backend.version_views

    def loading_for_three_polls(model: str, track: str, version: int) -> list[ServerView]:
        if track == "canary" and version == 2 and len(polls) < 3:
            polls.append(version)
            return [ServerView("canary-0", "LOADING"), ServerView("canary-1", "LOADING")]
        return original(model, track, version)

    fleet.backend.version_views = loading_for_three_polls
    started = CLOCK[0]
    record = fleet.controller().start(2)
    assert record["outcome"] == "promoted" and len(polls) == 3
    assert CLOCK[0] - started == pytest.approx(0.03), "one poll_s between polls"


def test_every_server_that_failed_or_is_still_waited_for_is_named(tmp_path):
    fleet = Fleet(tmp_path)
    _views_in_phase(fleet, "load", "canary", [ServerView("canary-0", "END", "boom"), ServerView("canary-1", "END",
                                                                                                "out of memory")])
    assert fleet.controller().start(2)["reason"] == ("version 2 did not load on the canary servers: canary-0: boom; "
                                                     "canary-1: out of memory")
    fleet = Fleet(tmp_path / "waiting")
    _views_in_phase(fleet, "load", "canary", [ServerView("canary-0", "LOADING"), ServerView("canary-1", "NOT_FOUND")])
    assert fleet.controller().start(2)["reason"] == ("version 2 did not load on the canary servers: not AVAILABLE "
                                                     "after 0s (canary-0 LOADING, canary-1 NOT_FOUND)")
