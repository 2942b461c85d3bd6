"""The model's reports drawn: the export report (size, agreement, the task's metrics and latency of every exported
format) as text, a table, a PNG chart and a page, and the Optimizer's report as tables and a sparsity chart."""
from __future__ import annotations

import base64
import html
import io

from reports import charts
from reports.html_parts import esc, num, tabulate
from reports.records import ExportReport, OptimizationReport
from settings.tasks import heading
from settings.tasks import metric_names as task_metric_names


def metric_names(result: ExportReport) -> list[str]:
    """The metrics the report's task is judged by (AUC and accuracy for a report without a task: a binary one)."""
    return task_metric_names(result.kind)


def table_lines(result: ExportReport) -> list[str]:
    """The report as a plain-text table, for logs and the run summary."""
    names = metric_names(result)
    # Ten characters a column, wider where a figure in the label's units (a price's RMSE) needs it.
    widths = {name: max([10, *(len(f"{row.metrics[name]:.4f}") + 2 for row in result.artifacts)]) for name in names}
    headings = "".join(f"{heading(name):>{widths[name]}}" for name in names)
    lines = [f"{'artifact':<16}{'size KiB':>10}{'max |diff|':>12}{headings}{'p50 ms':>9}  check"]
    for row in result.artifacts:
        check = row.check
        verdict = "ok" if check.passed else "FAILED"
        figures = "".join(f"{row.metrics[name]:>{widths[name]}.4f}" for name in names)
        lines.append(
            f"{row.artifact:<16}{row.size_bytes / 1024:>10.1f}{row.max_abs_diff:>12.2e}{figures}"
            f"{row.latency_ms_p50:>9.3f}  {check.figure} {check.value:.2e} <= {check.threshold:g} "
            f"{verdict}"
        )
    lines += [f"{name:<16}{reason}" for name, reason in result.skipped.items()]
    return lines


def chart_png(result: ExportReport) -> str:
    """Size and median latency per artifact as two bar charts, a base64 PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [row.artifact for row in result.artifacts]
    colors = ["#4c72b0" if row.check.passed else "#c44e52" for row in result.artifacts]
    fig, (size_ax, latency_ax) = plt.subplots(1, 2, figsize=(11, 3.8))
    size_ax.barh(names, [row.size_bytes / 1024 for row in result.artifacts], color=colors)
    size_ax.set_xlabel("size (KiB)")
    latency_ax.barh(names, [row.latency_ms_p50 for row in result.artifacts], color=colors)
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


def table_html(result: ExportReport) -> str:
    """The report's table as HTML: one row per artifact, its check passed or failed (shaded)."""
    names = metric_names(result)
    head = ("<tr><th>artifact</th><th>size KiB</th><th>max |diff| vs SavedModel</th>"
            + "".join(f"<th>{html.escape(heading(name))}</th>" for name in names)
            + "<th>p50 latency ms</th><th>check</th></tr>")
    body = []
    for row in result.artifacts:
        check = row.check
        style = "" if check.passed else ' style="background:#fdd"'
        figures = "".join(f"<td>{row.metrics[name]:.4f}</td>" for name in names)
        body.append(
            f"<tr{style}><td>{html.escape(row.artifact)}</td><td>{row.size_bytes / 1024:.1f}</td>"
            f"<td>{row.max_abs_diff:.2e}</td>{figures}"
            f"<td>{row.latency_ms_p50:.3f}</td><td>{check.figure} {check.value:.2e} &le; "
            f"{check.threshold:g} ({check.config_key}): {'passed' if check.passed else 'FAILED'}</td></tr>"
        )
    body += [f"<tr><td>{html.escape(name)}</td><td colspan='{len(names) + 4}'>{html.escape(reason)}</td></tr>"
             for name, reason in result.skipped.items()]
    return f"<table class='export'>{head}{''.join(body)}</table>"


def export_html(result: ExportReport) -> str:
    names = metric_names(result)
    opt_html = f"<h2>Optimization</h2>{optimization_html(result.optimization)}" if result.optimization else ""
    verdict = "all formats agree with the SavedModel" if result.passed else "FAILED: nothing is pushed"
    reference = ", ".join(f"{heading(name)} {result.reference[name]:.4f}" for name in names)
    classes = result.task.classes if result.task else ()
    classes_note = f" Classes, in the order of the probabilities: {html.escape(', '.join(classes))}." \
        if classes else ""
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>Export report</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}} td:first-child{{text-align:left}}</style></head>
<body><h1>Export report: {verdict}</h1>
<p>{html.escape(result.kind)} model, {result.eval_rows} eval rows; SavedModel {reference}. Every format
received the same raw rows.{classes_note}</p>
{table_html(result)}
<img alt="size and latency per format" src="data:image/png;base64,{chart_png(result)}">
{opt_html}</body></html>"""


def optimization_html(report: OptimizationReport | None) -> str:
    """The Optimizer's report as tables (each model's size and metric, sparsity per layer) and a sparsity chart."""
    if report is None:
        return "<p class='note'>The Optimizer recorded no report in this run.</p>"
    metric = report.metric
    measured = report.measured
    sizes = ["parameters", "nonzero_parameters", "gzip_bytes"]
    figures = [metric] + sorted({name for _, model in measured for name, value in model.metrics.items()
                                 if name != metric})
    values = {stage: {**{size: model.figure(size) for size in sizes}, **model.metrics,
                      **({"degradation": model.degradation} if model.degradation is not None else {})}
              for stage, model in measured}
    columns = [c for c in (*sizes, *figures, "degradation") if any(c in values[stage] for stage, _ in measured)]
    rows = [[esc(stage)] + [num(values[stage][c]) if c in values[stage] else "" for c in columns]
            for stage, _ in measured]
    parts = [f"<p>Stages run: {esc(', '.join(report.stages) or 'none')}; judged by {esc(metric)}.</p>",
             tabulate(["model"] + [esc(c.replace("_", " ")) for c in columns], rows)]
    sparsity = report.pruned.kernel_sparsity if report.pruned else {}
    if sparsity:
        parts.append("<h3>Sparsity per layer</h3>"
                     + charts.bars("sparsity", [(layer, float(v), "") for layer, v in sparsity.items()],
                                   "kernel sparsity per layer", width=480)
                     + tabulate(["layer", "kernel sparsity"], [[esc(k), f"{v:.1%}"] for k, v in sparsity.items()]))
    return "".join(parts)
