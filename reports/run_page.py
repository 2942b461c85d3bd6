"""The run report (outputs/runs/<run>/summary.html) and the index of runs (outputs/runs/index.html).

`run_page` draws a RunSummary as a dict (what summary.json holds) into one self-contained page: inline SVG charts
(reports/charts.py) and the Exporter's PNG as a data URI, no script, nothing fetched at view time. Every section is a
`<section id=...>`; a section whose material the run did not produce says why instead of disappearing.
"""
from __future__ import annotations

import json
import math
import os
import shlex
from typing import Any
from urllib.parse import quote

from reports import charts
from reports.html_parts import captioned, esc, num, tabulate, whole
from reports.model_reports import chart_png, optimization_html, table_html
from reports.records import CalibrationRecord, ExportReport, OptimizationReport
from settings.files import RUN_SUMMARY_JSON, RUNS_INDEX_HTML

SECTIONS = ("timeline", "data", "training", "evaluation", "calibration", "optimization", "export", "serving")
# Slices with fewer eval rows than this are drawn in another colour and called out: their figures are noise.
FEW_ROWS = 100
DEFAULT_THRESHOLD = 0.5
# Where `mlops serve` listens by default (serving/cli.py).
REST_URL = "http://127.0.0.1:8501"
GRPC_TARGET = "127.0.0.1:8500"
STYLE = charts.PAGE_STYLE + """
.few{color:#b00}.charts{display:flex;flex-wrap:wrap;gap:18px;align-items:flex-start}
.charts figure{margin:0}figcaption{font-size:.9em;color:#444;max-width:380px}
pre{background:#f6f8fa;padding:8px 10px;overflow-x:auto;font-size:.88em}nav a{margin-right:.8em}
img{max-width:100%}
"""
TITLES = {"timeline": "Stages", "data": "Data", "training": "Training", "evaluation": "Evaluation",
          "calibration": "Calibration and threshold", "optimization": "Optimization", "export": "Export",
          "serving": "Published version and how to call it"}


def section_title(section: str, summary: dict[str, Any]) -> str:
    """TITLES[section]; only a binary model has a decision threshold, so only its calibration title names one."""
    if section == "calibration" and (summary.get("task") or {}).get("kind", "binary") != "binary":
        return "Calibration"
    return TITLES[section]


def task_metric_name(summary: dict[str, Any]) -> str:
    """The figure the run is judged by: the export report's task metric, else the first the Evaluator has."""
    metric = (summary.get("task") or {}).get("metric")
    if metric:
        return metric
    kind = (summary.get("task") or {}).get("kind", "binary")
    names = {"binary": ("auc",), "multiclass": ("macro_auc",), "regression": ("rmse",)}[kind]
    return next((n for n in names if n in summary.get("metrics", {})), names[0])


def export_report(summary: dict[str, Any]) -> ExportReport | None:
    """The Exporter's report the summary carries; None when the Exporter did not run."""
    return ExportReport.from_dict(summary["export"]) if summary.get("export") else None


def calibration_record(summary: dict[str, Any]) -> CalibrationRecord | None:
    """The calibration step's record (calibration.json) the summary carries; None when no calibration ran."""
    return CalibrationRecord.from_dict(summary["calibration"]) if summary.get("calibration") else None


def optimization_report(summary: dict[str, Any]) -> OptimizationReport | None:
    """The Optimizer's report the summary carries when the Exporter did not run (its report carries it otherwise)."""
    return OptimizationReport.from_dict(summary["optimization"]) if summary.get("optimization") else None


def decision_threshold(summary: dict[str, Any]) -> float:
    """The calibration step's chosen threshold (calibration.json), else 0.5."""
    record = calibration_record(summary)
    return record.threshold if record is not None and record.threshold is not None else DEFAULT_THRESHOLD


# ---- sections ---------------------------------------------------------------------------------------------------

