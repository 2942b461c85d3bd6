"""What the last run produced, read back from ML Metadata: eval metrics, blessing, published version."""
from __future__ import annotations

import html
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline import metadata


@dataclass
class RunSummary:
    run_id: str
    # Metric name -> value, for all eval rows and per slice ("payment_type=Cash" -> {...}).
    metrics: dict[str, float] = field(default_factory=dict)
    slices: dict[str, dict[str, float]] = field(default_factory=dict)
    blessed: bool | None = None
    pushed_path: str | None = None
    # The model repository version the Publisher published (or found already published).
    published_version: int | None = None
    model_path: str | None = None
    evaluation_path: str | None = None
    # The Optimizer's and the Exporter's reports (components/optimizer, components/exporter), when they ran.
    optimization: dict[str, Any] = field(default_factory=dict)
    export: dict[str, Any] = field(default_factory=dict)
    # The calibration record of the evaluated model (components/calibration.py), when it was calibrated.
    calibration: dict[str, Any] = field(default_factory=dict)
    cached_stages: list[str] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    elapsed_seconds: float = 0.0
    log_path: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


def _flatten_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """{output: {sub key: {name: value}}} as {name: value}; a figure per class as "precision/classId:0"."""
    flat = {}
    for sub_keys in metrics.values():
        for sub_key, name_to_value in sub_keys.items():
            for name, value in name_to_value.items():
                if "doubleValue" in value:
                    flat[f"{name}/{sub_key}" if sub_key else name] = float(value["doubleValue"])
    return flat


def _slice_name(slice_key: tuple) -> str:
    return ", ".join(f"{k}={v}" for k, v in slice_key) or "overall"


def read_evaluation(uri: str) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Overall and per-slice metrics from an Evaluator output folder."""
    import tensorflow_model_analysis as tfma

    result = tfma.load_eval_result(uri)
    overall, slices = {}, {}
    for slice_key, metrics in result.slicing_metrics:
        flat = _flatten_metrics(metrics)
        if not slice_key:
            overall = flat
        else:
            slices[_slice_name(slice_key)] = flat
    return overall, slices


def latest_run(metadata_path: str, pipeline_name: str) -> RunSummary:
    """Summary of the newest run of `pipeline_name` recorded in the MLMD database."""
    store = metadata.connect(metadata_path)
    run = metadata.latest_run(store, pipeline_name)
    summary = RunSummary(run_id=run.name)
    for output in metadata.run_outputs(store, run, pipeline_name):
        artifact, props = output.artifact, output.artifact.custom_properties
        if output.type_name == "ModelEvaluation":
            summary.evaluation_path = artifact.uri
            summary.metrics, summary.slices = read_evaluation(artifact.uri)
        elif output.type_name == "ModelBlessing":
            summary.blessed = bool(props["blessed"].int_value) if "blessed" in props else None
        elif output.type_name == "PushedModel":
            if "pushed" in props and props["pushed"].int_value:
                summary.pushed_path = props["pushed_destination"].string_value
                if "pushed_version" in props:
                    summary.published_version = props["pushed_version"].int_value
        elif output.type_name == "Model":
            _read_model_reports(summary, artifact.uri)
    return summary


def _read_model_reports(summary: RunSummary, uri: str) -> None:
    from components import artifacts

    export_report = artifacts.join(artifacts.serving_model_dir(uri), artifacts.EXPORT_REPORT_JSON)
    optimization_report = artifacts.join(uri, artifacts.OPTIMIZATION_REPORT_FILE)
    if artifacts.exists(export_report):
        summary.export = artifacts.read_json(export_report)
        summary.model_path = uri
    elif artifacts.exists(optimization_report):
        summary.optimization = artifacts.read_json(optimization_report)
        calibration_report = artifacts.join(uri, artifacts.CALIBRATION_REPORT_JSON)
        if artifacts.exists(calibration_report):
            summary.calibration = artifacts.read_json(calibration_report)
    if summary.model_path is None:
        summary.model_path = uri


def write_report(summary: RunSummary, folder: str) -> tuple[str, str]:
    """summary.json and a small summary.html (metrics overall and per slice) in `folder`."""
    os.makedirs(folder, exist_ok=True)
    json_path = os.path.join(folder, "summary.json")
    with open(json_path, "w") as f:
        f.write(summary.to_json())
    names = sorted({n for m in [summary.metrics, *summary.slices.values()] for n in m})
    rows = [("overall", summary.metrics)] + sorted(summary.slices.items())
    table = "".join(
        "<tr><th>{}</th>{}</tr>".format(
            html.escape(name), "".join(f"<td>{m[n]:.4f}</td>" if n in m else "<td></td>" for n in names)
        )
        for name, m in rows
    )
    export = ""
    if summary.export:
        from components.exporter.report import table_lines

        export = "<h2>Exported formats</h2><pre>{}</pre>".format(html.escape("\n".join(table_lines(summary.export))))
    page = (
        "<!doctype html><meta charset='utf-8'><title>Run {run}</title>"
        "<style>body{{font-family:sans-serif}}td,th{{padding:2px 8px;text-align:right}}</style>"
        "<h1>Run {run}</h1><p>blessed: {blessed} &middot; pushed: {pushed}</p>"
        "<table><tr><th>slice</th>{head}</tr>{table}</table>{export}"
    ).format(
        export=export,
        run=html.escape(summary.run_id),
        blessed=summary.blessed,
        pushed=html.escape(str(summary.pushed_path)),
        head="".join(f"<th>{html.escape(n)}</th>" for n in names),
        table=table,
    )
    html_path = os.path.join(folder, "summary.html")
    with open(html_path, "w") as f:
        f.write(page)
    return json_path, html_path
