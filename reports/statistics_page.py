"""TFDV statistics as one self-contained HTML page: per column and split, the counts, the gaps, the numbers' summary
with a histogram, the strings' most frequent values. TFDV's own page (Facets) loads its code from the internet at
view time; this one needs nothing but a browser."""
from __future__ import annotations

import html
from collections.abc import Mapping

from tensorflow_metadata.proto.v0 import statistics_pb2

FeatureStats = statistics_pb2.FeatureNameStatistics
TOP_VALUES = 10
STYLE = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin-bottom:2em}"
         "td,th{padding:3px 8px;text-align:right;border-bottom:1px solid #ddd;vertical-align:top}"
         "td:first-child,th:first-child,td.left{text-align:left}.gap{color:#b00}.bar{fill:#4a7bb7}"
         ".top{display:flex;gap:6px;align-items:center;justify-content:flex-start}"
         ".top span:first-child{display:inline-block;height:10px;background:#4a7bb7}")


def _common(feature: FeatureStats) -> statistics_pb2.CommonStatistics:
    kind = feature.WhichOneof("stats")
    return getattr(feature, kind).common_stats if kind else statistics_pb2.CommonStatistics()


def present_rows(feature: FeatureStats) -> int:
    """Rows with a value: a CSV column has at most one value per row, an empty cell none."""
    return int(_common(feature).tot_num_values)


def _number(value: float) -> str:
    return f"{value:,.4g}" if abs(value) < 1e6 else f"{value:.4g}"


def _histogram_svg(histogram: statistics_pb2.Histogram) -> str:
    counts = [bucket.sample_count for bucket in histogram.buckets]
    if not counts or max(counts) <= 0:
        return ""
    width, height = 8, 32
    bars = "".join(
        f"<rect class='bar' x='{i * width}' y='{height - h:.1f}' width='{width - 1}' height='{h:.1f}'/>"
        for i, h in enumerate(height * c / max(counts) for c in counts))
    title = html.escape(f"{_number(histogram.buckets[0].low_value)} to {_number(histogram.buckets[-1].high_value)}")
    return (f"<svg width='{width * len(counts)}' height='{height}' role='img'><title>{title}</title>{bars}</svg>")


def _gap_cell(feature: FeatureStats, rows: int) -> str:
    missing = rows - present_rows(feature)
    share = missing / rows if rows else 0.0
    css = " class='gap'" if missing else ""
    return f"<td{css}>{missing:,} ({share:.1%})</td>"


def _numeric_row(split: str, feature: FeatureStats, rows: int) -> str:
    stats = feature.num_stats
    standard = next((h for h in stats.histograms if h.type == statistics_pb2.Histogram.STANDARD), None)
    cells = [_number(v) for v in (stats.mean, stats.std_dev, stats.min, stats.median, stats.max)]
    type_name = FeatureStats.Type.Name(feature.type)
    return (f"<tr><td>{html.escape(feature.path.step[0])}</td><td class='left'>{split}</td><td>{type_name}</td>"
            f"<td>{present_rows(feature):,}</td>{_gap_cell(feature, rows)}"
            + "".join(f"<td>{c}</td>" for c in cells)
            + f"<td>{stats.num_zeros:,}</td><td>{_histogram_svg(standard) if standard else ''}</td></tr>")


def _string_row(split: str, feature: FeatureStats, rows: int) -> str:
    stats = feature.string_stats
    top = list(stats.top_values)[:TOP_VALUES]
    most = max((t.frequency for t in top), default=0) or 1
    values = "".join(
        f"<div class='top'><span style='width:{60 * t.frequency / most:.0f}px'></span>"
        f"<span>{html.escape(t.value)} ({t.frequency:,.0f})</span></div>" for t in top)
    return (f"<tr><td>{html.escape(feature.path.step[0])}</td><td class='left'>{split}</td>"
            f"<td>{present_rows(feature):,}</td>{_gap_cell(feature, rows)}<td>{stats.unique:,}</td>"
            f"<td>{stats.avg_length:.1f}</td><td class='left'>{values}</td></tr>")


def statistics_html(statistics: Mapping[str, statistics_pb2.DatasetFeatureStatisticsList], title: str,
                    notes: list[str] = ()) -> str:
    """One page for the statistics of each split (split name -> TFDV statistics), columns in name order."""
    numeric, strings, shown = [], [], set()
    names = sorted({f.path.step[0] for s in statistics.values() for f in s.datasets[0].features})
    for name in names:
        for split, stats in statistics.items():
            dataset = stats.datasets[0]
            feature = next((f for f in dataset.features if f.path.step[0] == name), None)
            if feature is None or not present_rows(feature):
                continue
            shown.add(name)
            if feature.HasField("num_stats"):
                numeric.append(_numeric_row(split, feature, dataset.num_examples))
            else:
                strings.append(_string_row(split, feature, dataset.num_examples))
    empty = [name for name in names if name not in shown]
    splits = ", ".join(f"{split} {stats.datasets[0].num_examples:,} rows" for split, stats in statistics.items())
    parts = [f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title><style>{STYLE}</style>",
             f"<h1>{html.escape(title)}</h1><p>{splits}; {len(names)} columns. Missing: rows with an empty cell "
             "(or a missing-value marker).</p>"]
    parts += [f"<p>{html.escape(note)}</p>" for note in notes]
    if numeric:
        parts.append("<h2>Numbers</h2><table><tr><th>column</th><th>split</th><th>type</th><th>present</th>"
                     "<th>missing</th><th>mean</th><th>std dev</th><th>min</th><th>median</th><th>max</th>"
                     "<th>zeros</th><th>histogram</th></tr>" + "".join(numeric) + "</table>")
    if strings:
        parts.append("<h2>Strings</h2><table><tr><th>column</th><th>split</th><th>present</th><th>missing</th>"
                     f"<th>distinct</th><th>mean length</th><th>top {TOP_VALUES} values</th></tr>"
                     + "".join(strings) + "</table>")
    if empty:
        parts.append("<h2>Columns without values</h2><p>" + ", ".join(html.escape(n) for n in empty) + "</p>")
    return "\n".join(parts) + "\n"