def _timeline(summary: dict[str, Any]) -> str:
    seconds = summary.get("stage_seconds") or {}
    cached = set(summary.get("cached_stages") or [])
    if not seconds:
        return "<p class='note'>No stage timings were recorded for this run.</p>"
    stages = [(name, float(took), name in cached) for name, took in seconds.items()]
    chart = charts.timeline("timeline", stages, "seconds per stage")
    ran = sum(s for _, s, c in stages if not c)
    return (f"<p>{len(stages)} stages in {summary.get('elapsed_seconds', 0):.1f}s; {len(cached)} served from the "
            f"cache (grey), {ran:.1f}s of work in the others.</p>{chart}")


def _data(summary: dict[str, Any]) -> str:
    data = summary.get("data") or {}
    if not data:
        return "<p class='note'>The run recorded no statistics.</p>"
    rows = data.get("rows", {})
    parts = [charts.bars("rows", [(split, float(n), "rows") for split, n in rows.items()], "rows per split")]
    if data.get("missing_label_rows"):
        parts.append(f"<p class='note'>{data['missing_label_rows']} row(s) without a label were left out before the "
                     "split.</p>")
    features = data.get("features", {})
    splits = list(features)
    names = sorted({name for per in features.values() for name in per})
    body = []
    for name in names:
        cells = [esc(name), esc(next(features[s][name]["kind"] for s in splits if name in features[s]))]
        for split in splits:
            entry = features[split].get(name)
            if entry is None:
                cells += ["", ""]
                continue
            share = entry["missing"]
            cells.append(f"<span class='{'few' if share else ''}'>{share:.1%}</span>")
            if entry["kind"] == "numeric":
                chart = charts.spark_bars("distribution", entry.get("histogram", []),
                                          f"{name} {split}: {entry['min']:.4g} to {entry['max']:.4g}")
                cells.append(f"{chart}<br><span class='note'>{entry['min']:.4g} .. {entry['max']:.4g}, mean "
                             f"{entry['mean']:.4g}</span>")
            else:
                top = entry.get("top", [])
                chart = charts.spark_bars("distribution", [f for _, f in top], f"{name} {split}: top values")
                shown = ", ".join(f"{v} ({f:,.0f})" for v, f in top[:4])
                cells.append(f"{chart}<br><span class='note'>{entry.get('unique', 0):,} distinct; "
                             f"{esc(shown)}</span>")
        body.append(cells)
    head = ["feature", "kind"] + [h for s in splits for h in (f"missing ({esc(s)})", f"distribution ({esc(s)})")]
    parts.append("<h3>Features</h3>" + tabulate(head, body))
    anomalies = [(split, a) for split, found in (data.get("anomalies") or {}).items() for a in found]
    parts.append("<h3>Anomalies</h3>")
    if anomalies:
        parts.append(tabulate(["split", "feature", "severity", "description"],
                              [[esc(s), esc(a["feature"]), esc(a["severity"]), esc(a["description"])]
                               for s, a in anomalies]))
    else:
        parts.append("<p class='good'>None: every split fits the schema.</p>")
    parts.append("<h3>Drift against the previous run</h3>")
    drift = data.get("drift")
    if not drift:
        parts.append("<p class='note'>No previous run of this pipeline to compare with.</p>")
    elif drift.get("same_statistics"):
        parts.append(f"<p>Same statistics as run {esc(drift['previous_run'])} (reused from the cache): the data did "
                     "not change.</p>")
    else:
        drift_rows = [[esc(d["feature"]), esc(d["measure"]),
                       f"<span class='{'bad' if d['value'] > 0.1 else ''}'>{d['value']:.3f}</span>",
                       f"{d['missing_change']:+.1%}"] for d in drift.get("features", [])]
        parts.append(f"<p>{esc(drift.get('split', 'train'))} split against run {esc(drift['previous_run'])}; above "
                     "0.1 in red.</p>" + tabulate(["feature", "measure", "drift", "missing share change"], drift_rows))
    return "".join(parts)


