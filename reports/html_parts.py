"""The pieces every HTML report is built of: escaped text, numbers as a person reads them, tables and captioned
figures."""
from __future__ import annotations

import html
import math
from typing import Any


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def num(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return esc(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.{digits}f}" if math.isfinite(value) else "n/a"


def whole(value: Any) -> str:
    return f"{value:,.0f}" if isinstance(value, (int, float)) and math.isfinite(value) else ""


def tabulate(head: list[str], rows: list[list[str]]) -> str:
    """A table of already escaped cells."""
    head_row = "<tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>" if any(head) else ""
    return ("<table>" + head_row
            + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows) + "</table>")


def captioned(chart: str, caption: str) -> str:
    return f"<figure>{chart}<figcaption>{esc(caption)}</figcaption></figure>" if chart else ""
