"""A finished rollout as files a person can open: the record as JSON and a self-contained HTML page (steps,
verification figures per step against their limits, the decision, and where a Prometheus measured the servers, the
traffic per track over the rollout's time: request rate, error rate and p99 latency, with the steps and the verdict
marked)."""
from __future__ import annotations

import calendar
import html
import json
import math
import os
import tempfile
import time
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


def write_report(folder: str | Path, record: dict[str, Any], metrics: Any = None) -> str:
    """Writes `<model>-v<candidate>-<id>.json` and `.html` under `folder` (replacing them whole); returns the page.
    With `metrics` (a PrometheusSource: the backend's), the page charts the traffic Prometheus saw."""
    json_path, html_path = report_paths(folder, record)
    _write_atomically(json_path, json.dumps(record, indent=2, sort_keys=True))
    _write_atomically(html_path, render_html(record, traffic_of(record, metrics)))
    return html_path


def _seconds(stamp: str) -> float | None:
    try:
        return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))
    except (TypeError, ValueError):
        return None


def traffic_of(record: dict[str, Any], metrics: Any) -> dict[str, Any] | None:
    """The rollout's traffic per track from Prometheus (query_range over its start to its end, a little either side),
    {"error": why} when Prometheus could not answer, None without one."""
    if metrics is None or not hasattr(metrics, "traffic"):
        return None
    start = _seconds(record.get("started_at", ""))
    end = _seconds(record.get("finished_at", "")) or time.time()
    if start is None:
        return None
    try:
        # Event stamps are whole seconds: one second either side holds the first and last step.
        return metrics.traffic(record["model"], start - 1, max(end + 1, start + 2))
    except Exception as e:  # noqa: BLE001 - a report without its chart beats no report
        return {"error": f"Prometheus could not be read for the traffic chart: {e}"}


def _e(value: Any) -> str:
    return html.escape(str(value))


def _stable_errors(evidence: dict[str, Any] | None) -> str:
    return f"{evidence['stable_errors']} of {evidence['stable_requests']}" if evidence else "-"


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


_TRACK_COLORS = {"stable": "#0969da", "canary": "#bf8700"}
_FIGURES = (("user_requests_per_second", "user requests per second", "{:.1f}"),
            ("error_rate", "users' error rate", "{:.3f}"),
            ("verifier_requests_per_second", "verifier requests per second", "{:.1f}"),
            ("p99_ms", "p99 latency (ms)", "{:.1f}"))


def _markers(record: dict[str, Any]) -> list[tuple[float, str, str]]:
    """(time, label, color): each verification (the step it verified, passed or failed) and the verdict."""
    marks = []
    steps = record.get("steps", [])
    for event in record.get("events", []):
        at = _seconds(event.get("at", ""))
        figures = event.get("figures")
        if at is None or figures is None:
            continue
        weight = figures.get("weight", 0)
        if figures.get("error"):
            marks.append((at, f"{weight}% failed", "#cf222e"))
            continue
        later = [s for s in steps if s > weight]
        marks.append((at, f"{weight}% verified, to {later[0]}%" if later else f"{weight}% verified, promote",
                      "#1a7f37"))
    end = _seconds(record.get("finished_at", ""))
    if end is not None and record.get("outcome"):
        marks.append((end, record["outcome"].replace("_", " ").upper(),
                      "#1a7f37" if record["outcome"] == "promoted" else "#cf222e"))
    return marks


# A marker label's width per character at font-size 9, on the wide side (capitals, digits), so that labels laid
# side by side never touch in a browser; tests measure the real widths in chromium.
_LABEL_CHAR_PX = 6.0
_LABEL_ROW_PX = 11
# Clock-time ticks on the chart's axis: the smallest of these steps that gives at most _MAX_TICKS ticks.
_TICK_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)
_MAX_TICKS = 8


def label_rows(spans: list[tuple[float, float]], gap: float = 4.0) -> list[int]:
    """The row of each label, given its (left, right) in pixels, in order: the first row where it overlaps no
    label already placed there (with `gap` pixels between), so that close markers' labels stack instead of
    overlapping."""
    placed: list[list[tuple[float, float]]] = []
    rows = []
    for left, right in spans:
        row = next((i for i, taken in enumerate(placed)
                    if all(right + gap <= a or b + gap <= left for a, b in taken)), len(placed))
        if row == len(placed):
            placed.append([])
        placed[row].append((left, right))
        rows.append(row)
    return rows


