"""`mlops monitor --retrain` with a fake pipeline run in place of run_local: a crossed threshold retrains and the
record and the page link the run's report; a window that crosses nothing, or too few requests, does not; a run that
is not blessed or fails is recorded with its reason (exit code 4 for a failure); the cooldown holds a second retrain
of the same version within its period and not after it."""
from __future__ import annotations

import json
import shutil
from datetime import timedelta
from pathlib import Path

import pytest

from monitoring import retrain as retraining
from monitoring.logs import now_utc
from monitoring.monitor import EXIT_CROSSED, Window, monitor
from monitoring.page import report_link
from monitoring.retrain import EXIT_RETRAIN_FAILED, retrain
from pipeline import cli
from pipeline.runner import PipelineError, run_report_dir
from pipeline.summary import RunSummary, write_report
from settings.config import ConfigError, load_config
from tests.browser import render
from tests.conftest import as_cli_flags
from tests.monitoring.conftest import MODEL
from tests.monitoring.test_monitor import T0, log, shifted
from tests.monitoring.test_monitor import overrides as monitor_overrides

RUN_ID = "2026-02-01T00:00:00.000001"


class FakeRun:
    """run_local's stand-in: prints a stage line, writes a run report as run_local does, returns its summary."""

    def __init__(self, outcome: str, version: int | None = None, reason: str = "") -> None:
        self.outcome, self.version, self.reason = outcome, version, reason
        self.configs = []

    def __call__(self, config, out):
        self.configs.append(config)
        print("  Trainer          done (fake)", file=out)
        if self.outcome == "failed":
            raise PipelineError("Trainer failed: out of memory; see the full log at /tmp/run.log")
        run_id = f"{RUN_ID}{len(self.configs)}"
        summary = RunSummary(run_id=run_id, blessed=self.outcome == "published", published_version=self.version,
                             published_new=self.outcome == "published", blessing_failure=self.reason,
                             pushed_path=f"{config.serving_base_dir}/{MODEL}/{self.version}" if self.version else None,
                             log_path="/tmp/run.log")
        write_report(summary, run_report_dir(config, run_id))
        return summary


@pytest.fixture
def root(taxi_run, tmp_path):
    """An output root of this test's own holding the fixture's model repository (version 1 with training data)."""
    shutil.copytree(taxi_run.config.serving_base_dir, tmp_path / "root" / "serving")
    return tmp_path / "root"


def overrides(taxi_run, tmp_path, root, *extra):
    return monitor_overrides(taxi_run, tmp_path, f"output_root={root}", *extra)


def judged(taxi_run, tmp_path, root, crossed=True, *extra):
    evaluation = taxi_run.splits["eval"]
    log(taxi_run, tmp_path, shifted(evaluation) if crossed else evaluation, 0, 0)
    config = load_config(None, overrides(taxi_run, tmp_path, root, *extra))
    return config, monitor(config, Window(last=1000), now=T0 + timedelta(hours=1))


def test_a_crossed_threshold_retrains_and_the_record_and_page_link_the_run(taxi_run, tmp_path, root, capsys):
    config, result = judged(taxi_run, tmp_path, root)
    run = FakeRun("published", version=2)
    retrained = retrain(config, result, run=run)
    assert run.configs == [config] and retrained.exit_code == EXIT_CROSSED
    record = json.loads((Path(result.folder) / "monitor.json").read_text())
    entry = record["retrain"]
    report = root / "runs" / f"{RUN_ID}1" / "summary.html"
    assert entry["started"] and entry["outcome"] == "published" and entry["published_version"] == 2
    assert entry["run_id"] == f"{RUN_ID}1" and entry["report"] == str(report) and entry["data_path"] == config.data.path
    assert entry["note"] == "published version 2 (`mlops rollout start --version 2` moves traffic to it)"
    assert entry["started_at"] <= entry["finished_at"]
    out = capsys.readouterr().out
    assert "retraining: 2 feature(s) flagged on version 1; running the pipeline on" in out
    assert "Trainer          done (fake)" in out
    rendered = render(Path(result.folder) / "monitor.html")
    assert rendered.console == []
    assert "published version 2 (`mlops rollout start --version 2` moves traffic to it)." in rendered.dom
    page = (Path(result.folder) / "monitor.html").read_text()
    href = report_link(str(Path(result.folder) / "monitor.html"), str(report))
    assert href.startswith("../../../root/runs/") and f"<a href='{href}'>" in page
    assert (Path(result.folder) / href.replace("%3A", ":")).resolve() == report


