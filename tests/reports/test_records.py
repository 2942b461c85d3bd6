"""The typed records of the export report, the optimization report and the calibration record: each file the
pipeline wrote (tests/fixtures/reports, written before the records existed, by runs of the taxi, iris and diabetes
examples and by the calibration step) reads back and writes again to the same bytes; every field of every record is
exercised by some file; a report that lacks its verdict is refused with a sentence naming the key."""
import dataclasses
import json
from pathlib import Path

import pytest

from pipeline.summary import RunSummary
from reports.records import (
    ArtifactRow,
    CalibrationRecord,
    ExportReport,
    ExportTask,
    ModelFigures,
    OptimizationReport,
    RecordError,
    RequestEncoding,
)

REPORTS = Path(__file__).resolve().parents[1] / "fixtures" / "reports"
# How each file is written: the Exporter with json.dumps(indent=1), the Optimizer with artifacts.write_json.
WRITTEN = {"export_report": (ExportReport, {"indent": 1}),
           "optimization_report": (OptimizationReport, {"indent": 2, "sort_keys": True}),
           "calibration": (CalibrationRecord, {"indent": 2, "sort_keys": True})}
FILES = sorted(REPORTS.rglob("*.json"))


def record_kind(path: Path) -> str:
    return next(kind for kind in WRITTEN if path.stem.startswith(kind))


def read(path: Path):
    return WRITTEN[record_kind(path)][0].from_dict(json.loads(path.read_text()))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(REPORTS)))
def test_a_report_the_pipeline_wrote_reads_back_and_writes_the_same_bytes(path):
    cls, options = WRITTEN[record_kind(path)]
    text = path.read_text()
    assert json.dumps(cls.from_dict(json.loads(text)).to_dict(), **options) == text


def records() -> list:
    """Every record in the files, nested ones included."""
    found = []
    for path in FILES:
        record = read(path)
        found.append(record)
        if isinstance(record, ExportReport):
            found += [record.task, record.optimization, record.calibration, record.request, *record.artifacts]
        if isinstance(record, (ExportReport, OptimizationReport)):
            optimization = record.optimization if isinstance(record, ExportReport) else record
            found += [figures for _, figures in optimization.measured] + [optimization.summary]
    return [r for r in found if r is not None]


@pytest.mark.parametrize("cls", [ExportReport, ExportTask, ArtifactRow, RequestEncoding, OptimizationReport,
                                 ModelFigures, CalibrationRecord], ids=lambda c: c.__name__)
def test_every_field_of_every_record_is_set_in_some_file(cls):
    """A field no file sets would go untested by the round trip above."""
    instances = [r for r in records() if isinstance(r, cls)]
    unset = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else object())
        if all(getattr(r, f.name) == default for r in instances):
            unset.append(f.name)
    assert instances and not unset, f"{cls.__name__}: no file sets {unset}"


def test_the_files_cover_each_task_kind_and_calibration_outcome():
    exports = {path.parent.name: read(path) for path in FILES if path.name == "export_report.json"}
    assert {name: report.kind for name, report in exports.items()} == {
        "taxi": "binary", "iris": "multiclass", "diabetes": "regression"}
    assert exports["iris"].task.classes == ("setosa", "versicolor", "virginica") and exports["iris"].class_shares
    assert len(exports["diabetes"].predicted_actual) == exports["diabetes"].eval_rows
    assert exports["diabetes"].calibration is None and exports["diabetes"].request.missing_values == ("NA", "?")
    taxi = exports["taxi"]
    assert taxi.optimization.stages == ("distill", "prune") and taxi.optimization.pruned.pruned_from == "distilled"
    assert taxi.calibration.method == "platt" and taxi.calibration.confusion_at_threshold is not None
    multiclass = read(REPORTS / "calibration_multiclass.json")
    assert multiclass.method == "temperature" and multiclass.threshold is None and multiclass.temperature > 1
    nothing = read(REPORTS / "optimization_report_nothing_done.json")
    assert nothing.stages == () and nothing.input is None and nothing.note.startswith("nothing done")
    rejected = read(REPORTS / "calibration_not_applied.json")
    assert not rejected.applied and rejected.note.endswith("so it is not applied") and rejected.min_precision == 0.5


def test_the_calibration_step_writes_the_layout_it_wrote_before_the_records():
    """calibration_multiclass.json holds what calibration_record wrote for these rows before it returned a record."""
    from tests.components.test_calibration import overconfident_multiclass_record

    record = overconfident_multiclass_record(seed=2)
    written = json.loads((REPORTS / "calibration_multiclass.json").read_text())
    assert flatten(record.to_dict()) == pytest.approx(flatten(written), rel=1e-9)


def flatten(value, path="") -> dict:
    """{'before/auc': 0.9, 'reliability/after/0/1': 0.4, ...}: every leaf of a JSON value by its path."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in flatten(item, f"{path}{key}/").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in flatten(item, f"{path}{i}/").items()}
    return {path.rstrip("/"): value}


@pytest.mark.parametrize("report, message", [
    ({"artifacts": []}, "the export report has no 'passed'"),
    ({"passed": "yes"}, "the export report's 'passed' is 'yes': expected true or false"),
    ({"passed": True, "artifacts": [{"artifact": "onnx", "size_bytes": 10, "max_abs_diff": 0.0,
                                     "latency_ms_p50": 1.0}]}, "the export report's artifact row has no 'check'"),
    ({"passed": True, "eval_rows": None}, "the export report holds a value of the wrong kind: int()"),
    ({"passed": True, "artifacts": [["onnx"]]}, "the export report holds a value of the wrong kind: expected an "
                                                "object, got list"),
    (["passed"], "the export report holds a value of the wrong kind: expected an object, got list"),
])
def test_a_report_without_its_verdict_is_refused_naming_the_key(report, message):
    with pytest.raises(RecordError, match=f"^{message}"):
        ExportReport.from_dict(report)


def test_a_report_from_before_task_kinds_reads_as_binary_and_keeps_its_verdict():
    # What earlier releases (and benchmarks/monitor.py) wrote: the verdict alone.
    report = ExportReport.from_dict({"passed": True})
    assert report.passed and report.kind == "binary" and report.artifacts == () and report.failed == ()
    assert report.to_dict() == {"eval_rows": 0, "reference": {"artifact": "saved_model"}, "no_skill": {},
                                "artifacts": [], "passed": True, "optimization": {}, "calibration": {},
                                "request": {}}


def test_a_stage_that_did_not_run_is_an_empty_object_in_summary_json():
    written = json.loads(RunSummary(run_id="r").to_json())
    assert (written["export"], written["optimization"], written["calibration"]) == ({}, {}, {})
    taxi = read(REPORTS / "taxi" / "export_report.json")
    summary = RunSummary(run_id="r", export=taxi, optimization=taxi.optimization, calibration=taxi.calibration)
    written = json.loads(summary.to_json())
    assert written["export"] == json.loads((REPORTS / "taxi" / "export_report.json").read_text())
    assert written["calibration"] == json.loads((REPORTS / "taxi" / "calibration.json").read_text())