def clock_ticks(t0: float, t1: float) -> list[float]:
    """Round clock times (UTC seconds) between t0 and t1, at most _MAX_TICKS of them."""
    span = max(t1 - t0, 1e-9)
    step = next((s for s in _TICK_STEPS_S if span / s < _MAX_TICKS), _TICK_STEPS_S[-1])
    first = math.ceil(t0 / step) * step
    return [float(t) for t in range(int(first), int(t1) + 1, step) if t0 <= t <= t1]


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t))


def traffic_chart(record: dict[str, Any], traffic: dict[str, Any]) -> str:
    """One SVG panel per figure: a line per track over clock time (UTC), dashed lines at the steps and the verdict,
    their labels stacked where they would overlap."""
    times = traffic["times"]
    if len(times) < 2:
        return "<p>Prometheus holds too few samples of this rollout to chart.</p>"
    width, plot_height, left, right = 900, 108, 60, 20
    t0, t1 = times[0], times[-1]

    def x(t: float) -> float:
        return left + (width - left - right) * (t - t0) / (t1 - t0)

    markers = []
    for at, label, color in _markers(record):
        if t0 <= at <= t1:
            text_width = len(label) * _LABEL_CHAR_PX
            # A label that would run past the plot's right edge ends at its line instead.
            anchor_end = x(at) + 2 + text_width > width - right
            span = (x(at) - 2 - text_width, x(at) - 2) if anchor_end else (x(at) + 2, x(at) + 2 + text_width)
            markers.append((at, label, color, anchor_end, span))
    rows = label_rows([m[4] for m in markers])
    top = 22 + _LABEL_ROW_PX * max(rows, default=0)
    height = top + plot_height
    panels = []
    for key, title, fmt in _FIGURES:
        values = [v for figures in traffic["tracks"].values() for v in figures[key] if v is not None]
        top_value = max(values, default=0.0) or 1.0

        def y(v: float, top_value=top_value, top=top) -> float:
            return top + (height - top - 20) * (1 - v / top_value)

        parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
                 f'data-chart="traffic-{key}" aria-label="{_e(title)} per track over the rollout">',
                 f'<text x="{left}" y="14" font-size="12" font-weight="bold">{_e(title)}</text>',
                 f'<line x1="{left}" y1="{height - 20}" x2="{width - right}" y2="{height - 20}" stroke="#999"/>',
                 f'<text x="{left - 4}" y="{top + 4}" font-size="10" text-anchor="end">{fmt.format(top_value)}</text>',
                 f'<text x="{left - 4}" y="{height - 20}" font-size="10" text-anchor="end">0</text>',
                 f'<text x="{left - 4}" y="{height - 4}" font-size="10" text-anchor="end">UTC</text>']
        for tick in clock_ticks(t0, t1):
            parts.append(f'<line x1="{x(tick):.1f}" y1="{height - 20}" x2="{x(tick):.1f}" y2="{height - 16}" '
                         'stroke="#999"/>')
            parts.append(f'<text x="{x(tick):.1f}" y="{height - 4}" font-size="10" text-anchor="middle" '
                         f'data-tick="{tick:.0f}">{_clock(tick)}</text>')
        for (at, label, color, anchor_end, _), row in zip(markers, rows, strict=True):
            label_y = 32 + _LABEL_ROW_PX * row
            parts.append(f'<line x1="{x(at):.1f}" y1="{label_y - 8}" x2="{x(at):.1f}" y2="{height - 20}" '
                         f'stroke="{color}" stroke-dasharray="4 3"/>')
            label_x, anchor = (x(at) - 2, "end") if anchor_end else (x(at) + 2, "start")
            parts.append(f'<text x="{label_x:.1f}" y="{label_y}" font-size="9" fill="{color}" '
                         f'text-anchor="{anchor}" data-marker="{row}">{_e(label)}</text>')
        for track, figures in sorted(traffic["tracks"].items()):
            segment: list[str] = []
            segments = []
            for t, v in zip(times, figures[key], strict=True):
                if v is None or not math.isfinite(v):
                    if segment:
                        segments.append(segment)
                    segment = []
                else:
                    segment.append(f"{x(t):.1f},{y(v):.1f}")
            if segment:
                segments.append(segment)
            color = _TRACK_COLORS.get(track, "#666")
            for points in segments:
                parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" data-track="{_e(track)}" '
                             f'points="{" ".join(points)}"/>')
        parts.append("</svg>")
        panels.append("".join(parts))
    legend = " ".join(f"<span style='color:{_TRACK_COLORS.get(t, '#666')}'>&#9632; {_e(t)}</span>"
                      for t in sorted(traffic["tracks"]))
    return (f"<p>{legend}: what the servers counted, from Prometheus, over clock time (UTC). The users' requests are "
            "the predictions and failed requests less the verifier's predictions, which the servers count apart "
            "(:mlops:serving:verifier_request_count) and which are charted on their own. As TF Serving's "
            "request_count counts every failed request, failed status and metadata reads count as the users' errors "
            "too: the controller's polls for a version still loading (NOT_FOUND) show where a track has little "
            "traffic. The p99 is of every prediction, the verifier's included: a histogram cannot be split after "
            "the fact. At the shadow step the canary's users' requests are the copies the router sent it, whose "
            "answers no user got.</p>" + "<br>".join(panels))