@pytest.mark.parametrize("crossed, note", [(False, "not retrained: no threshold crossed"),
                                           (True, "not retrained: the window was not judged (too few requests)")])
def test_a_window_that_crosses_nothing_or_is_not_judged_does_not_retrain(taxi_run, tmp_path, root, capsys, crossed,
                                                                        note, monkeypatch):
    evaluation = taxi_run.splits["eval"]
    log(taxi_run, tmp_path, shifted(evaluation) if crossed else evaluation, 0, 0)
    minimum = 100 if not crossed else 10 * len(evaluation)
    run = FakeRun("published", version=2)
    monkeypatch.setattr(retraining, "_run_local", run)
    flags = as_cli_flags(overrides(taxi_run, tmp_path, root, f"monitoring.min_requests={minimum}"))
    code = cli.main(["monitor", *flags, "--last", "1000", "--retrain"])
    assert code == 0 and run.configs == []
    [folder] = (tmp_path / "out" / MODEL).iterdir()
    record = json.loads((folder / "monitor.json").read_text())
    assert record["retrain"] == {"started": False, "outcome": "not needed", "note": note}
    out = capsys.readouterr().out
    assert out.endswith(f"output folder: {folder}\nretrain: {note}\n")
    assert note in (folder / "monitor.html").read_text()
    assert not (root / "runs").exists()


def test_without_retrain_the_record_says_none_and_nothing_runs(taxi_run, tmp_path, root, monkeypatch):
    log(taxi_run, tmp_path, shifted(taxi_run.splits["eval"]), 0, 0)
    run = FakeRun("published", version=2)
    monkeypatch.setattr(retraining, "_run_local", run)
    assert cli.main(["monitor", *as_cli_flags(overrides(taxi_run, tmp_path, root)), "--last", "1000"]) == 3
    [folder] = (tmp_path / "out" / MODEL).iterdir()
    assert json.loads((folder / "monitor.json").read_text())["retrain"] is None and run.configs == []


def test_a_run_that_is_not_blessed_is_recorded_with_its_reason(taxi_run, tmp_path, root, monkeypatch, capsys):
    log(taxi_run, tmp_path, shifted(taxi_run.splits["eval"]), 0, 0)
    reason = "auc 0.6100 is below evaluation.lower_bound (0.7000)"
    monkeypatch.setattr(retraining, "_run_local", FakeRun("not blessed", reason=reason))
    code = cli.main(["monitor", *as_cli_flags(overrides(taxi_run, tmp_path, root)), "--last", "1000", "--retrain"])
    assert code == EXIT_CROSSED
    [folder] = (tmp_path / "out" / MODEL).iterdir()
    entry = json.loads((folder / "monitor.json").read_text())["retrain"]
    assert (entry["outcome"], entry["reason"], entry["published_version"]) == ("not blessed", reason, None)
    out = capsys.readouterr().out
    assert f"\nretrain: not blessed, nothing published: {reason}\n  run         {RUN_ID}1 (started " in out
    assert f"  run report  {root}/runs/{RUN_ID}1/summary.html\n" in out
    assert f"not blessed, nothing published: {reason}." in (folder / "monitor.html").read_text()


