"""`mlops rollout status` prints the canary's share as the router applies it, read back, not the step's share."""
from __future__ import annotations

import json

from rollout.backends import LocalBackend
from rollout.cli import _print_status
from rollout.envoy import RouterError

ROLLOUT = {"id": "r1", "candidate": 2, "stable": 1, "steps": [10, 50], "step": 2, "events": []}


def routed(tmp_path, weight: int) -> LocalBackend:
    backend = LocalBackend(tmp_path, "taxi", {})
    backend.routes_path.parent.mkdir(parents=True, exist_ok=True)
    backend.routes_path.write_text(json.dumps({"canary": weight}))
    return backend


def status_line(capsys, document, backend) -> str:
    _print_status(document, None, backend)
    return capsys.readouterr().out.splitlines()[0]


def test_the_wait_after_promotion_shows_no_canary_traffic(tmp_path, capsys):
    line = status_line(capsys, {"current": {**ROLLOUT, "phase": "retain"}}, routed(tmp_path, 0))
    assert line == "rollout r1: version 2 over stable 1, phase retain, canary traffic 0%"


def test_a_step_shows_the_share_the_router_took(tmp_path, capsys):
    line = status_line(capsys, {"current": {**ROLLOUT, "phase": "verify"}}, routed(tmp_path, 50))
    assert line == "rollout r1: version 2 over stable 1, phase verify, canary traffic 50%"


def test_a_router_that_cannot_be_read_is_said_so(tmp_path, capsys):
    class Unreachable:
        def canary_weight(self) -> int:
            raise RouterError("Envoy's admin at 127.0.0.1:9901 does not answer")

    backend = LocalBackend(tmp_path, "taxi", {}, router=Unreachable())
    line = status_line(capsys, {"current": {**ROLLOUT, "phase": "verify", "paused": "2 inconclusive windows"}},
                       backend)
    assert line == ("rollout r1: version 2 over stable 1, phase verify, canary traffic unknown (Envoy's admin at "
                    "127.0.0.1:9901 does not answer), PAUSED: 2 inconclusive windows")


def test_no_rollout_reads_no_router(tmp_path, capsys):
    class Unreachable:
        def canary_weight(self) -> int:
            raise AssertionError("read without a rollout")

    _print_status({"current": None}, None, LocalBackend(tmp_path, "taxi", {}, router=Unreachable()))
    assert capsys.readouterr().out == "no rollout in progress\n"


def test_the_shadow_step_shows_the_share_copied_to_the_canary(tmp_path, capsys):
    class Mirroring:
        def canary_weight(self) -> int:
            return 0

        def shadow_percent(self) -> int:
            return 100

    backend = LocalBackend(tmp_path, "taxi", {}, router=Mirroring())
    line = status_line(capsys, {"current": {**ROLLOUT, "phase": "verify", "step": 0}}, backend)
    assert line == ("rollout r1: version 2 over stable 1, phase verify, canary traffic 0%, 100% of the requests "
                    "copied to it")