def _watch_table(record: dict[str, Any]) -> list[str]:
    """The windows on the stable servers once all traffic was theirs: a promoted version's first users, stable's
    recovery after a rollback (rollout/verify.py Verifier.stable_window)."""
    watched = [(event.get("at", ""), event["watch"]) for event in record.get("events", []) if event.get("watch")]
    if not watched:
        return []
    out = ["<h2>After all traffic moved to the stable servers</h2>",
           "<table><tr><th>at (UTC)</th><th>after</th><th>version</th><th>window</th><th>requests</th><th>errors</th>"
           "<th>error rate</th><th>p99 ms</th><th>verdict</th></tr>"]
    for at, watch in watched:
        window = watch["window"]
        verdict = (f"<td class='failed'>FAILED: {_e(window['error'])}</td>" if window.get("error")
                   else f"<td class='failed'>INCONCLUSIVE: {_e(window['inconclusive'])}</td>"
                   if window.get("inconclusive") else "<td class='passed'>passed</td>")
        source = f"{window['seconds']:g}s ({window['source']}, {window.get('traffic', '')})" if "seconds" in window \
            else "-"
        cells = [_number(window.get("requests"), 0), _number(window.get("errors"), 0),
                 _number(window.get("error_rate"), 4), _number(window.get("p99_ms"), 1)]
        out.append(f"<tr><td>{_e(at)}</td><td>{_e(watch['after'])}</td><td class='num'>"
                   f"{_e(window.get('version', '-'))}</td><td>{_e(source)}</td>"
                   + "".join(f"<td class='num'>{_e(c)}</td>" for c in cells) + verdict + "</tr>")
    out.append("</table>")
    return out


def _cause_tables(rows: list[dict[str, Any]]) -> list[str]:
    """Why a step failed: the error messages and the input values most common among its failed requests, as the
    canary's servers kept them (rollout/causes.py)."""
    out = []
    for i, figures in enumerate(rows):
        part = figures.get("window") if (figures.get("window") or {}).get("causes") else figures.get("golden") or {}
        causes = part.get("causes")
        if not causes:
            continue
        whose = "users'" if causes["traffic"] == "users" else "the verifier's"
        out.append(f"<h3>Why step {i} at {_e(figures.get('weight', 0))}% failed: {_e(causes['failed_requests'])} of "
                   f"the {whose} failed requests, as the canary's servers kept them</h3>")
        if causes.get("unread"):
            out.append(f"<p class='failed'>Not read: {_e('; '.join(causes['unread']))}</p>")
        out.append("<table><tr><th>failed requests</th><th>error message</th></tr>")
        out += [f"<tr><td class='num'>{_e(m['count'])}</td><td><pre>{_e(m['message'])}</pre></td></tr>"
                for m in causes["messages"]]
        out.append("</table>")
        if causes["values"]:
            out.append("<table><tr><th>input</th><th>value</th><th>in failed requests</th></tr>")
            out += [f"<tr><td>{_e(v['feature'])}</td><td>{_e(json.dumps(v['value']))}</td>"
                    f"<td class='num'>{_e(v['count'])} of {_e(causes['failed_requests'])}</td></tr>"
                    for v in causes["values"]]
            out.append("</table>")
    return out


