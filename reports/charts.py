"""Small inline SVG charts for the run report: drawn in Python, so the page needs no script and no network.

Every chart is an `<svg class="chart" data-chart="NAME">` whose marks carry a `<title>` (the browser shows it on
hover); all text that comes from data is escaped.
"""
from __future__ import annotations

import html
import math
from collections.abc import Sequence

COLORS = ("#4a7bb7", "#d9822b", "#3a9a5b", "#b5485d", "#7c5fb0", "#6b6b6b")
FONT = "font-family:sans-serif;font-size:11px"


def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return "n/a"
    if abs(value) >= 1000 or float(value).is_integer():
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _svg(name: str, width: int, height: int, body: str, label: str) -> str:
    return (f"<svg class='chart' data-chart='{html.escape(name, quote=True)}' width='{width}' height='{height}' "
            f"viewBox='0 0 {width} {height}' role='img' aria-label='{html.escape(label, quote=True)}' "
            f"style='{FONT}'>{body}</svg>")


def bars(name: str, rows: Sequence[tuple[str, float, str]], label: str, width: int = 520,
         colors: Sequence[str] = (), bar_height: int = 16) -> str:
    """Horizontal bars, one per (label, value, note): the label left, the value and the note right of the bar.
    Negative values are drawn from zero as zero-length bars with their value."""
    if not rows:
        return ""
    label_width = min(220, 12 + 6 * max(len(r[0]) for r in rows))
    note_width = 170
    plot = max(60, width - label_width - note_width)
    top = max((r[1] for r in rows if math.isfinite(r[1])), default=0.0) or 1.0
    parts = []
    fits = max(8, (label_width - 12) // 6)
    for i, (text, value, note) in enumerate(rows):
        y = 4 + i * (bar_height + 4)
        shown = text if len(text) <= fits else text[:fits - 1] + "\u2026"
        length = plot * max(0.0, value) / top if math.isfinite(value) and top > 0 else 0.0
        color = colors[i] if i < len(colors) and colors[i] else COLORS[0]
        parts.append(
            f"<text x='{label_width - 6}' y='{y + bar_height - 4}' text-anchor='end'>{html.escape(shown)}</text>"
            f"<rect x='{label_width}' y='{y}' width='{length:.1f}' height='{bar_height}' fill='{color}'>"
            f"<title>{html.escape(f'{text}: {_fmt(value)} {note}'.strip())}</title></rect>"
            f"<text x='{label_width + length + 4:.1f}' y='{y + bar_height - 4}'>{_fmt(value)} "
            f"<tspan fill='#666'>{html.escape(note)}</tspan></text>")
    return _svg(name, width, 8 + len(rows) * (bar_height + 4), "".join(parts), label)


def spark_bars(name: str, counts: Sequence[float], label: str, width: int = 120, height: int = 28) -> str:
    """A tiny histogram without axes (a feature's distribution beside its row of a table)."""
    if not counts or max(counts) <= 0:
        return ""
    step = width / len(counts)
    top = max(counts)
    body = "".join(
        f"<rect x='{i * step:.1f}' y='{height - height * c / top:.1f}' width='{max(1.0, step - 1):.1f}' "
        f"height='{height * c / top:.1f}' fill='{COLORS[0]}'><title>{_fmt(c)}</title></rect>"
        for i, c in enumerate(counts))
    return _svg(name, width, height, body, label)


def lines(name: str, series: Sequence[tuple[str, Sequence[tuple[float, float]]]], label: str, x_label: str,
          y_label: str, width: int = 360, height: int = 240, diagonal: bool = False,
          bounds: tuple[float, float, float, float] | None = None, points: bool = False) -> str:
    """Line series on shared axes with a legend; `diagonal` draws y = x (a chance ROC, perfect calibration);
    `bounds` fixes (x min, x max, y min, y max); `points` marks each point (and draws no line)."""
    finite = [(x, y) for _, pts in series for x, y in pts if math.isfinite(x) and math.isfinite(y)]
    if not finite:
        return ""
    if bounds is None:
        x0, x1 = min(x for x, _ in finite), max(x for x, _ in finite)
        y0, y1 = min(y for _, y in finite), max(y for _, y in finite)
        if diagonal:
            x0 = y0 = min(x0, y0)
            x1 = y1 = max(x1, y1)
    else:
        x0, x1, y0, y1 = bounds
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)
    left, right, top, bottom = 46, 10, 10, 34
    plot_w, plot_h = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + plot_w * (x - x0) / (x1 - x0)

    def sy(y: float) -> float:
        return top + plot_h * (1 - (y - y0) / (y1 - y0))

    parts = [f"<rect x='{left}' y='{top}' width='{plot_w}' height='{plot_h}' fill='none' stroke='#bbb'/>"]
    # Whole-number x values (epochs) get whole-number ticks.
    whole = all(float(x).is_integer() for x, _ in finite)
    x_ticks = range(int(x0), int(x1) + 1, max(1, math.ceil((x1 - x0) / 4))) if whole else \
        [x0 + (x1 - x0) * i / 4 for i in range(5)]
    for xv in x_ticks:
        parts.append(f"<text x='{sx(xv):.1f}' y='{top + plot_h + 13}' text-anchor='middle'>{_fmt(xv)}</text>")
    for i in range(5):
        yv = y0 + (y1 - y0) * i / 4
        parts.append(f"<text x='{left - 4}' y='{sy(yv) + 4:.1f}' text-anchor='end'>{_fmt(yv)}</text>")
    parts.append(f"<text x='{left + plot_w / 2:.1f}' y='{height - 4}' text-anchor='middle'>"
                 f"{html.escape(x_label)}</text>"
                 f"<text transform='translate(11,{top + plot_h / 2:.1f}) rotate(-90)' text-anchor='middle'>"
                 f"{html.escape(y_label)}</text>")
    if diagonal:
        a, b = max(x0, y0), min(x1, y1)
        parts.append(f"<line x1='{sx(a):.1f}' y1='{sy(a):.1f}' x2='{sx(b):.1f}' y2='{sy(b):.1f}' stroke='#999' "
                     "stroke-dasharray='4 3'/>")
    for i, (title, pts) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        kept = [(x, y) for x, y in pts if math.isfinite(x) and math.isfinite(y)]
        if points or len(kept) == 1:
            parts += [f"<circle cx='{sx(x):.1f}' cy='{sy(y):.1f}' r='3' fill='{color}' fill-opacity='0.7'>"
                      f"<title>{html.escape(title)}: {_fmt(x)}, {_fmt(y)}</title></circle>" for x, y in kept]
        else:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in kept)
            parts.append(f"<polyline points='{path}' fill='none' stroke='{color}' stroke-width='2'>"
                         f"<title>{html.escape(title)}</title></polyline>")
        parts.append(f"<rect x='{left + 8}' y='{top + 6 + 16 * i}' width='10' height='10' fill='{color}'/>"
                     f"<text x='{left + 22}' y='{top + 15 + 16 * i}'>{html.escape(title)}</text>")
    return _svg(name, width, height, "".join(parts), label)


