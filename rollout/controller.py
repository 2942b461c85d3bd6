"""The rollout controller: one candidate version, loaded on the canary track, verified before each traffic step,
then promoted to the stable track or rolled back.

Every step is a phase whose action is a pure function of (stable, candidate, phase): it writes the configs or
weights that phase wants (nothing when they are already so), waits for the servers to agree, and only then records
the next phase. A controller killed anywhere re-reads the state and repeats the current phase, which changes nothing
that was already done, so it finishes with the same end state and records each outcome once.

One controller at a time: every command holds the state store's lock (a Kubernetes Lease, a file lock here) while it
acts, and every state write is fenced on the revision it read when the command began, so a controller that finds its
rollout ended or changed by someone else stops without touching traffic. Every outcome it prints and records is
computed from the tracks and weights read back from the backend.

TF Serving's rules it keeps: a label only moves to a version already AVAILABLE (load, wait, then label), and as an
unversioned request goes to the highest loaded version, the candidate is loaded only on the canary track, which
gets traffic through the weights alone.
"""
from __future__ import annotations

import calendar
import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from rollout.backends import Backend, BackendError
from rollout.causes import describe_causes, failure_causes
from rollout.report import report_paths, write_report
from rollout.skew import SkewCheck, SkewCheckError, describe_feature
from rollout.state import Holding, StateConflictError
from rollout.verify import Verifier
from settings.errors import UserError

STABLE, CANARY = "stable", "canary"
ROLLBACK_PHASES = ("rollback_route", "rollback_canary_load", "rollback_canary_label", "revert_label", "revert_unload")
PHASES = ("load", "label", "verify", "promote_load", "promote_label", "promote_route", "retain", *ROLLBACK_PHASES)


class RolloutError(UserError, RuntimeError):
    """A rollout command that cannot be carried out as asked; the message says what to do instead."""

    exit_code = 2


class WaitFailed(RuntimeError):
    pass


def _now() -> float:
    return time.time()


def _stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _seconds(stamp: str) -> float:
    return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))


