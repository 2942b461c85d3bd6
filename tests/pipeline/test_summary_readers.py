"""What the run report reads: TFDV statistics (missing share, distribution, drift), calibration.json, the history."""
import pytest
from tensorflow_metadata.proto.v0 import statistics_pb2

from components.model import BINARY
from pipeline.summary import drift, feature_summary
from reports.records import CalibrationFigures, CalibrationRecord, ExportReport, ExportTask


def dataset() -> statistics_pb2.DatasetFeatureStatistics:
    stats = statistics_pb2.DatasetFeatureStatistics(num_examples=100)
    fare = stats.features.add(type=statistics_pb2.FeatureNameStatistics.FLOAT)
    fare.path.step.append("fare")
    fare.num_stats.common_stats.tot_num_values = 90
    fare.num_stats.mean, fare.num_stats.std_dev, fare.num_stats.min, fare.num_stats.max = 10.0, 2.0, 1.0, 30.0
    histogram = fare.num_stats.histograms.add(type=statistics_pb2.Histogram.STANDARD)
    for count in (10.0, 50.0, 30.0):
        histogram.buckets.add(sample_count=count)
    company = stats.features.add(type=statistics_pb2.FeatureNameStatistics.STRING)
    company.path.step.append("company")
    company.string_stats.common_stats.tot_num_values = 100
    company.string_stats.unique = 2
    company.string_stats.top_values.add(value="Flash", frequency=75)
    company.string_stats.top_values.add(value="Taxi Co", frequency=25)
    return stats


def test_feature_summary_has_missing_share_and_distribution():
    found = feature_summary(dataset())
    assert found["fare"]["missing"] == pytest.approx(0.1) and found["fare"]["histogram"] == [10.0, 50.0, 30.0]
    assert found["company"]["missing"] == 0.0 and found["company"]["top"] == [["Flash", 75.0], ["Taxi Co", 25.0]]


def test_drift_measures_mean_shift_and_top_value_distance():
    before = feature_summary(dataset())
    after = feature_summary(dataset())
    assert [d["value"] for d in drift(after, before)] == [0.0, 0.0]
    after["fare"]["mean"] = 13.0  # 1.5 standard deviations of the previous run
    after["fare"]["missing"] = 0.3
    after["company"]["top"] = [["Flash", 50.0], ["Taxi Co", 50.0]]
    found = {d["feature"]: d for d in drift(after, before)}
    assert found["fare"]["value"] == pytest.approx(1.5) and found["fare"]["missing_change"] == pytest.approx(0.2)
    assert found["company"]["value"] == pytest.approx(0.25)
    assert found["company"]["measure"] == "L-infinity distance"


def test_a_model_artifacts_calibration_json_sets_the_reports_threshold(tmp_path):
    from components import artifacts
    from pipeline.summary import RunSummary, _read_model_reports
    from reports.run_page import run_page
    from tests.pipeline.test_report_page import CALIBRATION, thresholds

    trainer, calibrated = tmp_path / "Trainer" / "1", tmp_path / "Calibrator" / "2"
    artifacts.write_json(str(calibrated / artifacts.CALIBRATION_REPORT_JSON), CALIBRATION)
    trainer.mkdir(parents=True)
    summary = RunSummary(run_id="r1", metrics={"auc": 0.9, "example_count": 400.0},
                         plots={"thresholds": thresholds()})
    for uri in (trainer, calibrated):
        _read_model_reports(summary, str(uri))
    assert summary.calibration.to_dict() == CALIBRATION
    page = run_page(summary.to_dict())
    assert "Calibration and threshold" in page and "platt" in page and "at threshold 0.300" in page


def test_the_training_history_keeps_the_epochs_numbers_after_a_restart(tmp_path):
    import tensorflow as tf

    from components import artifacts
    from components.model import write_training_history
    from pipeline.summary import RunSummary, _read_model_reports
    from reports.run_page import run_page
    from settings.config import TrainingConfig

    history = tf.keras.callbacks.History()
    # Resumed from the backup of epoch 2 (index 1): Keras logs epochs 3 and 4 only.
    history.epoch, history.history = [2, 3], {"loss": [0.5, 0.4], "val_loss": [0.6, 0.5], "auc": [0.8, 0.85],
                                              "val_auc": [0.78, 0.8]}
    write_training_history(str(tmp_path), history, TrainingConfig(), BINARY)
    written = artifacts.read_json(str(tmp_path / artifacts.TRAINING_HISTORY_JSON))
    assert written["epoch_numbers"] == [3, 4] and written["monitor"] == "val_auc"
    assert written["settings"]["hidden_units"] == TrainingConfig().hidden_units
    summary = RunSummary(run_id="r")
    _read_model_reports(summary, str(tmp_path))
    page = run_page(summary.to_dict())
    loss = page[page.index("data-chart='loss'"):page.index("</svg>", page.index("data-chart='loss'"))]
    assert ">3</text>" in loss and ">4</text>" in loss and ">1</text>" not in loss


def test_rows_left_out_for_a_missing_label_show_on_the_console_and_in_the_report():
    import io

    from pipeline.runner import _print_summary
    from pipeline.summary import RunSummary
    from reports.run_page import _data

    summary = RunSummary(run_id="r", data={"rows": {"train": 8, "eval": 2}, "features": {},
                                           "missing_label_rows": 2})
    out = io.StringIO()
    _print_summary(summary, "s.json", "s.html", out)
    assert "  left out      2 row(s) without a label (before the split)" in out.getvalue()
    assert "2 row(s) without a label were left out before the split." in _data(summary.to_dict())