def _setting(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else esc(value)


def _training(summary: dict[str, Any]) -> str:
    training = summary.get("training") or {}
    parts = []
    epochs = training.get("epochs") or {}
    if epochs:
        numbers = training.get("epoch_numbers") or []

        def series(name: str) -> list[tuple[str, list[tuple[float, float]]]]:
            return [(label, [(float(numbers[i]) if i < len(numbers) else i + 1.0, float(v))
                             for i, v in enumerate(epochs[key])])
                    for label, key in (("train", name), ("validation", f"val_{name}")) if key in epochs]
        monitor = str(training.get("monitor", "val_auc"))
        metric = monitor[4:] if monitor.startswith("val_") else monitor
        count = max(len(v) for v in epochs.values())
        parts.append(f"<p>{count} epoch(s); early stopping follows {esc(monitor)} "
                     f"({esc(training.get('mode', ''))}).</p>"
                     "<div class='charts'>"
                     + captioned(charts.lines("loss", series("loss"), "loss per epoch", "epoch", "loss"),
                               "Loss per epoch, train and validation.")
                     + captioned(charts.lines("training_metric", series(metric), f"{metric} per epoch", "epoch",
                                            metric), f"{metric} per epoch, train and validation.")
                     + "</div>")
    else:
        parts.append("<p class='note'>The Trainer saved no per-epoch history (a model trained before the report "
                     "existed, or training did not run).</p>")
    settings = training.get("settings") or {}
    if settings:
        parts.append("<h3>Hyperparameters</h3>" + tabulate(["setting", "value"],
                                                         [[esc(k), _setting(v)] for k, v in settings.items()]))
    best = training.get("tuner_best")
    trials = training.get("tuner_trials")
    if best is not None or trials:
        parts.append("<h3>Tuner</h3>")
        if best:
            parts.append("<p>Best values: " + ", ".join(f"{esc(k)} {_setting(v)}" for k, v in best.items()) + "</p>")
        if trials:
            keys = [k for k in trials[0] if k not in ("trial_id", "score")]
            parts.append(tabulate(["trial", "score"] + [esc(k) for k in keys],
                                [[esc(t.get("trial_id", "")), num(t.get("score"))] + [num(t.get(k)) for k in keys]
                                 for t in trials]))
    else:
        parts.append("<p class='note'>The Tuner did not run (tuner.enabled=false): the settings above come from "
                     "the config.</p>")
    return "".join(parts)


def confusion_at(thresholds: list[dict[str, float]], threshold: float) -> dict[str, float] | None:
    """The confusion matrix of the plot's threshold nearest to `threshold`."""
    usable = [m for m in thresholds if 0.0 <= m["threshold"] <= 1.0]
    return min(usable, key=lambda m: abs(m["threshold"] - threshold)) if usable else None


def roc_and_pr(thresholds: list[dict[str, float]]) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """(false positive rate, true positive rate) and (recall, precision) points, by falling threshold."""
    roc, pr = [], []
    for m in sorted(thresholds, key=lambda m: -m["threshold"]):
        positives, negatives = m["tp"] + m["fn"], m["fp"] + m["tn"]
        recall = m["tp"] / positives if positives else 0.0
        roc.append((m["fp"] / negatives if negatives else 0.0, recall))
        if m["tp"] + m["fp"]:
            pr.append((recall, m["tp"] / (m["tp"] + m["fp"])))
    return roc, pr


def _slices(summary: dict[str, Any], metric: str) -> str:
    metrics, slices = summary.get("metrics") or {}, summary.get("slices") or {}
    rows = [("overall", metrics)] + sorted(slices.items())
    bars, colors = [], []
    for name, m in rows:
        if metric not in m:
            continue
        count = m.get("example_count", float("nan"))
        few = isinstance(count, float) and count < FEW_ROWS
        one_class = m.get("mean_label") in (0.0, 1.0)
        note = " (one class: AUC undefined)" if one_class else " (few rows)" if few else ""
        bars.append((name, float(m[metric]), f"n={count:,.0f}{note}"))
        colors.append("#d9822b" if few or one_class else "")
    chart = charts.bars("slices", bars, f"{metric} per slice with its example count", colors=colors)
    names = [n for n in ("example_count", metric, *sorted({k for _, m in rows for k in m})) if "/" not in n]
    names = list(dict.fromkeys(n for n in names if any(n in m for _, m in rows) and not n.endswith("_diff")))
    table = tabulate(["slice"] + [esc(n) for n in names],
                   [[esc(name)] + [whole(m.get(n)) if n == "example_count" else num(m[n]) if n in m else ""
                                  for n in names] for name, m in rows])
    one_class = (" and slices whose rows are all of one class (mean_label 0 or 1: no ranking to judge)"
                 if (summary.get("task") or {}).get("kind", "binary") == "binary" else "")
    return (f"<h3>Overall and per slice</h3><p class='note'>{esc(metric)} with the rows it was measured on; in "
            f"orange, slices under {FEW_ROWS} rows (their figures swing with a single row){one_class}.</p>"
            f"{chart}{table}")


def _binary_plots(summary: dict[str, Any]) -> str:
    plots = summary.get("plots") or {}
    thresholds = plots.get("thresholds") or []
    parts = []
    if thresholds:
        roc, pr = roc_and_pr(thresholds)
        auc = (summary.get("metrics") or {}).get("auc")
        auc_text = f" (AUC {auc:.4f})" if isinstance(auc, (int, float)) else ""
        parts.append(captioned(charts.lines("roc", [("model", roc)], "ROC curve", "false positive rate",
                                          "true positive rate", diagonal=True, bounds=(0, 1, 0, 1)),
                             f"ROC curve{auc_text}; dashed: chance."))
        parts.append(captioned(charts.lines("precision_recall", [("model", pr)], "precision-recall curve", "recall",
                                          "precision", bounds=(0, 1, 0, 1)), "Precision against recall."))
    buckets = plots.get("calibration") or []
    if buckets:
        points = [(b["prediction"] / b["count"], b["label"] / b["count"]) for b in buckets if b["count"]]
        parts.append(captioned(charts.lines("calibration_plot", [("buckets", points)], "calibration plot",
                                          "mean predicted probability", "share of positives", diagonal=True,
                                          bounds=(0, 1, 0, 1), points=True),
                             "Mean prediction against the observed share of positives per probability bucket; "
                             "on the dashed line, a probability means what it says. Rows per bucket, left to right: "
                             + ", ".join(f"{b['count']:,.0f}" for b in buckets if b["count"]) + "."))
    threshold = decision_threshold(summary)
    calibration = calibration_record(summary)
    counted = calibration.confusion_at_threshold if calibration else None
    matrix = counted.to_dict() if counted else (confusion_at(thresholds, threshold) if thresholds else None)
    if matrix:
        chart = charts.matrix("confusion_matrix", ["negative", "positive"],
                              [[matrix["tn"], matrix["fp"]], [matrix["fn"], matrix["tp"]]], "confusion matrix")
        if counted:
            caption = (f"Confusion matrix on the eval rows at the decision threshold {threshold:.4g}, chosen and "
                       "counted by the calibration step (the Evaluator's thresholds are fixed before the run).")
        else:
            source = "chosen by the calibration step" if calibration is not None else "the default"
            caption = (f"Confusion matrix at threshold {matrix['threshold']:.3f} ({source}; the decision threshold "
                       f"is {threshold:.3f}).")
        parts.append(captioned(chart, caption))
    if not parts:
        return "<p class='note'>The Evaluator recorded no plots (a run from before the report had them).</p>"
    return "<h3>Curves</h3><div class='charts'>" + "".join(parts) + "</div>"


def _multiclass_plots(summary: dict[str, Any]) -> str:
    metrics = summary.get("metrics") or {}
    classes = list((summary.get("task") or {}).get("classes") or [])
    parts = []
    entries = (summary.get("plots") or {}).get("multiclass_confusion") or []
    if entries:
        size = max(max(a, p) for a, p, _ in entries) + 1
        names = [classes[i] if i < len(classes) else str(i) for i in range(size)]
        counts = [[0.0] * size for _ in range(size)]
        for actual, predicted, count in entries:
            if 0 <= actual < size and 0 <= predicted < size:
                counts[actual][predicted] += count
        parts.append(captioned(charts.matrix("confusion_matrix", names, counts, "confusion matrix"),
                             "Confusion matrix: each row an actual class, the predicted class by highest probability."))
    for name in ("precision", "recall"):
        values = sorted((int(k.rsplit(":", 1)[1]), v) for k, v in metrics.items() if k.startswith(f"{name}/classId:"))
        if values:
            bars = [(classes[i] if i < len(classes) else str(i), v, "") for i, v in values]
            parts.append(captioned(charts.bars(f"{name}_per_class", bars, f"{name} per class", width=360),
                                 f"{name.capitalize()} per class."))
    if not parts:
        return "<p class='note'>The Evaluator recorded no per-class figures.</p>"
    return "<h3>Per class</h3><div class='charts'>" + "".join(parts) + "</div>"


def _regression_plots(summary: dict[str, Any]) -> str:
    points = (summary.get("plots") or {}).get("predicted_actual") or []
    if not points:
        return "<p class='note'>No predictions were recorded to draw against the labels.</p>"
    pairs = [(float(p), float(a)) for p, a in points]
    residuals = sorted(a - p for p, a in pairs)
    low, high = residuals[0], residuals[-1]
    width = (high - low) / 20 or 1.0
    counts = [0.0] * 20
    for r in residuals:
        counts[min(19, int((r - low) / width))] += 1
    return ("<h3>Predictions</h3><div class='charts'>"
            + captioned(charts.lines("predicted_actual", [("eval rows", pairs)], "predicted against actual",
                                   "predicted", "actual", diagonal=True, points=True),
                      f"Predicted against actual on {len(pairs)} eval rows; dashed: a perfect model.")
            + captioned(charts.bars("residuals", [(f"{low + i * width:.3g}", c, "") for i, c in enumerate(counts)],
                                  "residuals", width=360, bar_height=9),
                      "Residuals (actual minus predicted), 20 bins.")
            + "</div>")


def no_skill_figures(summary: dict[str, Any]) -> dict[str, float]:
    """The Exporter's no-skill figures of the eval rows under the Evaluator's names (a binary accuracy is TFMA's
    binary_accuracy)."""
    export = export_report(summary)
    figures = dict(export.no_skill) if export else {}
    if (summary.get("task") or {}).get("kind", "binary") == "binary" and "accuracy" in figures:
        figures["binary_accuracy"] = figures.pop("accuracy")
    return figures


def _baseline(summary: dict[str, Any], metric: str) -> str:
    baseline = summary.get("baseline") or {}
    blessed = summary.get("blessed")
    verdict = {True: "<span class='good'>blessed</span>", False: "<span class='bad'>not blessed</span>",
               None: "not judged (no threshold set and no baseline)"}[blessed]
    parts = [f"<h3>Comparison with the baseline</h3><p>Verdict: {verdict}.</p>"]
    if "Evaluator" in (summary.get("cached_stages") or []):
        # A cached Evaluator's verdict is the earlier run's: reading it as this run's comparison misleads.
        parts.append("<p class='note'>The Evaluator was served from the cache: this is the verdict and the "
                     "comparison of the earlier run that evaluated this same model, not a new evaluation.</p>")
    candidate = summary.get("metrics") or {}
    base = baseline.get("metrics") or {}
    no_skill = no_skill_figures(summary)
    names = [n for n in (metric, "auc", "binary_accuracy", "precision", "recall", "calibration", "macro_auc",
                         "accuracy", "log_loss", "rmse", "mae", "r2", "example_count") if n in (base or candidate)]
    names = list(dict.fromkeys(names))
    shown = {n: (whole if n == "example_count" else num) for n in names}
    if base or no_skill:
        # The no-skill column: what ignoring the features scores on the same eval rows, beside each figure.
        head = ["metric", "candidate"] + (["no skill"] if no_skill else []) + (["baseline", "change"] if base else [])
        rows = [[esc(n), shown[n](candidate.get(n, float("nan")))]
                + ([num(no_skill[n]) if n in no_skill else ""] if no_skill else [])
                + ([shown[n](base[n]), f"{candidate[n] - base[n]:+.4f}" if n in candidate else ""] if base else [])
                for n in names]
        parts.append(tabulate(head, rows))
    if not base:
        parts.append("<p class='note'>No baseline model: the first blessed model of this pipeline, or "
                     "evaluation.baseline is none. The bounds alone decided (evaluation.lower_bound, upper_bound "
                     "and no_skill).</p>")
    failures = baseline.get("failures") or []
    if summary.get("blessing_failure"):
        parts.append(f"<p class='bad'>Not blessed: {esc(summary['blessing_failure'])}.</p>")
    elif failures:
        parts.append("<p class='bad'>Failed thresholds:</p><ul>" + "".join(f"<li>{esc(f)}</li>" for f in failures)
                     + "</ul>")
    return "".join(parts)


def _evaluation(summary: dict[str, Any]) -> str:
    if not summary.get("metrics"):
        return "<p class='note'>The Evaluator did not run in this run.</p>"
    kind = (summary.get("task") or {}).get("kind", "binary")
    metric = task_metric_name(summary)
    plots = {"binary": _binary_plots, "multiclass": _multiclass_plots, "regression": _regression_plots}[kind]
    return (f"<p>{esc(kind)} model judged by {esc(metric)}.</p>" + _slices(summary, metric) + plots(summary)
            + _baseline(summary, metric))


def _calibration(summary: dict[str, Any]) -> str:
    record = calibration_record(summary)
    kind = (summary.get("task") or {}).get("kind", "binary")
    if record is None and kind == "regression":
        return "<p class='note'>A regression model serves a value: it has no probabilities to calibrate.</p>"
    if record is None and kind == "multiclass":
        return ("<p class='note'>No calibration step ran for this model: its probabilities are served as trained "
                "and its answer is the most probable class.</p>")
    if record is None:
        return (f"<p class='note'>No calibration step ran for this model: its probabilities are served as trained "
                f"and the decision threshold is {DEFAULT_THRESHOLD}.</p>")
    threshold = record.threshold
    facts = [["method", esc(record.method)], ["fitted on", esc(record.fitted_on)], ["rows", num(record.rows)],
             ["threshold objective", esc(record.objective)],
             ["decision threshold", "none: the most probable class" if threshold is None else num(threshold)]]
    if record.positive_rate_fitted is not None:
        facts.append(["positive rate", f"{record.positive_rate_fitted:.1%} of the rows fitted on, "
                                       f"{record.positive_rate_measured:.1%} of the {num(record.measured_rows)} rows "
                                       "measured on"])
    before, after = record.before.to_dict(), record.after.to_dict()
    figures = [[esc(name), num(before[name]), num(after[name])] for name in before]
    heads = (["before: as trained", "after: calibrated"] if threshold is None else
             [f"before: as trained, at {DEFAULT_THRESHOLD}", f"after: calibrated, at {threshold:.4g}"])
    rejected = (f"<p class='few'>Not applied: {esc(record.note or '')}; both columns are the model as trained."
                "</p>" if not record.applied else "")
    diagram = ""
    if record.reliability_before:
        what = "share of positives" if threshold is not None else "share right"
        series = [(name, [(x, y) for x, y, _ in bins])
                  for name, bins in (("as trained", record.reliability_before),
                                     ("calibrated", record.reliability_after))]
        diagram = captioned(charts.lines("reliability", series, "reliability diagram", "mean predicted probability"
                                       if threshold is not None else "mean confidence", what, diagonal=True,
                                       bounds=(0, 1, 0, 1), points=True),
                          f"Reliability on the {esc(record.measured_on or 'eval rows')}: ten equal-mass bins of "
                          "rows; on the dashed line a probability means what it says (ece is the weighted gap).")
    return (rejected + tabulate(["", ""], facts) + tabulate(["figure", *heads], figures) + diagram
            + "<p class='note'>Calibration is mean prediction over mean label: 1.0 when probabilities mean what "
              "they say; ece, the expected calibration error over ten equal-mass bins of rows, is 0 then.</p>")


def _export(summary: dict[str, Any]) -> str:
    report = export_report(summary)
    if report is None:
        return "<p class='note'>Nothing was exported: the Exporter did not run (a stage before it failed).</p>"
    verdict = ("<span class='good'>every format agrees with the SavedModel</span>" if report.passed
               else "<span class='bad'>FAILED: nothing is pushed</span>")
    return (f"<p>{verdict}; {report.eval_rows:,} eval rows through every format.</p>{table_html(report)}"
            f"<img data-chart='export' alt='size and latency per format' "
            f"src='data:image/png;base64,{chart_png(report)}'>")


def _json_value(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def rest_example(model_name: str, version: int, row: dict[str, Any], url: str = REST_URL) -> str:
    """A curl command that predicts `row` with one version over TF Serving's REST API."""
    body = json.dumps({"instances": [{k: _json_value(v) for k, v in row.items()}]}, indent=1)
    return (f"curl -s -X POST {url}/v1/models/{model_name}/versions/{version}:predict \\\n"
            f"  -H 'Content-Type: application/json' \\\n  -d {shlex.quote(body)}")


def grpc_example(model_name: str, version: int, row: dict[str, Any], target: str = GRPC_TARGET) -> str:
    """Python that predicts `row` with one version over TF Serving's gRPC API (the project's client)."""
    features = ",\n".join(f"    {k!r}: {_json_value(v)!r}" for k, v in row.items())
    return (f"from serving.clients import GrpcClient\n\nrow = {{\n{features},\n}}\n"
            f"with GrpcClient({target!r}) as client:\n"
            f"    print(client.predict_outputs([row], {model_name!r}, version={version}))")


def publication_state(published_new: bool, labels: list[str], serving: bool) -> str:
    """What a run's publication changed and what serves it, as the console and the page both say it: nothing_new
    (an earlier run published this model), stable (labelled stable), served (the version served) or waiting (a
    rollout moves traffic to it)."""
    if not published_new:
        return "nothing_new"
    if "stable" in labels:
        return "stable"
    return "served" if serving else "waiting"


def _publication_sentence(summary: dict[str, Any]) -> str:
    version = esc(summary.get("published_version"))
    # A summary from before these fields were recorded published what it names.
    state = publication_state(summary.get("published_new", True), summary.get("published_labels") or [],
                              bool(summary.get("published_serving")))
    return {"nothing_new": f"Nothing new was published: version {version} already holds this model (an earlier "
                           "run published it).",
            "stable": "It is labelled stable: it serves without a rollout.",
            "served": "It is the version served: it serves without a rollout.",
            "waiting": f"Publishing routes no traffic: <code>mlops rollout start --version {version}</code> moves it "
                       "to serving."}[state]


def _serving(summary: dict[str, Any]) -> str:
    serving = summary.get("serving") or {}
    version = summary.get("published_version")
    if version is None:
        return "<p class='note'>Nothing was published: the model was not blessed.</p>"
    model = serving.get("model_name") or "model"
    row = serving.get("row") or {}
    parts = [f"<p>Version <b>{esc(version)}</b> of <b>{esc(model)}</b> at <code>{esc(summary.get('pushed_path'))}"
             f"</code>. {_publication_sentence(summary)} Serve the repository locally with <code>mlops serve</code> "
             "(REST on 8501, gRPC on 8500), then:</p>"]
    if row:
        parts.append(f"<h3>REST</h3><pre>{esc(rest_example(model, version, row))}</pre>"
                     f"<h3>gRPC (Python)</h3><pre>{esc(grpc_example(model, version, row))}</pre>"
                     "<p class='note'>The features are those of a real eval row.</p>")
    else:
        parts.append("<p class='note'>No eval row was recorded to build an example request from.</p>")
    return "".join(parts)


def _header(summary: dict[str, Any]) -> str:
    metrics = summary.get("metrics") or {}
    metric = task_metric_name(summary)
    kind = (summary.get("task") or {}).get("kind", "binary")
    facts = [f"{esc(kind)} task", f"{summary.get('elapsed_seconds', 0):.1f}s"]
    if metric in metrics:
        facts.append(f"{esc(metric)} {metrics[metric]:.4f} on {metrics.get('example_count', 0):,.0f} eval rows")
    if summary.get("failure"):
        facts.append(f"<span class='bad'>failed in {esc(summary.get('failed_stage') or 'the run')}</span>")
    else:
        facts.append({True: "<span class='good'>blessed</span>", False: "<span class='bad'>not blessed</span>",
                      None: "not judged"}[summary.get("blessed")])
    if summary.get("published_version") is not None and not summary.get("published_new", True):
        facts.append(f"nothing new published (version {esc(summary['published_version'])} holds this model)")
    elif summary.get("published_version") is not None:
        facts.append(f"published as version {esc(summary['published_version'])}")
    nav = "".join(f"<a href='#{s}'>{esc(section_title(s, summary))}</a>" for s in SECTIONS)
    log = f" &middot; log: <code>{esc(summary['log_path'])}</code>" if summary.get("log_path") else ""
    return (f"<p><a href='../index.html'>all runs</a>{log}</p><h1>Run {esc(summary.get('run_id', ''))}</h1>"
            f"<p>{' &middot; '.join(facts)}</p>{_failure(summary)}<nav>{nav}</nav>")


def _failure(summary: dict[str, Any]) -> str:
    """What failed, where and what to do (the error's own sentence), at the top of a failed run's report."""
    if not summary.get("failure"):
        return ""
    log = f" The full log: <code>{esc(summary['log_path'])}</code>." if summary.get("log_path") else ""
    return (f"<section id='failure'><h2>The run failed in {esc(summary.get('failed_stage') or 'the run')}</h2>"
            f"<p class='bad'>{esc(summary['failure'])}</p><p>The sections below show what the stages before it "
            f"recorded.{log}</p></section>")


def run_page(summary: dict[str, Any]) -> str:
    """The whole report of one run, from a RunSummary as a dict."""
    render = {"timeline": _timeline, "data": _data, "training": _training, "evaluation": _evaluation,
              "calibration": _calibration,
              "optimization": lambda summary: optimization_html(optimization_report(summary)),
              "export": _export, "serving": _serving}
    body = "".join(f"<section id='{s}'><h2>{esc(section_title(s, summary))}</h2>{render[s](summary)}</section>"
                   for s in SECTIONS)
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>Run {esc(summary.get('run_id', ''))}"
            f"</title><style>{STYLE}</style></head><body>{_header(summary)}{body}</body></html>\n")


def index_page(summaries: list[tuple[str, dict[str, Any]]]) -> str:
    """Every run (folder name, summary.json), newest first: key figures and a link to its report."""
    rows = []
    for folder, summary in summaries:
        metrics = summary.get("metrics") or {}
        metric = task_metric_name(summary)
        rows.append([
            # "./" and quoting: a run id such as "2026-11-30T10:28:39" must not read as a URL scheme.
            f"<a href='./{esc(quote(folder, safe=':'))}/summary.html'>{esc(summary.get('run_id', folder))}</a>",
            esc((summary.get("task") or {}).get("kind", "")),
            f"{esc(metric)} {metrics[metric]:.4f}" if metric in metrics else "",
            whole(metrics.get("example_count")),
            f"<span class='bad'>failed in {esc(summary.get('failed_stage') or 'the run')}</span>"
            if summary.get("failure") else
            {True: "<span class='good'>yes</span>", False: "<span class='bad'>no</span>", None: "not judged"}[
                summary.get("blessed")],
            esc(summary.get("published_version") if summary.get("published_version") is not None else ""),
            f"{summary.get('elapsed_seconds', 0):.1f}s",
            f"{len(summary.get('cached_stages') or [])}/{len(summary.get('stage_seconds') or {})}",
        ])
    table = tabulate(["run", "task", "metric", "eval rows", "blessed", "version", "time", "cached stages"], rows) \
        if rows else "<p>No runs yet: mlops run.</p>"
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>Runs</title><style>{STYLE}</style>"
            f"</head><body><h1>Runs</h1><section id='runs'>{table}</section></body></html>\n")


def write_index(runs_dir: str) -> str:
    """outputs/runs/index.html from every run folder's summary.json; returns its path."""
    found = []
    for folder in sorted(os.listdir(runs_dir), reverse=True):
        path = os.path.join(runs_dir, folder, RUN_SUMMARY_JSON)
        if os.path.isfile(path):
            try:
                with open(path) as f:
                    found.append((folder, json.load(f)))
            except (OSError, ValueError):
                continue  # a half-written or foreign file: the index lists the others
    index = os.path.join(runs_dir, RUNS_INDEX_HTML)
    with open(index, "w") as f:
        f.write(index_page(found))
    return index