class Controller:
    def __init__(self, backend: Backend, model: str, steps: list[int], verifier_factory: Callable[[], Verifier],
                 load_timeout_s: float, keep_previous_s: float, poll_s: float,
                 log: Callable[[str], None] = print, sleep: Callable[[float], None] = time.sleep,
                 report_dir: str | None = None, limits: dict[str, Any] | None = None,
                 max_inconclusive: int = 3, on_inconclusive: str = "rollback", history_limit: int = 20,
                 lease_wait_s: float = 0.0, skew_check: SkewCheck | None = None, shadow_percent: int = 0) -> None:
        self.backend = backend
        self.model = model
        self.steps = list(steps)
        self.verifier_factory = verifier_factory
        self._verifier: Verifier | None = None
        self.load_timeout_s = load_timeout_s
        self.keep_previous_s = keep_previous_s
        self.poll_s = poll_s
        self.log = log
        self.sleep = sleep
        # Each finished rollout lands there as <model>-v<candidate>-<id>.json and .html (rollout/report.py);
        # any folder or URI tf.io.gfile serves.
        self.report_dir = str(report_dir) if report_dir is not None else None
        self.limits = limits
        self.max_inconclusive = max_inconclusive
        self.on_inconclusive = on_inconclusive
        self.history_limit = history_limit
        self.lease_wait_s = lease_wait_s
        # rollout.skew_check: the candidate's logged requests judged against its training data before each step.
        self.skew_check = skew_check
        # rollout.shadow.percent: the share of the users' requests copied to the candidate at the 0% step (0: none).
        self.shadow_percent = shadow_percent
        self._holding: Holding | None = None
        self._document: dict[str, Any] = {}
        self._token = ""

    # State

    def document(self) -> dict[str, Any]:
        return self.backend.store.load()[0]

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        with self.backend.store.exclusive(self.lease_wait_s) as holding:
            self._holding = holding
            try:
                yield
            finally:
                self._holding = None

    def _read(self) -> dict[str, Any]:
        """The state as this command begins: every later write is fenced on this revision."""
        self._document, self._token = self.backend.store.load()
        return self._document

    def _fence(self) -> None:
        """Raises StateConflictError when this controller lost its lease or the state moved since it last read or
        wrote it: the caller stops before touching traffic."""
        if self._holding is not None and self._holding.expired():
            raise StateConflictError(f"this controller lost its lease ({self._holding.lost}); it stopped without "
                                     "touching traffic; see `mlops rollout status`.")
        _, token = self.backend.store.load()
        if token != self._token:
            raise StateConflictError("the rollout state changed since this controller read it (another command moved "
                                     "or ended the rollout); it stopped without touching traffic; see `mlops rollout "
                                     "status`.")

    def _commit(self, current: dict[str, Any] | None, event: dict[str, Any] | None = None,
                finished: dict[str, Any] | None = None) -> None:
        if self._holding is not None and self._holding.expired():
            raise StateConflictError(f"this controller lost its lease ({self._holding.lost}); nothing was recorded; "
                                     "see `mlops rollout status`.")
        if event is not None:
            current = {**current, "events": [*current["events"], {"at": _stamp(_now()), **event}]}
        document = {**self._document, "current": current}
        if finished is not None:
            # Older outcomes live on in their reports; the state document stays small (a ConfigMap holds 1 MiB).
            document["history"] = [*document.get("history", []), finished][-self.history_limit:]
        self._token = self.backend.store.save(document, self._token)
        self._document = document
        self._current = current

    def _advance(self, state: dict[str, Any], phase: str, message: str, **changes: Any) -> dict[str, Any]:
        # A step's verification (`figures`) and the window after the traffic moved to stable (`watch`) go to the event.
        recorded = {key: value for key in ("figures", "watch") if (value := changes.pop(key, None)) is not None}
        new = {**state, **changes, "phase": phase}
        self._commit(new, {"phase": state["phase"], "next": phase, "message": message, **recorded})
        self.log(message)
        return self._current

    # Commands

    def start(self, candidate: int, wait_retain: bool = True, retry: bool = False,
              allow_downgrade: bool = False) -> dict[str, Any]:
        """Starts a rollout of `candidate`, or resumes the one in progress for it; returns the finished record (or the
        state, when it pauses or leaves the previous version loaded).

        Run again after the rollout of `candidate` finished (a controller killed just after recording the outcome
        is started again with the same command), it returns that outcome and does nothing; `retry` starts a new
        rollout of a version whose last one was rolled back."""
        with self._exclusive():
            document = self._read()
            current = document.get("current")
            last = (document.get("history") or [None])[-1]
            if current is None and last is not None and last["candidate"] == candidate and not retry:
                advice = "; pass --retry to roll it out again" if last["outcome"] == "rolled_back" else ""
                self.log(f"the rollout of version {candidate} already finished at {last['finished_at']}: "
                         f"{last['outcome']}{advice}")
                self._write_report(last, only_if_missing=True)
                return last
            if current is not None and current["candidate"] != candidate:
                if current["phase"] != "retain":
                    raise RolloutError(
                        f"a rollout of version {current['candidate']} is in progress (phase {current['phase']}); "
                        "finish it with `mlops rollout start --version "
                        f"{current['candidate']}`, or `mlops rollout promote` / `rollback` first.")
                self.log(f"retiring version {current['stable']} early: a new rollout starts")
                self._run(current, retire_now=True)
                current = None
            if current is None:
                current = self._new(candidate, allow_downgrade)
            else:
                self.log(f"resuming the rollout of version {candidate} at phase {current['phase']}")
                if current.get("paused"):
                    resumed = {k: v for k, v in current.items() if k != "paused"}
                    # The count of inconclusive windows needs no reset here: the pause reset it.
                    current = self._advance(resumed, current["phase"], "resuming the paused rollout: verifying "
                                            "again")
            state = self._run(current)
        return self._after_retain(state, wait_retain)

    def promote(self, wait_retain: bool = True) -> dict[str, Any]:
        """Promotes the current candidate now (skipping the remaining steps), or, once promoted, retires the
        previous version without waiting out its keep time."""
        with self._exclusive():
            self._read()
            current = self._require_current()
            if current["phase"] in ROLLBACK_PHASES:
                raise RolloutError(f"the rollout of version {current['candidate']} is rolling back; it cannot be "
                                   "promoted. Run `mlops rollout start` to let the rollback finish.")
            if current["phase"] == "retain":
                return self._run(current, retire_now=True)
            if current["phase"] in ("load", "label", "verify"):
                changes = {k: v for k, v in current.items() if k != "paused"}
                # Before verification the canary servers still load and label the candidate (then promotion, without
                # a step): a promoted rollout serves it on both tracks.
                phase = "promote_load" if current["phase"] == "verify" else current["phase"]
                current = self._advance(changes, phase, f"promotion of version {current['candidate']} asked for by "
                                        "hand: skipping the remaining steps", manual=True)
            state = self._run(current)
        return self._after_retain(state, wait_retain)

    def rollback(self, reason: str = "asked for by hand") -> dict[str, Any]:
        """Rolls the current rollout back: before promotion all traffic returns to stable and the canary is removed;
        after promotion (while the previous version is kept) the previous version becomes stable again."""
        with self._exclusive():
            self._read()
            current = self._require_current()
            if current["phase"] not in ROLLBACK_PHASES:
                current = self._begin_rollback(current, reason)
            return self._run(current)

    def _after_retain(self, state: dict[str, Any], wait: bool) -> dict[str, Any]:
        """Waits out the kept previous version without holding the lock (a rollback may come meanwhile), then retires
        it under the lock again; returns the finished record, or the state when not waiting."""
        if state.get("phase") != "retain":
            return state
        remaining = state["retain_until"] - _now()
        if not wait:
            self.log(f"version {state['stable']} stays loaded for {max(0.0, remaining):.0f}s more; the next rollout "
                     "command after that retires it")
            return state
        self.log(f"keeping version {state['stable']} loaded for {max(0.0, remaining):.0f}s (mlops rollout rollback "
                 "reverts instantly meanwhile)")
        while (remaining := state["retain_until"] - _now()) > 0:
            self.sleep(min(self.poll_s, remaining))
            self._changed_meanwhile(state)
        with self._exclusive():
            self._read()
            self._changed_meanwhile(state)
            return self._run(self._document["current"])  # its kept time is over: _retain retires it

    def _changed_meanwhile(self, state: dict[str, Any]) -> None:
        latest = self.document().get("current")
        if latest is None or latest.get("id") != state["id"] or latest["phase"] != "retain":
            raise RolloutError("the rollout state changed while waiting (another command rolled it back); "
                               "see `mlops rollout status`.")

    def _require_current(self) -> dict[str, Any]:
        current = self._document.get("current")
        if current is None:
            raise RolloutError(f"no rollout of {self.model!r} is in progress; start one with "
                               "`mlops rollout start --version V`.")
        return current

    def _new(self, candidate: int, allow_downgrade: bool) -> dict[str, Any]:
        _, labels = self.backend.track_config(self.model, STABLE)
        stable = labels.get(STABLE)
        if stable is None:
            raise RolloutError(f"no version of {self.model!r} is labelled stable yet; publish one first (the first "
                               "published version serves as stable).")
        if candidate == stable:
            raise RolloutError(f"version {candidate} is already the stable version of {self.model!r}.")
        if candidate < stable and not allow_downgrade:
            raise RolloutError(f"version {candidate} is older than the stable version {stable} of {self.model!r}; pass "
                               "--allow-downgrade to roll it back in (while both are loaded, unversioned requests go "
                               "to the higher version).")
        self.backend.check_version(self.model, candidate)
        self.backend.check_routing()
        if self.skew_check is not None:
            try:
                self.skew_check.ready(candidate)
            except SkewCheckError as e:
                raise RolloutError(str(e)) from None
        state = {"id": uuid.uuid4().hex[:12], "model": self.model, "backend": self.backend.name,
                 "stable": stable, "candidate": candidate, "steps": self.steps, "step": 0, "phase": "load",
                 "started_at": _stamp(_now()), "events": [], **({"limits": self.limits} if self.limits else {})}
        self._commit(state, {"phase": "start", "next": "load",
                             "message": f"rollout of version {candidate} over stable {stable} started"})
        self.log(f"rollout {state['id']}: version {candidate} of {self.model!r} against stable {stable} on the "
                 f"{self.backend.name} backend, steps {self.steps}")
        return self._current

    # The state machine

    def _run(self, state: dict[str, Any], retire_now: bool = False) -> dict[str, Any]:
        while True:
            self._fence()
            phase = state["phase"]
            if phase == "retain":
                return self._retain(state, retire_now)
            if phase == "rollback_canary_label":
                return self._rollback_canary_label(state)
            state = getattr(self, f"_{phase}")(state)
            if state.get("paused"):
                return state

    def _load(self, s: dict[str, Any]) -> dict[str, Any]:
        S, C = s["stable"], s["candidate"]
        self.backend.set_track(self.model, CANARY, [S, C], {CANARY: S})
        try:
            self._wait_loaded(CANARY, C)
        except WaitFailed as e:
            return self._begin_rollback(s, f"version {C} did not load on the canary servers: {e}")
        return self._advance(s, "label", f"version {C} is AVAILABLE on every canary server")

    def _label(self, s: dict[str, Any]) -> dict[str, Any]:
        S, C = s["stable"], s["candidate"]
        self.backend.set_track(self.model, CANARY, [C], {CANARY: C})
        try:
            self._wait_label(CANARY, C)
        except WaitFailed as e:
            return self._begin_rollback(s, f"the canary label did not move to version {C}: {e}")
        return self._advance(s, "promote_load" if s.get("manual") else "verify",
                             f"label canary -> {C} on every canary server (version {S} unloaded there)")

    def _verify(self, s: dict[str, Any]) -> dict[str, Any]:
        C, step = s["candidate"], s["step"]
        weight = self.steps[step - 1] if step else 0
        try:
            # Again before every step: a published version's files must not change under a running rollout.
            self.backend.check_version(self.model, C)
        except BackendError as e:
            return self._begin_rollback(s, str(e))
        # The weight of the committed step is set here, never before its commit: a controller killed in between
        # would otherwise set the previous step's weight again on resuming (traffic flapping back and forth).
        # The shadow step is the 0% step where the router can copy requests; the copies stop before users get the
        # canary's answers, and start only once they get none.
        shadow = self.shadow_percent if weight == 0 and self.backend.can_mirror() else 0
        if self.backend.can_mirror() and not shadow:
            self.backend.set_shadow_percent(0)
        self.backend.set_canary_weight(weight)
        if shadow:
            self.backend.set_shadow_percent(shadow)
        try:
            # After the write: the window must judge the weight the gateway has taken, not the one before it (a
            # route's status that judged an older generation is waited for), nor a route that lost its gateway.
            self.backend.check_routing()
        except BackendError as e:
            return self._begin_rollback(s, str(e))
        verifier = self._verifier or self.verifier_factory()
        self._verifier = verifier
        views = self.backend.version_views(self.model, CANARY, C)
        not_available = [v for v in views if v.state != "AVAILABLE"]
        figures: dict[str, Any] = {"weight": weight, "canary_servers": len(views)}
        if not views:
            figures["error"] = "no canary server is running"
        elif not_available:
            figures["error"] = "candidate not AVAILABLE: " + ", ".join(f"{v.server} {v.state} {v.error}".strip()
                                                                      for v in not_available)
        else:
            since = time.time()
            figures["golden"] = verifier.golden(s["stable"], C)
            figures["error"] = figures["golden"].get("error")
            if not figures["error"]:
                since = time.time()
                figures["window"] = verifier.shadow_window(s["stable"], C) if shadow else verifier.window(C, weight)
                figures["error"] = figures["window"].get("error")
            if figures["error"]:
                # The failed part names its causes from what the canary's servers kept of its failures.
                failed = figures.get("window") or figures["golden"]
                causes = failure_causes(self.backend, self.model, C, since, failed.get("traffic", "verifier"))
                if causes["failed_requests"] or causes.get("unread"):  # not for a failure of latency or answers
                    failed["causes"] = causes
            if not figures["error"] and self.skew_check is not None and weight > 0:
                # From the first step with user traffic on the canary (none reaches it at 0%), every request the
                # candidate answered since the rollout began, not only this window's: the sample grows each step.
                figures["skew"] = self.skew_check.check(C, since=_seconds(s["started_at"]))
                figures["error"] = figures["skew"].get("error")
        self.log(f"verification at {weight}% canary traffic: {describe_figures(figures)}")
        if figures["error"]:
            return self._begin_rollback(s, f"verification at {weight}% failed: {figures['error']}", figures=figures)
        figures.pop("error")
        inconclusive = "; ".join(f["inconclusive"] for f in (figures["window"], figures.get("skew") or {})
                                 if f.get("inconclusive")) or None
        if inconclusive is not None:
            count = s.get("inconclusive", 0) + 1
            if count < self.max_inconclusive:
                return self._advance(s, "verify", f"the window at {weight}% is inconclusive ({count} of "
                                     f"{self.max_inconclusive} in a row): {inconclusive}; verifying again",
                                     inconclusive=count, figures=figures)
            why = f"{count} inconclusive windows in a row at {weight}%: {inconclusive}"
            if self.on_inconclusive == "pause":
                return self._advance(s, "verify", f"PAUSED at {weight}% canary traffic ({why}); fix what keeps the "
                                     f"figures from being trusted, then run `mlops rollout start --version {C}` to "
                                     "verify again, or `mlops rollout rollback`", inconclusive=0, paused=why,
                                     figures=figures)
            return self._begin_rollback(s, why, figures=figures)
        if step < len(self.steps):
            return self._advance(s, "verify", f"verified at {weight}%; the canary's share of the traffic moves to "
                                 f"{self.steps[step]}%", step=step + 1, inconclusive=0, figures=figures)
        return self._advance(s, "promote_load", f"verified at {weight}%: promoting version {C}", inconclusive=0,
                             figures=figures)

    def _promote_load(self, s: dict[str, Any]) -> dict[str, Any]:
        S, C = s["stable"], s["candidate"]
        self.backend.set_track(self.model, STABLE, [S, C], {STABLE: S})
        try:
            self._wait_loaded(STABLE, C)
        except WaitFailed as e:
            return self._begin_rollback(s, f"version {C} did not load on the stable servers: {e}")
        return self._advance(s, "promote_label", f"version {C} is AVAILABLE on every stable server")

    def _promote_label(self, s: dict[str, Any]) -> dict[str, Any]:
        S, C = s["stable"], s["candidate"]
        self.backend.set_track(self.model, STABLE, [S, C], {STABLE: C})
        self._wait_label(STABLE, C, must=True)
        return self._advance(s, "promote_route", f"label stable -> {C}; version {S} stays loaded")

    def _promote_route(self, s: dict[str, Any]) -> dict[str, Any]:
        self.backend.set_canary_weight(0)
        watch = self._watch_stable(s["candidate"], "promotion")
        if watch["window"].get("error"):
            return self._begin_rollback(s, f"the window after promotion failed: {watch['window']['error']}",
                                        watch=watch)
        until = _now() + self.keep_previous_s
        return self._advance(s, "retain", f"all traffic on the stable servers, now version {s['candidate']}; version "
                             f"{s['stable']} stays loaded until {_stamp(until)} for an instant rollback",
                             retain_until=until, watch=watch)

    def _watch_stable(self, version: int, after: str) -> dict[str, Any]:
        """The window on the stable servers once all traffic is theirs (rollout/verify.py Verifier.stable_window):
        after a promotion it can roll the promoted version back; after a rollback it shows whether stable recovered."""
        try:
            verifier = self._verifier or self.verifier_factory()
        except UserError as e:  # golden rows that cannot be read must not stop a rollback from finishing
            window = {"verdict": "inconclusive", "inconclusive": f"no window: {e}"}
        else:
            self._verifier = verifier
            window = verifier.stable_window(version)
        self.log(f"window after {after}: {describe_stable_window(window)}")
        return {"after": after, "window": window}

    def _retain(self, s: dict[str, Any], retire_now: bool) -> dict[str, Any]:
        """Retires the previous version once its keep time is over (or now); else returns the state unchanged."""
        if s["retain_until"] > _now() and not retire_now:
            return s
        C = s["candidate"]
        self.backend.set_track(self.model, STABLE, [C], {STABLE: C})
        return self._finish(s, "promoted")

    def _begin_rollback(self, s: dict[str, Any], reason: str, figures: dict[str, Any] | None = None,
                        watch: dict[str, Any] | None = None) -> dict[str, Any]:
        # Where the rollback starts follows what the backend shows, not the phase: a controller stopped right after
        # writing a promotion phase's config left the candidate on the stable track before recording it, and one
        # stopped right after recording promote_load had not loaded it there yet (a label names a loaded version).
        C = s["candidate"]
        phase = "revert_label" if C in self.backend.track_config(self.model, STABLE)[0] else "rollback_route"
        _, canary_labels = self.backend.track_config(self.model, CANARY)
        changes: dict[str, Any] = {"reason": reason, "canary_label_at_rollback": canary_labels.get(CANARY)}
        if figures is not None:
            changes["figures"] = figures
        if watch is not None:
            changes["watch"] = watch
        state = {k: v for k, v in s.items() if k != "paused"}
        return self._advance(state, phase, f"ROLLING BACK version {C}: {reason}", **changes)

    def _revert_label(self, s: dict[str, Any]) -> dict[str, Any]:
        S, C = s["stable"], s["candidate"]
        if S not in self.backend.loaded_versions([S, C]):
            # Where a server serves one version (KubeDL), there is no label to move: the track goes back to S.
            versions, message = [S], f"the stable servers serve version {S} again"
        else:
            versions, message = [S, C], f"label stable -> {S} again (it was still loaded)"
            if S not in self.backend.track_config(self.model, STABLE)[0]:
                # Retired already (stopped after that write): TF Serving labels only a version it serves.
                self.backend.set_track(self.model, STABLE, versions, {STABLE: C})
                self._wait_loaded(STABLE, S, must=True)
                message = f"label stable -> {S} again (loaded again first)"
        self.backend.set_track(self.model, STABLE, versions, {STABLE: S})
        self._wait_label(STABLE, S, must=True)
        return self._advance(s, "revert_unload", message)

    def _revert_unload(self, s: dict[str, Any]) -> dict[str, Any]:
        S = s["stable"]
        self.backend.set_track(self.model, STABLE, [S], {STABLE: S})
        return self._advance(s, "rollback_route", f"version {s['candidate']} unloaded from the stable servers")

    def _rollback_route(self, s: dict[str, Any]) -> dict[str, Any]:
        self.backend.set_canary_weight(0)
        if self.backend.can_mirror():
            self.backend.set_shadow_percent(0)
        return self._advance(s, "rollback_canary_load", "all traffic on the stable servers")

    def _rollback_canary_load(self, s: dict[str, Any]) -> dict[str, Any]:
        S, C = s["stable"], s["candidate"]
        label = s.get("canary_label_at_rollback") or S
        versions = sorted({S, C, label})
        if S not in self.backend.loaded_versions(versions):  # one version per server (KubeDL): no label to keep
            versions, label = [S], S
        self.backend.set_track(self.model, CANARY, versions, {CANARY: label})
        self._wait_loaded(CANARY, S, must=True)
        return self._advance(s, "rollback_canary_label", f"version {S} is AVAILABLE on every canary server")

    def _rollback_canary_label(self, s: dict[str, Any]) -> dict[str, Any]:
        S = s["stable"]
        self.backend.set_track(self.model, CANARY, [S], {CANARY: S})
        self._wait_label(CANARY, S, must=True)
        return self._finish(s, "rolled_back", watch=self._watch_stable(S, "rollback"))

    def served_state(self) -> dict[str, Any]:
        """What the backend serves now: each track's versions and labels, and the canary's share of the traffic."""
        state: dict[str, Any] = {}
        for track in (STABLE, CANARY):
            versions, labels = self.backend.track_config(self.model, track)
            state[track] = {"versions": versions, "labels": labels}
        state["canary_weight"] = self.backend.canary_weight()
        return state

    def _finish(self, s: dict[str, Any], outcome: str, watch: dict[str, Any] | None = None) -> dict[str, Any]:
        self._fence()
        version = s["candidate"] if outcome == "promoted" else s["stable"]
        served = self.served_state()
        wanted = {STABLE: {"versions": [version], "labels": {STABLE: version}},
                  CANARY: {"versions": [version], "labels": {CANARY: version}}, "canary_weight": 0}
        if served != wanted:
            raise RolloutError(f"the backend does not show the {outcome.replace('_', ' ')} state "
                               f"({describe_served(served)}; wanted {describe_served(wanted)}); fix the servers and "
                               "run the same command again to resume.")
        message = f"{outcome.replace('_', ' ')}: {describe_served(served)}"
        if outcome == "rolled_back":
            message += f" ({s['reason']})"
        record = {**s, "phase": "done", "outcome": outcome, "finished_at": _stamp(_now()), "served": served,
                  "events": [*s["events"], {"at": _stamp(_now()), "phase": s["phase"], "next": "done",
                                            "message": message, **({"watch": watch} if watch else {})}]}
        self._commit(None, finished=record)
        self.log(message)
        self._write_report(record)
        return record

    def _write_report(self, record: dict[str, Any], only_if_missing: bool = False) -> None:
        """The page after the final commit: what it shows is recorded; a controller stopped in between writes it when
        the same command runs again."""
        if self.report_dir is None:
            return
        if only_if_missing:
            import tensorflow as tf

            if tf.io.gfile.exists(report_paths(self.report_dir, record)[1]):
                return
        self.log(f"report: {write_report(self.report_dir, record, metrics=self.backend.metrics)}")

    # Waiting for the servers

    def _wait(self, condition: Callable[[], tuple[bool, str]], must: bool) -> None:
        deadline = time.monotonic() + self.load_timeout_s
        while True:
            done, why = condition()
            if done:
                return
            if why.startswith("failed:") and not must:
                raise WaitFailed(why[len("failed:"):].strip())
            if time.monotonic() > deadline:
                if must:
                    raise RolloutError(f"the servers did not reach the state this step needs within "
                                       f"{self.load_timeout_s:.0f}s ({why}); fix them and run the same command again "
                                       "to resume.")
                raise WaitFailed(f"not AVAILABLE after {self.load_timeout_s:.0f}s ({why})")
            self.sleep(self.poll_s)
            # A rollout moved by someone else meanwhile is not waited for.
            self._fence()

    def _wait_loaded(self, track: str, version: int, must: bool = False) -> None:
        def condition() -> tuple[bool, str]:
            views = self.backend.version_views(self.model, track, version)
            failed = [v for v in views if v.state == "END" and v.error]
            if failed:
                return False, "failed: " + "; ".join(f"{v.server}: {v.error}" for v in failed)
            waiting = [f"{v.server} {v.state}" for v in views if v.state != "AVAILABLE"]
            return (bool(views) and not waiting), ", ".join(waiting) or "no server"

        self._wait(condition, must)

    def _wait_label(self, track: str, version: int, must: bool = False) -> None:
        if not self.backend.supports_labels:
            self._wait_loaded(track, version, must=must)
            return

        def condition() -> tuple[bool, str]:
            seen = self.backend.label_views(self.model, track, track)
            return (bool(seen) and all(v == version for v in seen)), f"label {track} answers {seen}"

        self._wait(condition, must)