def _flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested limits (rollout.shadow's) as dotted keys."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _shadow_tables(rows: list[dict[str, Any]]) -> list[str]:
    """The shadow step's comparison (rollout/shadow.py): the candidate's answers to copies of the users' requests
    against stable's answers to the same requests, and the rows on which they differ most, with their inputs."""
    out = []
    for i, figures in enumerate(rows):
        window = figures.get("window") or {}
        shadow = window.get("shadow")
        if not shadow:
            continue
        thresholds = shadow.get("thresholds")
        decided = (f"decisions at thresholds stable {thresholds['stable']:g}, candidate {thresholds['candidate']:g}"
                   if thresholds else "classes" if shadow["kind"] == "multiclass" else "values")
        out.append(f"<h3>Copies of the users' requests at step {i}: {_e(window['percent'])}% copied to the "
                   f"candidate, {_e(shadow['pairs'])} answered by both versions in {_e(window['seconds'])}s</h3>")
        cells = [("rows compared", shadow["rows"]), ("rows that disagree", shadow["disagreements"]),
                 ("disagreement rate", _number(shadow["disagreement_rate"], 4)), ("compared", decided),
                 ("score distance", _number(shadow["score_distance"], 4)),
                 ("p99 ms candidate / stable", f"{_number(shadow['candidate_p99_ms'], 1)} / "
                                               f"{_number(shadow['stable_p99_ms'], 1)}"),
                 ("candidate's answers without stable's", shadow["unmatched"])]
        out += ["<table>", *(f"<tr><th>{_e(k)}</th><td class='num'>{_e(v)}</td></tr>" for k, v in cells), "</table>"]
        if shadow["examples"]:
            out.append(f"<table><tr><th>request id</th><th>stable's {_e(shadow['output'])}</th><th>candidate's</th>"
                       "<th>disagree</th><th>inputs</th></tr>")
            out += [f"<tr><td>{_e(x['request_id'])}</td><td class='num'>{_e(x['stable'])}</td>"
                    f"<td class='num'>{_e(x['candidate'])}</td><td>{'yes' if x['disagree'] else 'no'}</td>"
                    f"<td><pre>{_e(json.dumps(x['inputs']))}</pre></td></tr>" for x in shadow["examples"]]
            out.append("</table>")
    return out


def _skew_tables(rows: list[dict[str, Any]]) -> list[str]:
    """rollout.skew_check's figures per step: each feature's distance from the candidate's training data against its
    threshold, and what its requests break of the training schema."""
    checked = [(i, figures) for i, figures in enumerate(rows) if figures.get("skew")]
    if not checked:
        return []
    out = ["<h2>Skew against the candidate's training data</h2>",
           "<p>The requests the candidate answered since the rollout began, read from the request logs (the "
           "verifier's own left out), against the training statistics and schema it was published with.</p>"]
    for i, figures in checked:
        skew = figures["skew"]
        left_out = ", ".join(f"{n} {why}" for why, n in sorted((skew.get("left_out") or {}).items()))
        out.append(f"<h3>step {i} at {_e(figures.get('weight', 0))}%: {_e(skew['requests'])} logged requests "
                   f"(at least {_e(skew['min_requests'])} judged){_e(f'; left out: {left_out}' if left_out else '')}"
                   "</h3>")
        if not skew["features"]:
            reason = skew.get("inconclusive") or skew.get("error") or "no feature judged"
            out.append(f"<p class='failed'>{_e(reason)}</p>")
            continue
        out.append("<table><tr><th>feature</th><th>kind</th><th>measure</th><th>distance</th><th>threshold</th>"
                   "<th>schema anomalies</th><th>verdict</th></tr>")
        for feature in skew["features"]:
            verdict = ("<td class='failed'>skewed</td>" if feature["flagged"] else "<td class='passed'>passed</td>")
            cells = [feature["name"], feature["kind"], feature["measure"] or "-", _number(feature["value"], 4),
                     _number(feature["threshold"], 4), "; ".join(feature["anomalies"]) or "-"]
            out.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + verdict + "</tr>")
        out.append("</table>")
    return out


