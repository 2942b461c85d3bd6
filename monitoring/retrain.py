"""`mlops monitor --retrain`: when the judged window crosses a threshold, the pipeline runs on the config's data path
(pipeline/runner.run_local, the run `mlops run` makes, with the same config and overrides), and the monitor record
gains a `retrain` entry read back from the run's report: published version N, nothing new, not blessed (and why) or
failed (and the error). The new version goes through the pipeline's usual blessing, and its rollout stays
`mlops rollout start`.

The loop guard: no retrain when a monitor run of the last monitoring.retrain_cooldown_hours already started one for the
same serving version (read from the monitor records beside this one), since until the new version serves, the same
traffic crosses the same threshold at every scheduled run.
"""
from __future__ import annotations

import json
import os
import posixpath
import sys
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, TextIO

from monitoring import logs
from monitoring.monitor import RECORD_FILE, MonitorResult, rewrite_record
from settings.config import PipelineConfig
from settings.files import RUN_REPORT_HTML, RUN_SUMMARY_JSON

if TYPE_CHECKING:
    from pipeline.summary import RunSummary

# `mlops monitor --retrain` exits 4 when a threshold was crossed and the retraining run failed (an error, or the
# data-validation gate stopped it); a run that was not blessed is the usual blessing at work, so that keeps 3.
EXIT_RETRAIN_FAILED = 4
# Monitor folders are named by the time their run finished (monitoring/monitor.py, _output_folder).
FOLDER_TIME = "%Y%m%dT%H%M%SZ"

# What runs the pipeline: run_local's signature, so that a test passes a fake one.
RunPipeline = Callable[[PipelineConfig, TextIO], "RunSummary"]


def _run_local(config: PipelineConfig, out: TextIO) -> RunSummary:
    from pipeline.runner import run_local

    return run_local(config, out=out)


def _folder_time(name: str) -> datetime | None:
    try:
        # A second run within the same second gets "-2": the time is the first 16 characters.
        return datetime.strptime(name[:16], FOLDER_TIME).replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def earlier_retrain(config: PipelineConfig, version: int, this_folder: str, now: datetime) -> dict[str, Any] | None:
    """The record of the newest monitor run that finished within monitoring.retrain_cooldown_hours before `now` and
    started a retrain for `version` (None: none did, or the cooldown is 0)."""
    import tensorflow as tf

    hours = config.monitoring.retrain_cooldown_hours
    base = posixpath.join(config.monitoring_dir, config.model_name)
    if hours <= 0 or not tf.io.gfile.isdir(base):
        return None
    earliest = now - timedelta(hours=hours)
    for name in sorted((n.rstrip("/") for n in tf.io.gfile.listdir(base)), reverse=True):
        finished = _folder_time(name)
        folder = posixpath.join(base, name)
        if finished is None or folder == this_folder.rstrip("/"):
            continue
        if finished < earliest:
            break
        try:
            with tf.io.gfile.GFile(posixpath.join(folder, RECORD_FILE)) as f:
                record = json.load(f)
        except (OSError, ValueError, tf.errors.OpError):
            continue  # a folder being written, or not a monitor run's
        retrain = record.get("retrain") or {}
        if record.get("version") == version and retrain.get("started"):
            return record
    return None


def _outcome(report: dict[str, Any]) -> dict[str, Any]:
    """What a finished run did, from its summary.json."""
    version = report.get("published_version")
    if version is not None and report.get("published_new"):
        labels = report.get("published_labels") or []
        then = ("it is labelled stable: it serves without a rollout" if "stable" in labels
                else f"`mlops rollout start --version {version}` moves traffic to it")
        return {"outcome": "published", "published_version": version, "pushed_path": report.get("pushed_path"),
                "note": f"published version {version} ({then})"}
    if version is not None:
        return {"outcome": "nothing new", "published_version": version, "pushed_path": report.get("pushed_path"),
                "note": f"nothing new: version {version} already holds this model (the same data, config and code "
                        "as an earlier run)"}
    reason = report.get("blessing_failure") or (
        "the Evaluator did not bless the model" if report.get("blessed") is False else
        "nothing was published")
    return {"outcome": "not blessed", "published_version": None, "reason": reason,
            "note": f"not blessed, nothing published: {reason}"}


def retrain(config: PipelineConfig, result: MonitorResult, run: RunPipeline | None = None,
            now: datetime | None = None, out: TextIO | None = None) -> MonitorResult:
    """Runs the pipeline when `result`'s window crossed a threshold and no earlier retrain for its version is within
    the cooldown; writes the `retrain` entry into the record and the page, and returns the result with exit code
    EXIT_RETRAIN_FAILED when the run failed."""
    from components.gates.anomalies import DataValidationError
    from pipeline.data import DataError
    from pipeline.runner import PipelineError, run_report_dir

    run = run or _run_local
    out = out or sys.stdout
    now = now or logs.now_utc()
    record = result.record
    entry: dict[str, Any] = {"started": False}
    if not record["judged"]:
        entry.update(outcome="not needed", note="not retrained: the window was not judged (too few requests)")
    elif not record["flagged"]:
        entry.update(outcome="not needed", note="not retrained: no threshold crossed")
    else:
        earlier = earlier_retrain(config, record["version"], result.folder, now)
        if earlier is not None:
            before = earlier["retrain"]
            then = before.get("outcome") or "started"
            if before.get("published_version") is not None:
                then += f" version {before['published_version']}"
            entry.update(outcome="skipped", earlier_record=earlier["files"]["json"],
                         note=f"not retrained: the monitor run of {earlier['finished_at']} started a retrain for "
                              f"version {record['version']} at {before.get('started_at')} ({then}), within "
                              f"monitoring.retrain_cooldown_hours ({config.monitoring.retrain_cooldown_hours:g})")
    if entry.get("outcome"):
        record["retrain"] = entry
        rewrite_record(record)
        return result

    # Recorded before the run: a monitor run that starts while this one trains, or after it was killed, sees it.
    entry.update(started=True, outcome="running", started_at=logs.utc_text(logs.now_utc()),
                 data_path=config.data.path, note="the pipeline is running")
    record["retrain"] = entry
    rewrite_record(record)
    print(f"\nretraining: {len(record['flagged'])} feature(s) flagged on version {record['version']}; running the "
          f"pipeline on {config.data.path}", file=out, flush=True)
    code = result.exit_code
    try:
        summary = run(config, out)
    except (DataError, DataValidationError, PipelineError) as error:
        stopped = "stopped by the data-validation gate: " if isinstance(error, DataValidationError) else ""
        entry.update(outcome="failed", error=f"{stopped}{error}", note=f"the retraining run failed: {stopped}{error}")
        code = EXIT_RETRAIN_FAILED
    except BaseException as error:
        entry.update(outcome="failed", error=f"{type(error).__name__}: {error}",
                     note=f"the retraining run failed: {type(error).__name__}: {error}")
        entry["finished_at"] = logs.utc_text(logs.now_utc())
        rewrite_record(record)
        raise
    else:
        folder = run_report_dir(config, summary.run_id)
        report_json = os.path.abspath(os.path.join(folder, RUN_SUMMARY_JSON))
        # What the record says the run did is read back from the report the run wrote.
        with open(report_json) as f:
            report = json.load(f)
        entry.update(run_id=report["run_id"], report=os.path.abspath(os.path.join(folder, RUN_REPORT_HTML)),
                     report_json=report_json, log=report.get("log_path") or None, **_outcome(report))
    entry["finished_at"] = logs.utc_text(logs.now_utc())
    rewrite_record(record)
    return MonitorResult(record, result.folder, code, result.push_error)