def test_a_failing_run_is_recorded_with_its_error_and_exits_4(taxi_run, tmp_path, root, monkeypatch, capsys):
    log(taxi_run, tmp_path, shifted(taxi_run.splits["eval"]), 0, 0)
    monkeypatch.setattr(retraining, "_run_local", FakeRun("failed"))
    code = cli.main(["monitor", *as_cli_flags(overrides(taxi_run, tmp_path, root)), "--last", "1000", "--retrain"])
    assert code == EXIT_RETRAIN_FAILED == 4
    [folder] = (tmp_path / "out" / MODEL).iterdir()
    record = json.loads((folder / "monitor.json").read_text())
    error = "Trainer failed: out of memory; see the full log at /tmp/run.log"
    assert record["retrain"]["outcome"] == "failed" and record["retrain"]["error"] == error
    assert record["exit_code"] == 3, "the judgement itself stays the window's"
    assert "report" not in record["retrain"] and record["retrain"]["finished_at"]
    captured = capsys.readouterr()
    assert captured.err == f"error: the retraining run failed: {error}\n"
    assert "retrain:" not in captured.out
    assert f"<span class='bad'>{error}</span>" in (folder / "monitor.html").read_text()


def test_the_cooldown_holds_a_second_retrain_of_the_same_version_within_its_period(taxi_run, tmp_path, root):
    config, first = judged(taxi_run, tmp_path, root, True, "monitoring.retrain_cooldown_hours=6")
    run = FakeRun("published", version=2)
    retrain(config, first, run=run)
    second = monitor(config, Window(last=1000), now=T0 + timedelta(hours=1))
    held = retrain(config, second, run=run, now=now_utc() + timedelta(hours=5, minutes=59))
    assert len(run.configs) == 1 and held.exit_code == EXIT_CROSSED
    entry = held.record["retrain"]
    assert entry["outcome"] == "skipped" and not entry["started"]
    assert entry["earlier_record"] == first.record["files"]["json"]
    assert entry["note"] == (f"not retrained: the monitor run of {first.record['finished_at']} started a "
                                    f"retrain for version 1 at {first.record['retrain']['started_at']} (published "
                                    "version 2), within monitoring.retrain_cooldown_hours (6)")
    # After the period, the same crossing retrains again; a skipped run does not restart the period.
    third = monitor(config, Window(last=1000), now=T0 + timedelta(hours=1))
    retrain(config, third, run=run, now=now_utc() + timedelta(hours=6, minutes=1))
    assert len(run.configs) == 2 and third.record["retrain"]["outcome"] == "published"


def test_the_cooldown_is_per_serving_version_and_0_turns_it_off(taxi_run, tmp_path, root):
    config, first = judged(taxi_run, tmp_path, root, True, "monitoring.retrain_cooldown_hours=0")
    run = FakeRun("published", version=2)
    retrain(config, first, run=run)
    retrain(config, monitor(config, Window(last=1000), now=T0 + timedelta(hours=1)), run=run)
    assert len(run.configs) == 2
    # A record of another version does not hold this one's retrain.
    config = load_config(None, overrides(taxi_run, tmp_path, root))
    other = Path(first.folder) / "monitor.json"
    record = json.loads(other.read_text())
    other.write_text(json.dumps({**record, "version": 7}))
    for folder in (tmp_path / "out" / MODEL).iterdir():
        if folder != Path(first.folder):
            shutil.rmtree(folder)
    retrain(config, monitor(config, Window(last=1000), now=T0 + timedelta(hours=1)), run=run)
    assert len(run.configs) == 3


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_bad_cooldown_is_a_config_error(value):
    with pytest.raises(ConfigError, match=r"monitoring.retrain_cooldown_hours is .*; set 0 \(every crossing "
                                          r"retrains\) or a positive number of hours, e.g. 24."):
        load_config(None, [f"monitoring.retrain_cooldown_hours={value}"])


def test_the_report_link_is_relative_in_one_tree_and_a_file_uri_otherwise():
    assert report_link("/data/monitoring/taxi/20260201T000000Z/monitor.html",
                       "/data/runs/2026-02-01T00:00:00/summary.html") == \
        "../../../runs/2026-02-01T00:00:00/summary.html"
    assert report_link("/data/monitoring/monitor.html", "/data/monitoring/runs/a b/summary.html") == \
        "./runs/a%20b/summary.html"
    assert report_link("/srv/monitoring/monitor.html", "/data/runs/1/summary.html") == \
        "file:///data/runs/1/summary.html"
    assert report_link("gs://bucket/monitoring/taxi/1/monitor.html", "/data/runs/1/summary.html") == \
        "file:///data/runs/1/summary.html"
