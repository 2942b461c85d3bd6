"""export_report.json and export_report.html in the Exporter's output (reports/model_reports.py draws the page)."""
from __future__ import annotations

import json

from components import artifacts
from reports.model_reports import export_html
from reports.records import ExportReport


def write(result: ExportReport, output_dir: str) -> None:
    """The report as JSON and as an HTML page in `output_dir` (any file system)."""
    artifacts.write_text(artifacts.join(output_dir, artifacts.EXPORT_REPORT_JSON),
                         json.dumps(result.to_dict(), indent=1))
    artifacts.write_text(artifacts.join(output_dir, artifacts.EXPORT_REPORT_HTML), export_html(result))
