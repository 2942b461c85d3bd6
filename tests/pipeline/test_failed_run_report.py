"""A run that fails still writes its run report: what failed, in which stage, the sentence that says what to do, and
the log; the index of runs lists it as failed (test_preflight.py checks the same for a run stopped before TFX)."""
import io
import json
from pathlib import Path

from pipeline.runner import PipelineError, failure_report
from settings.config import load_config


def test_a_stage_failure_is_reported_with_its_stage_sentence_and_log(tmp_path):
    config = load_config(None, [f"output_root={tmp_path}"])
    error = PipelineError("Trainer failed: <loss is NaN>; see the full log at /logs/run.log")
    out = io.StringIO()
    state = {"stage": "Trainer", "log_path": "/logs/run.log", "tfx": False}
    html_path = Path(failure_report(config, error, state, out))
    assert out.getvalue() == f"report of the failed run: {html_path}\n"
    summary = json.loads((html_path.parent / "summary.json").read_text())
    assert (summary["failed_stage"], summary["failure"], summary["log_path"]) == (
        "Trainer", "error: Trainer failed: <loss is NaN>; see the full log at /logs/run.log", "/logs/run.log")
    page = html_path.read_text()
    assert "<h2>The run failed in Trainer</h2>" in page
    assert "error: Trainer failed: &lt;loss is NaN&gt;; see the full log at /logs/run.log" in page
    assert "failed in Trainer" in (html_path.parent.parent / "index.html").read_text()
