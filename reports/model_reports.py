"""The model's reports drawn: the export report (size, agreement, the task's metrics and latency of every exported
format) as text, a table, a PNG chart and a page, and the Optimizer's report as tables and a sparsity chart."""
from __future__ import annotations

import base64
import html
import io
from typing import Any

from reports import charts
from reports.html_parts import esc, num, tabulate
from settings.tasks import heading
from settings.tasks import metric_names as task_metric_names


def metric_names(result: dict[str, Any]) -> list[str]:
    """The metrics the report's task is judged by (AUC and accuracy for a report without a task: a binary one)."""
    return task_metric_names((result.get("task") or {}).get("kind", "binary"))


def table_lines(result: dict[str, Any]) -> list[str]:
    """The report as a plain-text table, for logs and the run summary."""
    names = metric_names(result)
    headings = "".join(f"{heading(name):>10}" for name in names)
    lines = [f"{'artifact':<16}{'size KiB':>10}{'max |diff|':>12}{headings}{'p50 ms':>9}  check"]
    for row in result["artifacts"]:
        check = row["check"]
        verdict = "ok" if check["passed"] else "FAILED"
        figures = "".join(f"{row[name]:>10.4f}" for name in names)
        lines.append(
            f"{row['artifact']:<16}{row['size_bytes'] / 1024:>10.1f}{row['max_abs_diff']:>12.2e}{figures}"
            f"{row['latency_ms_p50']:>9.3f}  {check['figure']} {check['value']:.2e} <= {check['threshold']:g} "
            f"{verdict}"
        )
    return lines


def chart_png(result: dict[str, Any]) -> str:
    """Size and median latency per artifact as two bar charts, a base64 PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["artifact"] for r in result["artifacts"]]
    colors = ["#4c72b0" if r["check"]["passed"] else "#c44e52" for r in result["artifacts"]]
    fig, (size_ax, latency_ax) = plt.subplots(1, 2, figsize=(11, 3.8))
    size_ax.barh(names, [r["size_bytes"] / 1024 for r in result["artifacts"]], color=colors)
    size_ax.set_xlabel("size (KiB)")
    latency_ax.barh(names, [r["latency_ms_p50"] for r in result["artifacts"]], color=colors)
    latency_ax.set_xlabel("median single-row latency (ms), preprocessing included")
    latency_ax.set_yticklabels([])
    for ax in (size_ax, latency_ax):
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode()


def table_html(result: dict[str, Any]) -> str:
    """The report's table as HTML: one row per artifact, its check passed or failed (shaded)."""
    names = metric_names(result)
    head = ("<tr><th>artifact</th><th>size KiB</th><th>max |diff| vs SavedModel</th>"
            + "".join(f"<th>{html.escape(heading(name))}</th>" for name in names)
            + "<th>p50 latency ms</th><th>check</th></tr>")
    body = []
    for row in result["artifacts"]:
        check = row["check"]
        style = "" if check["passed"] else ' style="background:#fdd"'
        figures = "".join(f"<td>{row[name]:.4f}</td>" for name in names)
        body.append(
            f"<tr{style}><td>{html.escape(row['artifact'])}</td><td>{row['size_bytes'] / 1024:.1f}</td>"
            f"<td>{row['max_abs_diff']:.2e}</td>{figures}"
            f"<td>{row['latency_ms_p50']:.3f}</td><td>{check['figure']} {check['value']:.2e} &le; "
            f"{check['threshold']:g} ({check['config_key']}): {'passed' if check['passed'] else 'FAILED'}</td></tr>"
        )
    return f"<table class='export'>{head}{''.join(body)}</table>"


def export_html(result: dict[str, Any]) -> str:
    names = metric_names(result)
    optimization = result.get("optimization") or {}
    opt_html = f"<h2>Optimization</h2>{optimization_html(optimization)}" if optimization else ""
    verdict = "all formats agree with the SavedModel" if result["passed"] else "FAILED: nothing is pushed"
    task = result.get("task") or {"kind": "binary"}
    reference = ", ".join(f"{heading(name)} {result['reference'][name]:.4f}" for name in names)
    classes = f" Classes, in the order of the probabilities: {html.escape(', '.join(task['classes']))}." \
        if task.get("classes") else ""
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>Export report</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}} td:first-child{{text-align:left}}</style></head>
<body><h1>Export report: {verdict}</h1>
<p>{html.escape(task['kind'])} model, {result['eval_rows']} eval rows; SavedModel {reference}. Every format
received the same raw rows.{classes}</p>
{table_html(result)}
<img alt="size and latency per format" src="data:image/png;base64,{chart_png(result)}">
{opt_html}</body></html>"""


def optimization_html(report: dict[str, Any]) -> str:
    """The Optimizer's report as tables (each model's size and metric, sparsity per layer) and a sparsity chart."""
    if not report:
        return "<p class='note'>The Optimizer recorded no report in this run.</p>"
    metric = report.get("metric", "auc")
    stages = [name for name in ("input", "distilled", "pruned") if isinstance(report.get(name), dict)]
    sizes = ["parameters", "nonzero_parameters", "gzip_bytes"]
    figures = [metric] + sorted({k for stage in stages for k, v in report[stage].items()
                                 if isinstance(v, float) and k not in (metric, "degradation")})
    columns = [c for c in (*sizes, *figures, "degradation") if any(c in report[stage] for stage in stages)]
    rows = [[esc(stage)] + [num(report[stage][c]) if c in report[stage] else "" for c in columns] for stage in stages]
    parts = [f"<p>Stages run: {esc(', '.join(report.get('stages', [])) or 'none')}; judged by {esc(metric)}.</p>",
             tabulate(["model"] + [esc(c.replace("_", " ")) for c in columns], rows)]
    sparsity = (report.get("pruned") or {}).get("kernel_sparsity") or {}
    if sparsity:
        parts.append("<h3>Sparsity per layer</h3>"
                     + charts.bars("sparsity", [(layer, float(v), "") for layer, v in sparsity.items()],
                                   "kernel sparsity per layer", width=480)
                     + tabulate(["layer", "kernel sparsity"], [[esc(k), f"{v:.1%}"] for k, v in sparsity.items()]))
    return "".join(parts)
