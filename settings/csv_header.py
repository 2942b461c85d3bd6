"""A CSV header read as a CSV reader reads it, by every part that reads the user's files (`mlops init`, ExampleGen,
`mlops predict --csv`): quoted cells unquoted (R's write.csv quotes every header cell), a byte-order mark and
surrounding blanks dropped, and a leading unnamed column (the row index R and pandas write) left out of every row.
A header no reader could map to columns (a name twice, an empty name) is refused in one sentence."""
from __future__ import annotations

import csv
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from settings.errors import UserError

BYTE_ORDER_MARK = "\ufeff"
# What a feature is called in every stage and format: TF names a signature's input tensors in lower case, with
# letters, digits and _ only (tf.function's sanitize_arg_name), and TF.js, ONNX and TFLite take those names.
FEATURE_NAME = re.compile(r"[a-z][a-z0-9_]*")


def feature_name(column: str, position: int = 0) -> str:
    """The feature a CSV column becomes: its name in lower case, accents dropped, any other run of characters a `_`,
    a letter first; `column_<position>` when nothing of it is left (a name in another script)."""
    text = unicodedata.normalize("NFKD", column.casefold()).encode("ascii", "ignore").decode()
    name = re.sub(r"[^a-z0-9]+", "_", text).strip("_")
    if not name:
        return f"column_{position}"
    return name if name[0].isalpha() else f"c_{name}"


class CsvHeaderError(UserError, ValueError):
    """A CSV header that cannot name the columns; the message names the file and what to change."""

    exit_code = 2


@dataclass(frozen=True)
class CsvHeader:
    """The features a CSV file's columns become (`names`), the header's own names (`columns`), and whether each
    row's first field is an unnamed row index to leave out."""

    names: tuple[str, ...]
    row_index: bool = False
    columns: tuple[str, ...] = ()

    def renamed(self) -> list[tuple[str, str]]:
        """(column, feature) for each column whose feature has another name."""
        return [(c, n) for c, n in zip(self.columns, self.names, strict=True) if c != n]

    @property
    def fields(self) -> int:
        """The fields of each row of the file, the row index included."""
        return len(self.names) + self.row_index

    def cells(self, row: list) -> list:
        """The cells of a parsed row that belong to the named columns."""
        return row[1:] if self.row_index else row


# What a spreadsheet in a locale with the decimal comma, or a tab-separated export, separates cells with.
OTHER_SEPARATORS = ((";", "semicolons"), ("\t", "tabs"), ("|", "'|'"))


def parse_header(cells: list[str], where: str) -> CsvHeader:
    """The header of the file `where` from its first row's parsed cells; CsvHeaderError when it cannot name the
    columns."""
    names = [cell.strip() for cell in cells]
    if names:
        names[0] = names[0].lstrip(BYTE_ORDER_MARK).strip()
    separator = next((name for mark, name in OTHER_SEPARATORS if len(names) == 1 and mark in names[0]), None)
    if separator is not None:
        raise CsvHeaderError(f"{where} is separated by {separator}, not commas (its header is one column, "
                             f"{names[0][:60]!r}); save it as comma-separated CSV, with '.' as the decimal point.")
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
    features: dict[str, str] = {}
    for position, name in enumerate(names, start=1 + row_index):
        feature = feature_name(name, position)
        if feature in features:
            raise CsvHeaderError(f"the header of {where} names the columns '{features[feature]}' and '{name}', which "
                                 f"both become the feature '{feature}' (lower case, letters, digits and _); rename "
                                 "one of them.")
        features[feature] = name
    return CsvHeader(tuple(features), row_index, tuple(names))


def header_of_line(line: str | bytes, where: str) -> CsvHeader:
    """The header from the text of a file's first line (ExampleGen reads it through TFX's file system)."""
    text = line.decode("utf-8-sig") if isinstance(line, bytes) else line
    cells = next(csv.reader([text.rstrip("\r\n")]), [])
    return parse_header(cells, where)


def read_header(path: str | Path) -> CsvHeader:
    """The header of a local CSV file."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        return parse_header(next(csv.reader(f), []), str(path))
