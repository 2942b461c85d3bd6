"""`mlops monitor --retrain` for real: shifted traffic logged against version 1 crosses the thresholds, the whole
pipeline runs on the 2,000-row taxi slice (the small config of tests/conftest.py), its model is blessed and published
as version 2, and the monitor record, its page and the console name that run and link its report."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from pipeline import cli
from serving.repository.factory import open_repository
from tests.browser import render
from tests.conftest import as_cli_flags
from tests.monitoring.conftest import MODEL
from tests.monitoring.test_monitor import log, shifted
from tests.monitoring.test_monitor import overrides as monitor_overrides


def test_shifted_traffic_retrains_and_publishes_a_new_version(taxi_run, tmp_path, capsys):
    root = tmp_path / "root"
    shutil.copytree(taxi_run.config.serving_base_dir, root / "serving")
    log(taxi_run, tmp_path, shifted(taxi_run.splits["eval"]), 0, 0)
    flags = as_cli_flags(monitor_overrides(taxi_run, tmp_path, f"output_root={root}"))
    code = cli.main(["monitor", *flags, "--last", "1000", "--retrain"])
    captured = capsys.readouterr()
    # The console, for the test report (pytest -rP) and a failure's context.
    print(captured.out)
    assert code == 3, captured.err
    [folder] = (tmp_path / "out" / MODEL).iterdir()
    record = json.loads((folder / "monitor.json").read_text())
    entry = record["retrain"]
    assert (entry["outcome"], entry["published_version"]) == ("published", 2), entry
    report = json.loads(Path(entry["report_json"]).read_text())
    assert report["run_id"] == entry["run_id"] and report["published_version"] == 2 and report["blessed"] is True
    assert Path(entry["report"]) == root / "runs" / entry["run_id"] / "summary.html"
    assert 2 in open_repository(str(root / "serving")).versions(MODEL)
    out = captured.out
    # Progress as `mlops run` shows it, then its summary, then the monitor's line read back from the record.
    assert "retraining: 2 feature(s) flagged on version 1; running the pipeline on" in out
    assert f"pipeline '{taxi_run.config.name}':" in out and "  published     version 2 at " in out
    assert out.rstrip().endswith(f"  run report  {entry['report']}\n  record      {folder}/monitor.json")
    assert "\nretrain: published version 2 (`mlops rollout start --version 2` moves traffic to it)\n" in out
    rendered = render(folder / "monitor.html")
    assert rendered.console == [] and "Retraining" in rendered.dom and entry["run_id"] in rendered.dom