def test_a_cached_rerun_says_nothing_changed_and_which_version_holds_the_model():
    import io

    from pipeline.runner import _print_summary
    from pipeline.summary import RunSummary

    stages = {"CsvExampleGen": 0.1, "Trainer": 0.1, "Publisher": 0.1}
    summary = RunSummary(run_id="r", stage_seconds={**stages, "BaselineModelResolver": 0.0},
                         cached_stages=list(stages), published_version=1,
                         pushed_path="/o/serving/m/1", published_new=False, blessed=True, elapsed_seconds=2.5,
                         total_seconds=31.0)
    out = io.StringIO()
    _print_summary(summary, "s.json", "s.html", out)
    printed = out.getvalue()
    assert "  run           r in 31.0s (2.5s in the stages, the rest starting up and reading the run back)" in printed
    assert "  nothing changed: every stage came from the cache of an earlier run" in printed
    assert ("  published     nothing new: version 1 at /o/serving/m/1 already holds this model (an earlier run "
            "published it)") in printed
    fresh = RunSummary(run_id="r", stage_seconds=stages, cached_stages=["CsvExampleGen"], published_version=2,
                       pushed_path="/o/serving/m/2", published_new=True, blessed=True,
                       metrics={"precision/classId:0": 0.95, "precision/classId:1": 0.075},
                       export=ExportReport(passed=True, task=ExportTask(kind="multiclass", classes=("a", "b")),
                                           eval_rows=100, class_shares=(0.88, 0.12),
                                           no_skill={"macro_auc": 0.5, "accuracy": 0.49, "log_loss": 1.0297}))
    out = io.StringIO()
    _print_summary(fresh, "s.json", "s.html", out)
    assert "nothing changed" not in out.getvalue() and "  published     version 2 at /o/serving/m/2" in out.getvalue()
    assert ("  no skill      macro_auc 0.5000, accuracy 0.4900, log_loss 1.0297 (the class shares, never the "
            "features; on the 100 exported eval rows)") in out.getvalue()
    warnings = [line for line in out.getvalue().splitlines() if line.startswith("  warning")]
    assert warnings == ["  warning       class 'b': eval precision 0.0750 is below its share of the eval rows 0.1200, "
                        "so its answers are worse than guessing it (class weights favour rare classes; see "
                        "training.class_weights)"]


def test_a_calibration_that_was_not_applied_says_so_on_the_console():
    import io

    from pipeline.runner import _print_summary
    from pipeline.summary import RunSummary

    note = "temperature scaling moved the eval calibration from 1.0200 to 0.9200, further from 1, so it is not applied"
    figures = CalibrationFigures(calibration=1.02, ece=0.03, auc=0.9, precision=0.8, recall=0.8)
    summary = RunSummary(run_id="r", calibration=CalibrationRecord(
        method="temperature", fitted_on="the calibration split", rows=300, measured_on="the eval split",
        measured_rows=300, objective="argmax", threshold=None, before=figures, after=figures, applied=False,
        rejected_before=1.02, rejected_after=0.92, note=note))
    out = io.StringIO()
    _print_summary(summary, "s.json", "s.html", out)
    assert f"  calibrated    not applied: {note}\n" in out.getvalue()
    from reports.run_page import _calibration

    assert f"Not applied: {note}; both columns are the model as trained." in _calibration(
        {"calibration": summary.calibration.to_dict()})


def test_a_cached_evaluators_verdict_is_marked_as_the_earlier_runs():
    from reports.run_page import _baseline

    cached = _baseline({"blessed": True, "cached_stages": ["Evaluator"]}, "auc")
    assert "served from the cache: this is the verdict and the comparison of the earlier run" in cached
    assert "served from the cache" not in _baseline({"blessed": True, "cached_stages": []}, "auc")


def test_a_first_version_published_as_stable_is_not_sent_to_a_rollout(tmp_path):
    import io

    from pipeline.runner import _labels_on, _print_summary
    from pipeline.summary import RunSummary
    from settings.config import PipelineConfig

    config = PipelineConfig(output_root=str(tmp_path), model_name="m")
    assert _labels_on(config, 1) == [], "no repository yet"
    (tmp_path / "serving").mkdir()
    (tmp_path / "serving" / "models.config").write_text(
        'model_config_list { config { name: "m" base_path: "/models/m" model_platform: "tensorflow" '
        'model_version_policy { specific { versions: 1 versions: 2 } } version_labels { key: "stable" value: 1 } '
        'version_labels { key: "canary" value: 2 } } }')
    assert _labels_on(config, 1) == ["stable"] and _labels_on(config, 2) == ["canary"]
    printed = {}
    for version, labels in ((1, ["stable"]), (2, [])):
        out = io.StringIO()
        _print_summary(RunSummary(run_id="r", published_version=version, pushed_path=f"/o/serving/m/{version}",
                                  published_new=True, blessed=True, published_labels=labels), "s.json", "s.html", out)
        printed[version] = out.getvalue()
    assert "(`mlops versions` lists it; it is labelled stable: it serves without a rollout)" in printed[1]
    assert "mlops rollout start" not in printed[1]
    assert "`mlops rollout start --version 2` moves traffic to it" in printed[2]
