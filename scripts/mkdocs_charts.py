"""An MkDocs hook that draws a chart under a Markdown table from the table itself, so a chart cannot disagree with
the figures beside it. A comment right before the table names the chart and its columns:

    <!-- chart: stage-wall-seconds; label=stage; values=filed: wall s,now: wall s; wall seconds per stage -->

`label` is the column (or columns, joined) that names each bar; `values` one column (bars) or several (grouped bars,
one series per column). Rows whose value cells hold no leading number (a total in bold, a dash) are left out. The
charts are reports/charts.py's inline SVG (`data-chart` = the name): nothing is fetched when the page is opened."""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from reports import charts  # noqa: E402  (stdlib only: runs in .venv-tools, beside MkDocs)

MARKER = re.compile(r"^<!-- chart: (?P<name>[\w-]+); label=(?P<label>[^;]+); values=(?P<values>[^;]+); "
                    r"(?P<title>[^>]+?) -->\n", re.MULTILINE)
NUMBER = re.compile(r"^[\s*]*(-?[\d,]*\.?\d+)")


class ChartError(ValueError):
    """A chart marker that does not fit its table: the message names the page, the chart and what is wrong."""


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _number(cell: str) -> float | None:
    found = NUMBER.match(cell.replace("`", ""))
    return float(found.group(1).replace(",", "")) if found and not cell.lstrip().startswith("**") else None


def chart(markdown_table: list[str], name: str, label: str, values: str, title: str) -> str:
    header = _cells(markdown_table[0])
    columns = {column: header.index(column) for column in (*label.split(","), *values.split(",")) if column in header}
    missing = [c for c in (*label.split(","), *values.split(",")) if c not in columns]
    if missing:
        raise ChartError(f"chart {name}: the table has no column {missing} (its columns: {header})")
    labels, series = [], [[] for _ in values.split(",")]
    for line in markdown_table[2:]:
        cells = _cells(line)
        numbers = [_number(cells[columns[c]]) for c in values.split(",")]
        if any(n is None for n in numbers):
            continue
        labels.append(", ".join(cells[columns[c]].replace("`", "") for c in label.split(",")))
        for held, number in zip(series, numbers, strict=True):
            held.append(number)
    if not labels:
        raise ChartError(f"chart {name}: no row of the table holds numbers in {values}")
    if len(series) == 1:
        return charts.bars(name, [(text, value, "") for text, value in zip(labels, series[0], strict=True)], title)
    return charts.grouped_bars(name, labels, list(zip(values.split(","), series, strict=True)), title, percent=False)


def on_page_markdown(markdown: str, page, **_) -> str:
    """Puts each marked table's chart after the table."""
    out, position = [], 0
    for marker in MARKER.finditer(markdown):
        rest = markdown[marker.end():].split("\n")
        table = []
        for line in rest:
            if not line.startswith("|"):
                break
            table.append(line)
        if len(table) < 3:
            raise ChartError(f"{page.file.src_path}: chart {marker['name']} is not followed by a table")
        end = marker.end() + len("\n".join(table))
        svg = chart(table, marker["name"], marker["label"], marker["values"], marker["title"])
        out.append(markdown[position:end] + f"\n\n<figure>{svg}<figcaption>{marker['title']}"
                   "</figcaption></figure>\n")
        position = end
    return "".join(out) + markdown[position:]
