"""What the last run produced, read back from ML Metadata: eval metrics, blessing, published version."""
from __future__ import annotations

import html
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

OUTPUT_EVENTS = (metadata_store_pb2.Event.OUTPUT, metadata_store_pb2.Event.DECLARED_OUTPUT)


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
    cached_stages: list[str] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    elapsed_seconds: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


def _store(metadata_path: str) -> metadata_store.MetadataStore:
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = metadata_path
    config.sqlite.connection_mode = metadata_store_pb2.SqliteMetadataSourceConfig.READONLY
    return metadata_store.MetadataStore(config)


def _flatten_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    flat = {}
    for sub_key in metrics.values():
        for name_to_value in sub_key.values():
            for name, value in name_to_value.items():
                if "doubleValue" in value:
                    flat[name] = float(value["doubleValue"])
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
    store = _store(metadata_path)
    runs = store.get_contexts_by_type("pipeline_run")
    if not runs:
        raise LookupError(f"no run of pipeline '{pipeline_name}' is recorded in {metadata_path}.")
    run = max(runs, key=lambda c: (c.create_time_since_epoch, c.id))
    summary = RunSummary(run_id=run.name)
    executions = store.get_executions_by_context(run.id)
    events = store.get_events_by_execution_ids([e.id for e in executions])
    artifact_ids = [e.artifact_id for e in events if e.type in OUTPUT_EVENTS]
    types = {t.id: t.name for t in store.get_artifact_types()}
    for artifact in store.get_artifacts_by_id(artifact_ids):
        kind = types.get(artifact.type_id)
        props = artifact.custom_properties
        if kind == "ModelEvaluation":
            summary.evaluation_path = artifact.uri
            summary.metrics, summary.slices = read_evaluation(artifact.uri)
        elif kind == "ModelBlessing":
            summary.blessed = bool(props["blessed"].int_value) if "blessed" in props else None
        elif kind == "PushedModel":
            if "pushed" in props and props["pushed"].int_value:
                summary.pushed_path = props["pushed_destination"].string_value
                if "pushed_version" in props:
                    summary.published_version = props["pushed_version"].int_value
        elif kind == "Model":
            _read_model_reports(summary, artifact.uri)
    return summary


def _read_model_reports(summary: RunSummary, uri: str) -> None:
    from components.exporter.report import JSON_FILE
    from components.optimizer.executor import REPORT_FILE as OPTIMIZATION_REPORT

    export_report = os.path.join(uri, "Format-Serving", JSON_FILE)
    optimization_report = os.path.join(uri, OPTIMIZATION_REPORT)
    if os.path.exists(export_report):
        with open(export_report) as f:
            summary.export = json.load(f)
        summary.model_path = uri
    elif os.path.exists(optimization_report):
        with open(optimization_report) as f:
            summary.optimization = json.load(f)
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