def matrix(name: str, labels: Sequence[str], counts: Sequence[Sequence[float]], label: str,
           row_title: str = "actual", column_title: str = "predicted", cell: int = 56) -> str:
    """A confusion matrix as shaded cells with their counts and each row's share."""
    n = len(labels)
    if not n:
        return ""
    label_width = min(140, 16 + 7 * max(len(x) for x in labels))
    left, top = label_width + 18, 34
    top_value = max((v for row in counts for v in row), default=0.0) or 1.0
    parts = [f"<text x='{left + n * cell / 2:.1f}' y='12' text-anchor='middle'>{html.escape(column_title)}</text>",
             f"<text transform='translate(10,{top + n * cell / 2:.1f}) rotate(-90)' text-anchor='middle'>"
             f"{html.escape(row_title)}</text>"]
    for j, text in enumerate(labels):
        parts.append(f"<text x='{left + j * cell + cell / 2:.1f}' y='{top - 6}' text-anchor='middle'>"
                     f"{html.escape(text[:12])}</text>")
    for i, row in enumerate(counts):
        total = sum(row) or 1.0
        parts.append(f"<text x='{left - 6}' y='{top + i * cell + cell / 2 + 4:.1f}' text-anchor='end'>"
                     f"{html.escape(labels[i][:20])}</text>")
        for j, value in enumerate(row):
            shade = 0.08 + 0.8 * value / top_value
            ink = "#fff" if shade > 0.5 else "#000"
            parts.append(
                f"<rect x='{left + j * cell}' y='{top + i * cell}' width='{cell - 2}' height='{cell - 2}' "
                f"fill='{COLORS[0]}' fill-opacity='{shade:.2f}'><title>{html.escape(labels[i])} as "
                f"{html.escape(labels[j])}: {_fmt(value)}</title></rect>"
                f"<text x='{left + j * cell + cell / 2 - 1:.1f}' y='{top + i * cell + cell / 2 - 1:.1f}' "
                f"text-anchor='middle' fill='{ink}'>{_fmt(value)}</text>"
                f"<text x='{left + j * cell + cell / 2 - 1:.1f}' y='{top + i * cell + cell / 2 + 12:.1f}' "
                f"text-anchor='middle' fill='{ink}' font-size='9'>{value / total:.0%}</text>")
    return _svg(name, left + n * cell + 4, top + n * cell + 4, "".join(parts), label)


