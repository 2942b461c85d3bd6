"""A run that fails still writes its run report: what failed, in which stage, the sentence that says what to do, and
the log; the index of runs lists it as failed (test_preflight.py checks the same for a run stopped before TFX)."""
import io
import json
from pathlib import Path

from pipeline.runner import PipelineError, failure_report, stage_failure
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


def test_the_stages_that_ran_before_the_failure_keep_their_times(tmp_path):
    config = load_config(None, [f"output_root={tmp_path}"])
    state = {"stage": "Trainer", "log_path": "/logs/run.log", "tfx": False,
             "stage_seconds": {"CsvExampleGen": 2.5, "StatisticsGen": 1.25}, "elapsed_seconds": 6.9}
    html_path = Path(failure_report(config, PipelineError("Trainer failed: x"), state, io.StringIO()))
    summary = json.loads((html_path.parent / "summary.json").read_text())
    assert summary["stage_seconds"] == {"CsvExampleGen": 2.5, "StatisticsGen": 1.25}
    assert summary["elapsed_seconds"] == 6.9
    page = html_path.read_text()
    assert "6.9s" in page and "No stage timings were recorded" not in page


def test_a_stage_failure_reads_as_one_sentence():
    reason = "the label column 'species' holds 1 class(es) in the training split; a multiclass label needs at least 2."
    assert stage_failure("Trainer", reason, "", "/logs/run.log") == (
        "Trainer failed: the label column 'species' holds 1 class(es) in the training split; a multiclass label needs "
        "at least 2; see the full log at /logs/run.log")
    assert stage_failure("Exporter", "tfjs differs ", " (and the Evaluator did not bless this model: auc)", "/l") == (
        "Exporter failed: tfjs differs (and the Evaluator did not bless this model: auc); see the full log at /l")