def render_html(record: dict[str, Any], traffic: dict[str, Any] | None = None) -> str:
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
                *(f"<tr><th>{_e(k)}</th><td class='num'>{_e(v)}</td></tr>" for k, v in sorted(_flat(limits).items())),
                "</table>"]
    rows = _verification_rows(record)
    out.append("<h2>Verification before each step</h2>")
    if not rows:
        out.append("<p>No verification ran: the candidate never became AVAILABLE on the canary servers, or the "
                   "rollout was promoted or rolled back by hand before the first one.</p>")
    else:
        out.append(_chart(rows))
        out.append("<table><tr><th>step</th><th>canary traffic</th><th>canary servers</th><th>golden rows</th>"
                   "<th>max |diff| REST</th><th>max |diff| gRPC</th><th>REST vs gRPC</th><th>decided otherwise</th>"
                   "<th>window</th>"
                   "<th>canary requests</th><th>of them the verifier's</th><th>user requests (both tracks)</th>"
                   "<th>errors</th><th>error rate</th><th>canary user requests needed</th><th>stable user errors</th>"
                   "<th>p99 ms</th><th>verdict</th></tr>")
        for i, figures in enumerate(rows):
            golden, window = figures.get("golden") or {}, figures.get("window") or {}
            inconclusive = "; ".join(f["inconclusive"] for f in (window, figures.get("skew") or {})
                                     if f.get("inconclusive"))
            verdict = (f"<td class='failed'>FAILED: {_e(figures['error'])}</td>" if figures.get("error")
                       else f"<td class='failed'>INCONCLUSIVE: {_e(inconclusive)}</td>"
                       if inconclusive else "<td class='passed'>passed</td>")
            window_text = f"{window['seconds']}s ({window['source']})" if window else "-"
            cells = [i, f"{figures.get('weight', 0)}%", figures.get("canary_servers", "-"), golden.get("rows", "-"),
                     _number(golden.get("rest_max_abs_diff"), 6), _number(golden.get("grpc_max_abs_diff"), 6),
                     _number(golden.get("rest_grpc_max_abs_diff"), 6), _number(golden.get("disagreements"), 0),
                     window_text,
                     _number(window.get("requests"), 0), _number(window.get("verifier_requests"), 0),
                     _number((window.get("share") or {}).get("user_requests"), 0), _number(window.get("errors"), 0),
                     _number(window.get("error_rate"), 4), (window.get("evidence") or {}).get("needed", "-"),
                     _stable_errors(window.get("evidence")), _number(window.get("p99_ms"), 1)]
            out.append("<tr>" + "".join(f"<td class='num'>{_e(c)}</td>" for c in cells) + verdict + "</tr>")
        out.append("</table>")
        out += _shadow_tables(rows)
        out += _cause_tables(rows)
        out += _skew_tables(rows)
    out += _watch_table(record)
    if traffic is not None:
        out.append("<h2>Traffic per track</h2>")
        out.append(f"<p class='failed'>{_e(traffic['error'])}</p>" if "error" in traffic
                   else traffic_chart(record, traffic))
    out += ["<h2>Steps</h2><table><tr><th>at (UTC)</th><th>phase</th><th>next</th><th>what happened</th></tr>",
            *(f"<tr><td>{_e(e.get('at', ''))}</td><td>{_e(e.get('phase', ''))}</td><td>{_e(e.get('next', ''))}</td>"
              f"<td>{_e(e.get('message', ''))}</td></tr>" for e in record.get("events", [])),
            "</table></body></html>"]
    return "\n".join(out) + "\n"
