"""The export report's plain-text table, as the run summary prints it."""
from reports.model_reports import table_lines
from reports.records import ArtifactCheck, ArtifactRow, ExportReport, ExportTask


def row(name: str, rmse: float) -> ArtifactRow:
    check = ArtifactCheck(figure="max_abs_diff", value=0.0, threshold=1e-4, config_key="export.max_abs_diff",
                          passed=True)
    return ArtifactRow(artifact=name, path=name, size_bytes=2048, max_abs_diff=1.5e-7,
                       metrics={"rmse": rmse, "mae": 1.0, "r2": 0.5}, latency_ms_p50=0.5, check=check)


def test_a_figure_in_the_labels_units_keeps_a_gap_to_its_neighbours():
    # A house price's RMSE fills ten characters: the column widens instead of running into the one before it.
    report = ExportReport(passed=True, task=ExportTask(kind="regression", metric="rmse"),
                          artifacts=(row("saved_model", 15835.3129), row("onnx", 1234567.5)))
    header, first, second = table_lines(report)
    assert first.split()[:6] == ["saved_model", "2.0", "1.50e-07", "15835.3129", "1.0000", "0.5000"]
    assert second.split()[:4] == ["onnx", "2.0", "1.50e-07", "1234567.5000"]
    assert len(first) == len(second) and header.index("RMSE") + 4 == first.index("15835.3129") + 10
    # Figures that fit keep the ten-character columns.
    narrow = table_lines(ExportReport(passed=True, task=ExportTask(kind="regression", metric="rmse"),
                                      artifacts=(row("onnx", 0.25),)))
    assert narrow[1].startswith(f"{'onnx':<16}{2.0:>10.1f}{1.5e-7:>12.2e}{0.25:>10.4f}{1.0:>10.4f}")
