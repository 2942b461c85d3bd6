"""Where the input CSVs are, and the checks that stop a run before TFX sees a broken folder."""
from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import tfx

from settings.csv_header import CsvHeader, CsvHeaderError, parse_header, read_header
from settings.errors import UserError

EMBEDDED_TAXI_DIR = Path(tfx.__file__).parent / "examples" / "chicago_taxi_pipeline" / "data" / "simple"


class DataError(UserError, ValueError):
    """The data folder or a CSV in it cannot be used; the message names the path and what to do."""

    exit_code = 2


def resolve_data_dir(path: str, output_root: str = "outputs") -> Path:
    """The configured folder, the Chicago taxi sample that ships inside the tfx wheel when empty, or a dataset
    bundled with scikit-learn (sklearn:iris, sklearn:diabetes) written as a CSV below `output_root`."""
    from pipeline.init import datasets

    if datasets.is_bundled(path):
        try:
            return datasets.write_bundled(path, output_root)
        except datasets.UnknownDatasetError as e:
            raise DataError(str(e)) from None
    return Path(path) if path else EMBEDDED_TAXI_DIR


def check_csv_folder(folder: Path) -> list[Path]:
    """Returns the CSV files of `folder` after checking each is readable, non-empty, rectangular and that all
    share one header; raises DataError naming the path otherwise."""
    if not folder.is_dir():
        raise DataError(f"data folder {folder} does not exist; set data.path to a folder of CSV files.")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() == ".csv" and p.is_file())
    if not files:
        raise DataError(f"data folder {folder} holds no .csv files; put at least one CSV with a header row there.")
    header = None
    for path in files:
        try:
            with open(path, newline="", encoding="utf-8-sig") as f:
                reader = csv.reader(f)
                first = next(reader, None)
                if not first or not any(cell.strip() for cell in first):
                    raise DataError(f"CSV file {path} is empty; it needs a header row and data rows.")
                first = parse_header(first, str(path))
                rows = 0
                for row in reader:
                    if not row:
                        continue
                    rows += 1
                    if len(row) != first.fields:
                        raise DataError(
                            f"CSV file {path} line {reader.line_num} has {len(row)} fields but the header has "
                            f"{first.fields}; fix or remove that row."
                        )
        except CsvHeaderError as e:
            raise DataError(str(e)) from None
        except (UnicodeDecodeError, csv.Error) as e:
            raise DataError(f"CSV file {path} cannot be read as UTF-8 CSV ({e}); re-export it as UTF-8 CSV.") from e
        except OSError as e:
            raise DataError(f"CSV file {path} cannot be read: {e.strerror}.") from e
        if rows == 0:
            raise DataError(f"CSV file {path} has a header but no data rows; add rows or remove the file.")
        if header is None:
            header = first
        elif first != header:
            raise DataError(f"CSV file {path} has a different header from {files[0]}; all files must share one.")
    return files


def count_csv_rows(folder: Path) -> int:
    """Data rows of the folder's CSV files, counted as lines after each header (a quoted line break counts twice):
    what beam.direct_running_mode=auto chooses by."""
    rows = 0
    for path in folder.iterdir():
        if path.suffix.lower() != ".csv" or not path.is_file():
            continue
        last = b""
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                rows += chunk.count(b"\n")
                last = chunk[-1:]
        if last and last != b"\n":
            rows += 1  # the last row has no line break
        if last:
            rows -= 1  # the header
    return rows


def write_slice(source: Path, destination: Path, rows: int) -> Path:
    """Copies the header and the first `rows` data rows of a CSV: small data for tests and quick runs."""
    destination.mkdir(parents=True, exist_ok=True)
    target = destination / "data.csv"
    with open(source, newline="") as f_in, open(target, "w", newline="") as f_out:
        writer = csv.writer(f_out, lineterminator="\n")
        for i, row in enumerate(csv.reader(f_in)):
            if i > rows:
                break
            writer.writerow(row)
    return target


# Cell values that often mean "missing" in published CSVs; `mlops init` proposes those it finds in numeric columns.
COMMON_MISSING_MARKERS = ("NA", "N/A", "n/a", "na", "#N/A", "NULL", "null", "Null", "None", "none", "NaN", "nan",
                          "?", "-", "--", ".")
# A column's profile counts at most this many distinct values (and says when there are more).
DISTINCT_CAP = 1000
# Rows read at a time: each column's distinct cells of a chunk are looked at once.
CHUNK_ROWS = 10_000
# Values that are not integers, kept with their first location per column for error messages.
ODD_VALUES_CAP = 50