def describe_served(served: dict[str, Any]) -> str:
    """One sentence part: what each track serves and the canary's traffic share, as read back."""
    tracks = []
    for track in (STABLE, CANARY):
        labels = ", ".join(f"{k} -> {v}" for k, v in sorted(served[track]["labels"].items())) or "no label"
        tracks.append(f"the {track} track serves {served[track]['versions']} ({labels})")
    return f"{' and '.join(tracks)}, {served['canary_weight']}% of the traffic on the canary"


def describe_stable_window(window: dict[str, Any]) -> str:
    """The window on the stable servers after the traffic moved there, in one line."""
    parts = []
    if "requests" in window:
        whose = "users'" if window.get("traffic") == "users" else "the verifier's"
        parts.append(f"{window['seconds']:g}s ({window['source']}, {whose} requests) of version {window['version']}: "
                     f"{window['requests']:.0f} requests, error rate {window['error_rate']:.4f}, p99 "
                     f"{window['p99_ms']:.1f} ms")
    if window.get("error"):
        parts.append(f"FAILED: {window['error']}")
    elif window.get("inconclusive"):
        parts.append(f"INCONCLUSIVE: {window['inconclusive']}")
    else:
        parts.append("passed")
    return "; ".join(parts)


def describe_figures(figures: dict[str, Any]) -> str:
    parts = []
    golden = figures.get("golden")
    if golden and "rows" in golden:
        decided = (f", decided otherwise on {golden['disagreements']}" if "disagreements" in golden else "")
        parts.append(f"golden {golden['rows']} rows max|diff| REST {golden['rest_max_abs_diff']:.2e} gRPC "
                     f"{golden['grpc_max_abs_diff']:.2e}{decided}")
    window = figures.get("window")
    if window and "requests" in window:
        whose = {"users": "users'", "verifier": "the verifier's"}.get(window.get("traffic"), "")
        whose = "copies of the users'" if window.get("source") == "shadow" else whose
        text = (f"window {window['seconds']}s ({window['source']}, {whose} requests) {window['requests']:.0f} "
                "requests, error rate "
                f"{window['error_rate']:.4f}, p99 {window['p99_ms']:.1f} ms")
        stable = window.get("stable")
        if stable and "requests" in stable:
            text += (f"; stable {stable['requests']:.0f} requests, error rate {stable['error_rate']:.4f}, p99 "
                     f"{stable['p99_ms']:.1f} ms")
        evidence = window.get("evidence")
        if evidence:
            text += (f"; users: the canary failed {evidence['canary_errors']} of {evidence['canary_requests']} "
                     f"(needs {evidence['needed']}), stable {evidence['stable_errors']} of "
                     f"{evidence['stable_requests']}")
        shadow = window.get("shadow")
        if shadow:
            text += (f"; shadow ({window['percent']}% of the users' requests copied): {shadow['pairs']} answered by "
                     f"both, {shadow['disagreements']} of {shadow['rows']} rows disagree "
                     f"({shadow['disagreement_rate']:.2%}), score distance {shadow['score_distance']:.4f}, p99 "
                     f"{shadow['candidate_p99_ms']:.1f} ms against stable's {shadow['stable_p99_ms']:.1f} ms")
        share = window.get("share") or {}
        if share.get("checked"):
            text += f"; canary share {share['observed']:.1%} of {share['user_requests']:.0f} user requests"
        parts.append(text)
    skew = figures.get("skew")
    if skew is not None:
        judged = [describe_feature(f) if f["flagged"] else f"{f['name']} {f['value']:.4f}"
                  for f in skew["features"] if f["flagged"] or f["value"] is not None]
        parts.append(f"skew of {skew['requests']} logged requests" + (f": {', '.join(judged)}" if judged else ""))
    inconclusive = [f["inconclusive"] for f in (window or {}, skew or {}) if f.get("inconclusive")]
    if figures.get("error"):
        parts.append(f"FAILED: {figures['error']}")
        causes = (window or golden or {}).get("causes")
        if causes is not None:
            parts.append(f"causes: {describe_causes(causes)}")
    elif inconclusive:
        parts.append(f"INCONCLUSIVE: {'; '.join(inconclusive)}")
    else:
        parts.append("passed")
    return "; ".join(parts)
