"""A finished rollout as files a person can open: the record as JSON and a self-contained HTML page (steps,
verification figures per step against their limits, the decision)."""
from __future__ import annotations

import html
import json
import os
import tempfile
from pathlib import Path
from typing import Any

_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:70em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}
th{background:#f3f3f3}.passed{color:#1a7f37}.failed{color:#cf222e}.num{text-align:right}
h1 .promoted{color:#1a7f37}h1 .rolled_back{color:#cf222e}"""


def report_paths(folder: str | Path, record: dict[str, Any]) -> tuple[str, str]:
    """The record's JSON and page under `folder`: a local folder or any URI tf.io.gfile serves (gs://...)."""
    stem = f"{str(folder).rstrip('/')}/{record['model']}-v{record['candidate']}-{record['id']}"
    return f"{stem}.json", f"{stem}.html"


def _write_atomically(path: str, text: str) -> None:
    if "://" not in path:
        folder = Path(path).parent
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{Path(path).name}.", dir=folder)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
        return
    import tensorflow as tf

    # An object store writes an object whole: readers never see half of it.
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(text)


def write_report(folder: str | Path, record: dict[str, Any]) -> str:
    """Writes `<model>-v<candidate>-<id>.json` and `.html` under `folder` (replacing them whole); returns the page."""
    json_path, html_path = report_paths(folder, record)
    _write_atomically(json_path, json.dumps(record, indent=2, sort_keys=True))
    _write_atomically(html_path, render_html(record))
    return html_path


def _e(value: Any) -> str:
    return html.escape(str(value))


def _number(value: Any, digits: int) -> str:
    return f"{value:.{digits}f}" if isinstance(value, int | float) else "-"


def _verification_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [event["figures"] for event in record.get("events", []) if "figures" in event]


def _chart(rows: list[dict[str, Any]]) -> str:
    """Canary traffic share at each verification, green where it passed, red where it failed."""
    if not rows:
        return ""
    bar, gap, height = 48, 16, 120
    width = len(rows) * (bar + gap) + gap
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 40}" role="img" '
             'aria-label="canary traffic share at each verification">']
    for i, figures in enumerate(rows):
        weight = figures.get("weight", 0)
        filled = max(2, height * weight // 100)
        x = gap + i * (bar + gap)
        color = "#cf222e" if figures.get("error") else "#1a7f37"
        parts.append(f'<rect x="{x}" y="{height - filled}" width="{bar}" height="{filled}" fill="{color}"/>')
        parts.append(f'<text x="{x + bar // 2}" y="{height + 16}" text-anchor="middle" font-size="12">'
                     f'{weight}%</text>')
        parts.append(f'<text x="{x + bar // 2}" y="{height + 32}" text-anchor="middle" font-size="11">step {i}</text>')
    parts.append("</svg>")
    return "".join(parts)


def render_html(record: dict[str, Any]) -> str:
    outcome = record.get("outcome", "in progress")
    limits = record.get("limits") or {}
    summary = [("model", record["model"]), ("candidate version", record["candidate"]),
               ("stable version", record["stable"]), ("backend", record.get("backend", "")),
               ("traffic steps", ", ".join(f"{s}%" for s in record.get("steps", []))),
               ("started", record.get("started_at", "")), ("finished", record.get("finished_at", "")),
               ("outcome", outcome.replace("_", " ")), ("reason", record.get("reason", "") or "-"),
               ("rollout id", record["id"])]
    out = ["<!DOCTYPE html><html><head><meta charset='utf-8'>",
           f"<title>Rollout of {_e(record['model'])} version {_e(record['candidate'])}: {_e(outcome)}</title>",
           f"<style>{_STYLE}</style></head><body>",
           f"<h1>Rollout of {_e(record['model'])} version {_e(record['candidate'])}: "
           f"<span class='{_e(outcome)}'>{_e(outcome.replace('_', ' ').upper())}</span></h1>",
           "<table>", *(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in summary), "</table>"]
    if limits:
        out += ["<h2>Limits</h2><table>",
                *(f"<tr><th>{_e(k)}</th><td class='num'>{_e(v)}</td></tr>" for k, v in sorted(limits.items())),
                "</table>"]
    rows = _verification_rows(record)
    out.append("<h2>Verification before each step</h2>")
    if not rows:
        out.append("<p>No verification ran: the candidate never became AVAILABLE on the canary servers, or the "
                   "rollout was promoted or rolled back by hand before the first one.</p>")
    else:
        out.append(_chart(rows))
        out.append("<table><tr><th>step</th><th>canary traffic</th><th>canary servers</th><th>golden rows</th>"
                   "<th>max |diff| REST</th><th>max |diff| gRPC</th><th>REST vs gRPC</th><th>window</th>"
                   "<th>requests</th><th>errors</th><th>error rate</th><th>p99 ms</th><th>verdict</th></tr>")
        for i, figures in enumerate(rows):
            golden, window = figures.get("golden") or {}, figures.get("window") or {}
            verdict = (f"<td class='failed'>FAILED: {_e(figures['error'])}</td>" if figures.get("error")
                       else f"<td class='failed'>INCONCLUSIVE: {_e(window['inconclusive'])}</td>"
                       if window.get("inconclusive") else "<td class='passed'>passed</td>")
            window_text = f"{window['seconds']}s ({window['source']})" if window else "-"
            cells = [i, f"{figures.get('weight', 0)}%", figures.get("canary_servers", "-"), golden.get("rows", "-"),
                     _number(golden.get("rest_max_abs_diff"), 6), _number(golden.get("grpc_max_abs_diff"), 6),
                     _number(golden.get("rest_grpc_max_abs_diff"), 6), window_text,
                     _number(window.get("requests"), 0), _number(window.get("errors"), 0),
                     _number(window.get("error_rate"), 4), _number(window.get("p99_ms"), 1)]
            out.append("<tr>" + "".join(f"<td class='num'>{_e(c)}</td>" for c in cells) + verdict + "</tr>")
        out.append("</table>")
    out += ["<h2>Steps</h2><table><tr><th>at (UTC)</th><th>phase</th><th>next</th><th>what happened</th></tr>",
            *(f"<tr><td>{_e(e.get('at', ''))}</td><td>{_e(e.get('phase', ''))}</td><td>{_e(e.get('next', ''))}</td>"
              f"<td>{_e(e.get('message', ''))}</td></tr>" for e in record.get("events", [])),
            "</table></body></html>"]
    return "\n".join(out) + "\n"