def read_csv_header(path: Path) -> CsvHeader:
    """The header of a CSV file as settings.csv_header reads it (check_csv_folder has checked that it exists)."""
    try:
        return read_header(path)
    except CsvHeaderError as e:
        raise DataError(str(e)) from None


def csv_header(path: Path) -> list[str]:
    """The column names of a CSV file: its header's cells unquoted and trimmed, a leading row index left out."""
    return list(read_csv_header(path).names)


def cell_type(cell: str) -> str:
    """How tfx_bsl's CSV decoder types a non-empty cell: "int" (int64), "float" or "string"."""
    try:
        return "int" if -2**63 <= int(cell) < 2**63 else "string"
    except ValueError:
        try:
            float(cell)
        except ValueError:
            return "string"
        return "float"


@dataclass
class ColumnProfile:
    """One CSV column over every row: empty cells, marker cells, the values and how ExampleGen would type them."""

    name: str
    rows: int = 0
    empty: int = 0
    # Cells holding one of the markers the scan was given (surrounding blanks ignored).
    markers: Counter = field(default_factory=Counter)
    # Every other non-empty cell (stripped), counted up to DISTINCT_CAP distinct values ...
    values: Counter = field(default_factory=Counter)
    # ... and whether there were more.
    more_values: bool = False
    # "int", "float", "string" -> cells, over the non-empty, non-marker cells.
    types: Counter = field(default_factory=Counter)
    # Non-integer values (floats, strings) -> cells, and where each was first seen ("data.csv line 12").
    odd_values: Counter = field(default_factory=Counter)
    first_seen: dict[str, str] = field(default_factory=dict)
    # Distinct odd values kept per type: many floats must not crowd out the few strings among them.
    odd_kinds: Counter = field(default_factory=Counter)

    @property
    def missing(self) -> int:
        return self.empty + sum(self.markers.values())

    @property
    def kind(self) -> str:
        """The column's type as ExampleGen infers it with the markers read as empty: "empty" when no value is left."""
        for kind in ("string", "float", "int"):
            if self.types[kind]:
                return kind
        return "empty"

    def samples(self, kinds: tuple[str, ...], count: int = 3) -> str:
        """The most frequent odd values of the given types, as "'NA' (37 cells, first at data.csv line 12)"."""
        chosen = [(v, n) for v, n in self.odd_values.most_common() if cell_type(v) in kinds][:count]
        return ", ".join(f"{v!r} ({n} cell{'s' * (n != 1)}, first at {self.first_seen[v]})" for v, n in chosen)


def profile_columns(files: list[Path], markers: Collection[str] = (), columns: Collection[str] | None = None,
                    ) -> dict[str, ColumnProfile]:
    """Reads every row of the CSV files (which share a header) and profiles `columns` (all when None); cells that
    equal a marker (surrounding blanks ignored) are counted as markers, not values."""
    marker_set = {m.strip() for m in markers if m.strip()}
    header = read_csv_header(files[0])
    # Positions in each row: a row index before the named columns shifts them by one.
    wanted = [(i + header.row_index, name) for i, name in enumerate(header.names) if columns is None or name in columns]
    profiles = {name: ColumnProfile(name) for _, name in wanted}
    for path in files:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            next(reader)
            while True:
                rows, lines = [], []
                for row in reader:
                    if row:
                        rows.append(row)
                        lines.append(reader.line_num)
                        if len(rows) == CHUNK_ROWS:
                            break
                if not rows:
                    break
                # Column by column, each distinct cell once: most columns repeat their values.
                by_column = list(zip(*rows, strict=True))
                for i, name in wanted:
                    _count_cells(profiles[name], by_column[i], marker_set, path, lines)
    return profiles


def _count_cells(profile: ColumnProfile, cells: tuple[str, ...], markers: set[str], path: Path,
                 lines: list[int]) -> None:
    for raw, count in Counter(cells).items():
        profile.rows += count
        cell = raw.strip()
        if not cell:
            profile.empty += count
            continue
        if cell in markers:
            profile.markers[cell] += count
            continue
        if cell in profile.values or len(profile.values) < DISTINCT_CAP:
            profile.values[cell] += count
        else:
            profile.more_values = True
        kind = cell_type(cell)
        profile.types[kind] += count
        if kind != "int" and (cell in profile.odd_values or profile.odd_kinds[kind] < ODD_VALUES_CAP):
            profile.odd_kinds[kind] += cell not in profile.odd_values
            profile.odd_values[cell] += count
            if cell not in profile.first_seen:
                profile.first_seen[cell] = f"{path.name} line {lines[cells.index(raw)]}"
