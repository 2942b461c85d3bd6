"""A monitor record (monitor.json) as one self-contained HTML page: which version, which window, how many requests,
and per feature the training against the serving distribution as inline SVG (reports/charts.py), the distances and
their thresholds, the anomalies. No script, nothing fetched at view time."""
from __future__ import annotations

import html
import math
import os
import pathlib
import urllib.parse
from typing import Any

from reports import charts

STYLE = charts.PAGE_STYLE + """
.verdict{font-size:1.15em}.charts{display:flex;flex-wrap:wrap;gap:18px;align-items:flex-start}
.feature{border-top:1px solid #ddd;margin-top:1em}.flagged h3{color:#b00}
table.features td:nth-child(2),table.features td:nth-child(3),table.features td:last-child{text-align:left}
"""
# The series of every chart, in the charts' colour order.
SERIES = (("training", "training"), ("serving", "this window"), ("previous", "previous window"))
SHOWN_VALUES = 10


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return f"{value:,}" if isinstance(value, int) else f"{value:.4f}"
    return "-"


def _table(head: list[str], rows: list[list[str]], css: str = "") -> str:
    return (f"<table class='{css}'><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows) + "</table>")


def _distance(distance: dict[str, Any] | None) -> tuple[str, str]:
    if distance is None:
        return "-", "-"
    css = "bad" if distance["crossed"] else ""
    return f"<span class='{css}'>{_num(distance['value'])}</span>", _num(distance["threshold"])


def _span(window: dict[str, Any]) -> str:
    if not window["files"]:
        return "no log file"
    return (f"{_e(window['from'])} to {_e(window['to'])} ({window['files']} log "
            f"file{'s' * (window['files'] != 1)})")


def _header(record: dict[str, Any]) -> str:
    window, previous, asked = record["window"], record["previous"], record["asked"]
    if asked["last"] is not None:
        asked_text = f"the last {asked['last']:,} requests"
    else:
        asked_text = f"requests logged from {_e(asked['since'])} to {_e(asked['until'])}"
    others = {v: n for v, n in window["versions"].items() if v != str(record["version"])}
    rates = window["sampling_rates"]
    served = ""
    if len(rates) == 1 and rates[0] > 0:
        served = f" (sampled at {rates[0]:.0%}: about {window['requests'] / rates[0]:,.0f} served)"
    rows = [
        ["model", _e(record["model"])],
        ["version", _e(record["version"] if record["version"] is not None else "none")],
        ["window asked", asked_text],
        ["window read", _span(window)],
        ["requests judged", f"{window['requests']:,} requests, {window['rows']:,} rows{served}"],
        ["previous window", f"{previous['requests']:,} requests, {_span(previous)}"
         + ("" if previous["judged"] else f" &mdash; {_e(previous.get('note') or 'drift not judged')}")],
        ["judged at", _e(record["finished_at"])],
    ]
    if others:
        rows.insert(5, ["other versions in the window",
                        ", ".join(f"version {_e(v)}: {n:,} requests" for v, n in others.items())
                        + " (not judged: <code>--version</code> judges one)"])
    left_out = {**window["skipped"]}
    if left_out:
        rows.append(["records left out", ", ".join(f"{n:,} {_e(why)}" for why, n in left_out.items())])
    if window["truncated_files"]:
        rows.append(["files still being written", ", ".join(_e(p) for p in window["truncated_files"])])
    return "<table>" + "".join(f"<tr><th class='left'>{k}</th><td class='left'>{v}</td></tr>" for k, v in rows) \
        + "</table>"


def _verdict(record: dict[str, Any]) -> str:
    if not record["judged"]:
        return f"<p class='verdict'>Not judged: {_e(record['note'])}.</p>"
    flagged = record["flagged"]
    if flagged:
        return (f"<p class='verdict bad'>{len(flagged)} feature{'s' * (len(flagged) != 1)} crossed a threshold or "
                f"broke the training schema: {_e(', '.join(flagged))}.</p>")
    return "<p class='verdict good'>No threshold crossed: every served feature is within its thresholds.</p>"


def _summary(record: dict[str, Any]) -> str:
    rows = []
    for feature in record["features"]:
        skew, skew_limit = _distance(feature["skew"])
        drift, drift_limit = _distance(feature["drift"])
        measure = (feature["skew"] or feature["drift"] or {}).get("measure", "-")
        name = f"<a href='#feature-{_e(feature['name'])}'>{_e(feature['name'])}</a>"
        anomalies = "<br>".join(_e(a) for a in feature["anomalies"]) or "-"
        rows.append([name, _e(feature["kind"]), _e(measure), skew, skew_limit, drift, drift_limit,
                     f"<span class='{'bad' if feature['anomalies'] else ''}'>{anomalies}</span>"])
    return _table(["feature", "kind", "measure", "skew", "threshold", "drift", "threshold",
                   "anomalies (training schema, SERVING)"], rows, "features")


def _numeric_chart(name: str, distributions: dict[str, Any]) -> str:
    series = [(title, [(x, y) for x, y in (distributions.get(key) or {}).get("cdf", [])]) for key, title in SERIES
              if distributions.get(key) and distributions[key].get("cdf")]
    return charts.lines(f"cdf-{name}", series, f"{name}: cumulative share of rows", name,
                        "share of rows at or below", width=440, height=240, bounds=None)


def _categorical_chart(name: str, distributions: dict[str, Any]) -> str:
    shares = {key: dict((value, share) for value, share in (distributions.get(key) or {}).get("top", []))
              for key, _ in SERIES if distributions.get(key)}
    values = sorted({v for top in shares.values() for v in top}, key=lambda v: -max(s.get(v, 0.0)
                                                                                    for s in shares.values()))
    values = values[:SHOWN_VALUES]
    series = [(title, [shares[key].get(v, 0.0) for v in values]) for key, title in SERIES if key in shares]
    return charts.grouped_bars(f"shares-{name}", values, series, f"{name}: share of rows per value")


def _missing(distributions: dict[str, Any]) -> str:
    parts = [f"{title} {distributions[key]['missing']:.1%}" for key, title in SERIES if distributions.get(key)]
    return "rows without a value: " + ", ".join(parts) if parts else ""


def _feature(feature: dict[str, Any]) -> str:
    name, distributions = feature["name"], feature["distributions"]
    chart = (_categorical_chart(name, distributions) if feature["kind"] == "categorical"
             else _numeric_chart(name, distributions))
    lines = []
    for comparison, against in (("skew", "training"), ("drift", "the previous window")):
        distance = feature[comparison]
        if distance is None:
            lines.append(f"{comparison}: not measured")
            continue
        verdict = "<span class='bad'>above</span>" if distance["crossed"] else "within"
        lines.append(f"{comparison} against {against}: {_e(distance['measure'])} {_num(distance['value'])}, "
                     f"{verdict} the threshold {_num(distance['threshold'])}")
    lines += [f"<span class='bad'>anomaly: {_e(a)}</span>" for a in feature["anomalies"]]
    css = "feature flagged" if feature["flagged"] else "feature"
    figure = f"<figure>{chart}<figcaption class='note'>{_e(_missing(distributions))}</figcaption></figure>" \
        if chart else "<p class='note'>No values to draw.</p>"
    return (f"<section class='{css}' id='feature-{_e(name)}'><h3>{_e(name)} <span class='note'>({_e(feature['kind'])}"
            f"{', flagged' if feature['flagged'] else ''})</span></h3><div class='charts'>{figure}<div>"
            + "<br>".join(lines) + "</div></div></section>")


def report_link(page_path: str, report: str) -> str:
    """The href from the page to a run report: relative when both lie on this machine below one folder (the tree can
    be moved or served as a whole), else the report's absolute file URI."""
    if "://" in report:
        return report
    if "://" not in page_path:
        page_folder, target = os.path.abspath(os.path.dirname(page_path)), os.path.abspath(report)
        if os.path.commonpath([page_folder, target]) != os.path.abspath(os.sep):
            relative = urllib.parse.quote(os.path.relpath(target, page_folder), safe="/:")
            # "./": a first segment such as a run id "2026-11-30T10:28:39" must not read as a URL scheme.
            return relative if relative.startswith("../") else f"./{relative}"
    return pathlib.Path(os.path.abspath(report)).as_uri()


def _retrain(record: dict[str, Any]) -> str:
    retrain = record.get("retrain")
    if not retrain:
        return ""
    css = {"published": "good", "failed": "bad", "not blessed": "bad"}.get(retrain["outcome"], "")
    parts = ["<h2 id='retrain'>Retraining</h2>", f"<p class='verdict {css}'>{_e(retrain['note'])}.</p>"]
    if retrain["started"]:
        rows = [["data", _e(retrain.get("data_path"))], ["started at", _e(retrain.get("started_at"))],
                ["finished at", _e(retrain.get("finished_at") or "-")]]
        if retrain.get("run_id"):
            rows.insert(0, ["run", _e(retrain["run_id"])])
        if retrain.get("report"):
            href = report_link(record["files"]["html"], retrain["report"])
            rows.append(["run report", f"<a href='{_e(href)}'>{_e(retrain['report'])}</a>"])
        if retrain.get("error"):
            rows.append(["error", f"<span class='bad'>{_e(retrain['error'])}</span>"])
        parts.append("<table>" + "".join(f"<tr><th class='left'>{k}</th><td class='left'>{v}</td></tr>"
                                         for k, v in rows) + "</table>")
    return "".join(parts)


def monitor_html(record: dict[str, Any]) -> str:
    """The page of one monitor run."""
    title = f"Skew and drift of {record['model']} version {record['version']}"
    thresholds = record["thresholds"]
    parts = [f"<!doctype html><html lang='en'><meta charset='utf-8'><title>{_e(title)}</title><style>{STYLE}</style>",
             f"<h1>{_e(title)}</h1>", _verdict(record), _header(record), _retrain(record)]
    if record["judged"]:
        parts += ["<h2>Features</h2>",
                  f"<p class='note'>Skew compares the window with the version's training split, drift with the window "
                  f"before it. Categorical features: L-infinity distance of the value shares (default threshold "
                  f"{_num(thresholds['categorical_skew'])} skew, {_num(thresholds['categorical_drift'])} drift); "
                  f"numeric ones: Jensen-Shannon divergence of the quantile histograms (default "
                  f"{_num(thresholds['numeric_skew'])} skew, {_num(thresholds['numeric_drift'])} drift). A distance "
                  "above its threshold, or an anomaly against the training schema, flags the feature.</p>",
                  _summary(record), "<h2>Distributions</h2>"]
        # The flagged features first: what a reader came for.
        parts += [_feature(feature) for feature in sorted(record["features"], key=lambda f: not f["flagged"])]
    parts.append(f"<p class='note'>Record: {_e(record['files']['json'])}; gauges: {_e(record['files']['prom'])}.</p>")
    return "\n".join(parts) + "\n</html>\n"
