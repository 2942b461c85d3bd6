"""A CSV header read as a CSV reader reads it, by every part that reads the user's files (`mlops init`, ExampleGen,
`mlops predict --csv`): quoted cells unquoted (R's write.csv quotes every header cell), a byte-order mark and
surrounding blanks dropped, and a leading unnamed column (the row index R and pandas write) left out of every row.
A header no reader could map to columns (a name twice, an empty name) is refused in one sentence."""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from settings.errors import UserError

BYTE_ORDER_MARK = "\ufeff"


class CsvHeaderError(UserError, ValueError):
    """A CSV header that cannot name the columns; the message names the file and what to change."""

    exit_code = 2


@dataclass(frozen=True)
class CsvHeader:
    """The column names of a CSV file, and whether each row's first field is an unnamed row index to leave out."""

    names: tuple[str, ...]
    row_index: bool = False

    @property
    def fields(self) -> int:
        """The fields of each row of the file, the row index included."""
        return len(self.names) + self.row_index

    def cells(self, row: list) -> list:
        """The cells of a parsed row that belong to the named columns."""
        return row[1:] if self.row_index else row


def parse_header(cells: list[str], where: str) -> CsvHeader:
    """The header of the file `where` from its first row's parsed cells; CsvHeaderError when it cannot name the
    columns."""
    names = [cell.strip() for cell in cells]
    if names:
        names[0] = names[0].lstrip(BYTE_ORDER_MARK).strip()
    row_index = len(names) > 1 and names[0] in ("", "Unnamed: 0")
    if row_index:
        names = names[1:]
    for position, name in enumerate(names, start=1 + row_index):
        if not name:
            raise CsvHeaderError(f"column {position} of the header of {where} has no name; name it, or remove the "
                                 "column.")
    seen: dict[str, int] = {}
    for position, name in enumerate(names, start=1 + row_index):
        if name in seen:
            raise CsvHeaderError(f"the header of {where} names '{name}' twice (columns {seen[name]} and {position}); "
                                 "rename one of them.")
        seen[name] = position
    return CsvHeader(tuple(names), row_index)


def header_of_line(line: str | bytes, where: str) -> CsvHeader:
    """The header from the text of a file's first line (ExampleGen reads it through TFX's file system)."""
    text = line.decode("utf-8-sig") if isinstance(line, bytes) else line
    cells = next(csv.reader([text.rstrip("\r\n")]), [])
    return parse_header(cells, where)


def read_header(path: str | Path) -> CsvHeader:
    """The header of a local CSV file."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        return parse_header(next(csv.reader(f), []), str(path))