def timeline(name: str, stages: Sequence[tuple[str, float, bool]], label: str, width: int = 640) -> str:
    """Stages one after the other on a time axis: (stage, seconds, cached); cached ones grey and marked."""
    if not stages:
        return ""
    total = sum(s for _, s, _ in stages) or 1.0
    label_width = 12 + 7 * max(len(n) for n, _, _ in stages)
    plot = width - label_width - 120
    parts, start = [], 0.0
    for i, (stage, seconds, cached) in enumerate(stages):
        y = 4 + i * 20
        x = label_width + plot * start / total
        length = max(2.0, plot * seconds / total)
        note = f"{seconds:.1f}s" + (" cached" if cached else "")
        parts.append(
            f"<text x='{label_width - 6}' y='{y + 12}' text-anchor='end'>{html.escape(stage)}</text>"
            f"<rect class='{'cached' if cached else 'ran'}' x='{x:.1f}' y='{y}' width='{length:.1f}' height='16' "
            f"fill='{'#bbb' if cached else COLORS[0]}'><title>{html.escape(stage)}: {note}</title></rect>"
            f"<text x='{x + length + 4:.1f}' y='{y + 12}'>{note}</text>")
        start += seconds
    return _svg(name, width, 8 + 20 * len(stages), "".join(parts), label)


def grouped_bars(name: str, labels: Sequence[str], series: Sequence[tuple[str, Sequence[float]]], label: str,
                 width: int = 560, bar_height: int = 9, percent: bool = True) -> str:
    """Horizontal bars grouped per label, one bar per series (in the series' colour, with a legend): shares of the
    same values in several datasets side by side. `percent` writes the values as percentages."""
    if not labels or not series:
        return ""
    label_width = min(180, 12 + 6 * max(len(x) for x in labels))
    plot = max(60, width - label_width - 56)
    top = max((v for _, values in series for v in values if math.isfinite(v)), default=0.0) or 1.0
    group = bar_height * len(series) + 6
    legend = 16
    parts = [f"<rect x='{label_width + 120 * i}' y='2' width='10' height='10' fill='{COLORS[i % len(COLORS)]}'/>"
             f"<text x='{label_width + 14 + 120 * i}' y='11'>{html.escape(title)}</text>"
             for i, (title, _) in enumerate(series)]
    fits = max(8, (label_width - 12) // 6)
    for j, text in enumerate(labels):
        y0 = legend + 4 + j * group
        shown = text if len(text) <= fits else text[:fits - 1] + "\u2026"
        parts.append(f"<text x='{label_width - 6}' y='{y0 + group / 2 + 1:.1f}' text-anchor='end'>"
                     f"{html.escape(shown)}</text>")
        for i, (title, values) in enumerate(series):
            value = values[j] if j < len(values) else float("nan")
            length = plot * max(0.0, value) / top if math.isfinite(value) else 0.0
            shown_value = f"{value:.1%}" if percent and math.isfinite(value) else _fmt(value)
            y = y0 + i * bar_height
            parts.append(f"<rect x='{label_width}' y='{y}' width='{length:.1f}' height='{bar_height - 1}' "
                         f"fill='{COLORS[i % len(COLORS)]}'><title>{html.escape(f'{text}, {title}: {shown_value}')}"
                         f"</title></rect><text x='{label_width + length + 3:.1f}' y='{y + bar_height - 1}' "
                         f"font-size='9'>{shown_value}</text>")
    return _svg(name, width, legend + 8 + len(labels) * group, "".join(parts), label)


# The look the run report and the monitor page share: headings, tables, good and bad figures.
PAGE_STYLE = """
body{font-family:sans-serif;margin:1.5em 2em;color:#222;max-width:1100px}
h1{margin-bottom:.2em}h2{border-bottom:2px solid #4a7bb7;padding-bottom:2px;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0 1em}td,th{padding:3px 8px;text-align:right;border-bottom:1px solid #ddd}
td:first-child,th:first-child,td.left,th.left{text-align:left}th{background:#f3f5f8}
.note{color:#555;font-size:.92em}.bad{color:#b00;font-weight:bold}.good{color:#277a3e;font-weight:bold}
"""
