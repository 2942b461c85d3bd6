"""The local backend for real: `mlops serve` processes for the stable and canary tracks, a client thread on the
stable server throughout. A good version is promoted; a disagreeing one and one that fails to load are rolled back;
TF Serving's label and unversioned-request rules hold; a controller SIGKILLed at every step finishes the same way."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from rollout.backends import LocalBackend
from rollout.factory import build_backend, build_controller
from serving.repository.local import ModelRepository
from settings.config import load_config
from tests.rollout.conftest import MODEL, REPO_ROOT, overrides

pytestmark = pytest.mark.timeout(600)


class RuleCheckingBackend(LocalBackend):
    """Fails the test when a config write would point a label at a version not AVAILABLE on every server of that
    track (TF Serving refuses such a label on a reload)."""

    def set_track(self, model, track, versions, labels):
        _, current = self.track_config(model, track)
        for label, version in labels.items():
            if current.get(label) == version:
                continue
            views = self.version_views(model, track, version)
            assert views and all(v.state == "AVAILABLE" for v in views), (
                f"label {label} -> {version} written on the {track} track while its servers say {views}")
        super().set_track(model, track, versions, labels)


def controller_for(fleet, *extra, log=None):
    config = load_config(None, overrides(fleet, *extra))
    plain = build_backend(config)
    backend = RuleCheckingBackend(plain.base_dir, MODEL, plain._endpoints, plain.timeout_s)
    lines = []
    controller = build_controller(config, backend, log=lines.append)
    return controller, backend, lines


def tracks(fleet):
    return {track: (ModelRepository.for_track(fleet["base"], track).served_versions(MODEL),
                    ModelRepository.for_track(fleet["base"], track).labels(MODEL)) for track in ("stable", "canary")}


def unversioned_answers_since(fleet, mark):
    return set(fleet["client"].unversioned_answers[mark:])


def test_a_disagreeing_version_is_rolled_back_and_stable_is_never_touched(fleet):
    controller, backend, lines = controller_for(fleet)
    mark = len(fleet["client"].unversioned_answers)
    before = ModelRepository(fleet["base"]).config_path.read_bytes()
    record = controller.start(3)
    print("\n".join(lines))
    assert record["outcome"] == "rolled_back"
    assert "disagrees with stable 1" in record["reason"]
    [verification] = [e["figures"] for e in record["events"] if "figures" in e]
    assert verification["golden"]["rest_max_abs_diff"] > 0.5 and verification["golden"]["grpc_max_abs_diff"] > 0.5
    assert tracks(fleet) == {"stable": ([1], {"stable": 1}), "canary": ([1], {"canary": 1})}
    assert ModelRepository(fleet["base"]).config_path.read_bytes() == before, "the stable config is never written"
    assert backend.canary_weight() == 0
    # The candidate was loaded on the canary track only: no unversioned request to the stable server reached it.
    assert unversioned_answers_since(fleet, mark) == {1}
    assert not fleet["client"].failures


def test_a_version_that_fails_to_load_is_rolled_back(fleet):
    controller, backend, lines = controller_for(fleet)
    record = controller.start(4)
    print("\n".join(lines))
    assert record["outcome"] == "rolled_back"
    assert "did not load on the canary servers" in record["reason"]
    assert [e for e in record["events"] if "figures" in e] == [], "nothing is verified or routed to it"
    assert tracks(fleet) == {"stable": ([1], {"stable": 1}), "canary": ([1], {"canary": 1})}
    assert backend.canary_weight() == 0
    assert not fleet["client"].failures


def test_a_good_version_is_verified_step_by_step_and_promoted(fleet):
    controller, backend, lines = controller_for(fleet)
    mark = len(fleet["client"].labelled_answers)
    record = controller.start(2)
    print("\n".join(lines))
    assert record["outcome"] == "promoted"
    verifications = [e["figures"] for e in record["events"] if "figures" in e]
    assert [v["weight"] for v in verifications] == [0, 50, 100]
    for figures in verifications:
        assert 0 < figures["golden"]["rest_max_abs_diff"] <= 1e-3
        assert figures["golden"]["rest_grpc_max_abs_diff"] < 1e-6
        assert figures["window"]["requests"] >= 2 and figures["window"]["error_rate"] == 0
    assert tracks(fleet) == {"stable": ([2], {"stable": 2}), "canary": ([2], {"canary": 2})}
    assert backend.canary_weight() == 0
    # Label `stable` answered 1, then 2 from the moment the label moved; never anything else.
    answers = fleet["client"].labelled_answers[mark:]
    switch = answers.index(2) if 2 in answers else len(answers)
    assert set(answers[:switch]) <= {1} and set(answers[switch:]) <= {2}
    assert not fleet["client"].failures
    history = controller.document()["history"]
    assert [h["outcome"] for h in history] == ["rolled_back", "rolled_back", "promoted"]
    # The outcome as a page beside the JSON: each verification's figures against the limits, and the steps.
    folder = fleet["base"] / ".rollouts"
    assert json.loads((folder / f"{MODEL}-v2-{record['id']}.json").read_text()) == history[-1]
    page = (folder / f"{MODEL}-v2-{record['id']}.html").read_text()
    # Three verifications and the window after promotion: the verifier's requests to version 2 on the stable servers
    # (no metrics source here).
    [watch] = [e["watch"] for e in record["events"] if "watch" in e]
    assert (watch["after"], watch["window"]["source"], watch["window"]["version"]) == ("promotion", "verifier", 2)
    assert watch["window"]["verdict"] == "passed" and watch["window"]["requests"] >= 2
    assert "PROMOTED" in page and page.count("<td class='passed'>passed</td>") == 4 and "<svg" in page
    assert f"{verifications[1]['golden']['rest_max_abs_diff']:.6f}" in page and "max_abs_diff" in page
    assert "<script" not in page and "http" not in page.split("<svg", 1)[0], "self-contained"


def test_a_manual_rollback_right_after_promotion_needs_no_load(fleet):
    controller, backend, lines = controller_for(fleet, "rollout.keep_previous_seconds=600")
    record = controller.start(5, wait_retain=False)
    assert record["phase"] == "retain"
    assert tracks(fleet)["stable"] == ([2, 5], {"stable": 5}), "the previous version stays loaded"
    record = controller.rollback()
    print("\n".join(lines))
    assert record["outcome"] == "rolled_back" and record["reason"] == "asked for by hand"
    assert tracks(fleet) == {"stable": ([2], {"stable": 2}), "canary": ([2], {"canary": 2})}
    assert not fleet["client"].failures


def _phase_key(state_path):
    try:
        current = json.loads(state_path.read_text()).get("current")
    except (OSError, ValueError):
        return None
    return None if current is None else (current["phase"], current["step"])


def test_a_controller_killed_at_every_step_finishes_the_same_way(fleet):
    """SIGKILL or SIGTERM (in turn) right after each phase is recorded, restart, until a run finishes: the end state
    and the recorded steps are those of an uninterrupted rollout. A SIGTERM'd controller (a deleted or evicted pod)
    unwinds, releasing its lock, and exits 143 saying how to resume."""
    state_path = fleet["base"] / ".rollouts" / f"{MODEL}.json"
    command = [sys.executable, "-m", "pipeline.cli", "rollout", "start", "--version", "6"]
    for override in overrides(fleet):
        command += ["--set", override]
    seen, kills, code = set(), [], None
    for _ in range(20):
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        seen.add(_phase_key(state_path))
        while process.poll() is None:
            key = _phase_key(state_path)
            if key not in seen:
                terminate = len(kills) % 2 == 1
                os.kill(process.pid, signal.SIGTERM if terminate else signal.SIGKILL)
                process.wait()
                if terminate:
                    output = process.stdout.read()
                    assert process.returncode == 143 and "stopped by SIGTERM" in output, (process.returncode, output)
                else:
                    assert process.returncode == -signal.SIGKILL
                seen.add(key)
                kills.append(key)
                break
            time.sleep(0.005)
        else:
            code = process.returncode
            print(process.stdout.read())
            break
        process.stdout.close()
    print("killed at", kills)
    assert code == 0
    assert len(kills) >= 6, f"the controller should have been killed at most of its steps, was at {kills}"
    [record] = [h for h in json.loads(state_path.read_text())["history"] if h["candidate"] == 6]
    assert record["outcome"] == "promoted"
    transitions = [(e["phase"], e["next"]) for e in record["events"]]
    assert transitions == [("start", "load"), ("load", "label"), ("label", "verify"), ("verify", "verify"),
                           ("verify", "verify"), ("verify", "promote_load"), ("promote_load", "promote_label"),
                           ("promote_label", "promote_route"), ("promote_route", "retain"), ("retain", "done")]
    assert tracks(fleet) == {"stable": ([6], {"stable": 6}), "canary": ([6], {"canary": 6})}
    assert LocalBackend(fleet["base"], MODEL, {}).canary_weight() == 0
    assert not fleet["client"].failures
    print(f"client requests to the stable server during the rollout tests: {fleet['client'].requests}, "
          f"failed: {len(fleet['client'].failures)}")


def _cli(fleet, *argv: str) -> int:
    from pipeline.cli import build_parser
    from settings.arguments import run_command

    return run_command(build_parser().parse_args([*argv, *[a for o in overrides(fleet) for a in ("--set", o)]]))


def _alter_a_published_file(fleet, version: int) -> str:
    data = next((ModelRepository(fleet["base"]).version_dir(MODEL, version) / "variables").glob("variables.data-*"))
    with open(data, "ab") as f:
        f.write(b"\0")
    return f"variables/{data.name}: changed"


def test_a_version_whose_files_changed_after_publishing_is_refused(fleet, tiny_versions, capsys):
    ModelRepository(fleet["base"]).add_version(MODEL, tiny_versions[5], version=7)
    problem = _alter_a_published_file(fleet, 7)
    before = tracks(fleet), controller_for(fleet)[0].document()
    capsys.readouterr()
    assert _cli(fleet, "rollout", "start", "--version", "7") == 2
    error = capsys.readouterr().err.strip()
    assert error == (f"error: version 7 of 'tiny' does not match its checksum manifest ({problem}); publish it "
                     "again as a new version.")
    assert (tracks(fleet), controller_for(fleet)[0].document()) == before, "nothing was loaded or recorded"
    assert _cli(fleet, "versions", "--json") == 0
    [row] = [r for r in json.loads(capsys.readouterr().out) if r["version"] == 7]
    assert row["checksums"] == "MISMATCH" and row["checksum_problems"] == [problem] and row["served_by"] == []
    assert _cli(fleet, "versions") == 0
    table = capsys.readouterr().out
    assert any(line.split()[:1] == ["7"] and "MISMATCH" in line for line in table.splitlines())
    assert f"! {problem}" in table


def test_a_version_altered_during_its_rollout_is_rolled_back(fleet, tiny_versions):
    ModelRepository(fleet["base"]).add_version(MODEL, tiny_versions[5], version=8)
    lines: list[str] = []
    problems: list[str] = []

    def log(line: str) -> None:
        lines.append(line)
        if "version 8 is AVAILABLE on every canary server" in line:  # loaded, before the first verification
            problems.append(_alter_a_published_file(fleet, 8))

    controller = build_controller(load_config(None, overrides(fleet)), log=log)
    stable = tracks(fleet)["stable"]
    record = controller.start(8)
    print("\n".join(lines))
    assert record["outcome"] == "rolled_back"
    assert record["reason"] == (f"version 8 of 'tiny' does not match its checksum manifest ({problems[0]}); publish "
                                "it again as a new version.")
    assert [e for e in record["events"] if "figures" in e] == [], "no traffic step was taken"
    assert tracks(fleet) == {"stable": stable, "canary": (stable[0], {"canary": stable[0][0]})}
    page = (fleet["base"] / ".rollouts" / f"{MODEL}-v8-{record['id']}.html").read_text()
    assert "ROLLED BACK" in page and "does not match its checksum manifest" in page
    assert not fleet["client"].failures
