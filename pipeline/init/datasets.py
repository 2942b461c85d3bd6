"""Small public datasets that ship inside scikit-learn, as header CSVs the pipeline reads: the examples of a
multiclass task (iris) and a regression task (diabetes), with no download at run time.

`data.path: sklearn:iris` (or `sklearn:diabetes`) makes the pipeline write `<output_root>/data/<name>/data.csv`
from the copy inside the scikit-learn wheel and read that folder. The file is written only when it is missing or
differs, byte for byte the same each time, so ExampleGen's cache (which keys on the files' sizes and times) holds.
"""
from __future__ import annotations

import csv
import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BUNDLED_PREFIX = "sklearn:"


@dataclass(frozen=True)
class BundledDataset:
    description: str
    # Returns the column names and the rows, in scikit-learn's order.
    load: Callable[[], tuple[list[str], list[list[object]]]]


def _iris() -> tuple[list[str], list[list[object]]]:
    from sklearn.datasets import load_iris

    data = load_iris()
    columns = ["sepal_length", "sepal_width", "petal_length", "petal_width", "species"]
    rows = [[*features, str(data.target_names[target])] for features, target in zip(data.data, data.target,
                                                                                     strict=True)]
    return columns, rows


def _diabetes() -> tuple[list[str], list[list[object]]]:
    from sklearn.datasets import load_diabetes

    # scaled=False: the measurements as taken (age in years, sex 1 or 2, BMI, blood pressure, six blood serum
    # measurements), and the target: disease progression one year later.
    data = load_diabetes(scaled=False)
    columns = ["age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6", "progression"]
    rows = [[*features, target] for features, target in zip(data.data, data.target, strict=True)]
    return columns, rows


BUNDLED = {
    "iris": BundledDataset("150 iris flowers, 4 measurements, 3 species (multiclass)", _iris),
    "diabetes": BundledDataset("442 diabetes patients, 10 measurements, disease progression (regression)",
                               _diabetes),
}


class UnknownDatasetError(ValueError):
    """data.path names a bundled dataset that does not exist."""


def is_bundled(path: str) -> bool:
    return path.startswith(BUNDLED_PREFIX)


def _cell(value: object, integral: bool) -> str:
    if isinstance(value, str):
        return value
    return str(int(value)) if integral else repr(float(value))


def bundled_csv(name: str) -> str:
    """The dataset as CSV text with a header: a numeric column whose values are all whole numbers is written as
    integers (ExampleGen reads it as INT), the others as floats."""
    if name not in BUNDLED:
        raise UnknownDatasetError(f"data.path {BUNDLED_PREFIX}{name} names no bundled dataset; use one of "
                                  f"{', '.join(BUNDLED_PREFIX + n for n in BUNDLED)}, or a folder of CSV files.")
    columns, rows = BUNDLED[name].load()
    integral = [all(not isinstance(row[i], str) and float(row[i]).is_integer() for row in rows)
                for i in range(len(columns))]
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(value, integral[i]) for i, value in enumerate(row)])
    return text.getvalue()


def write_bundled(path: str, output_root: str) -> Path:
    """Writes the bundled dataset `path` (sklearn:<name>) to <output_root>/data/<name>/data.csv unless that file
    already holds it; returns the folder."""
    name = path[len(BUNDLED_PREFIX):]
    content = bundled_csv(name)
    folder = Path(output_root) / "data" / name
    target = folder / "data.csv"
    if not target.is_file() or target.read_text() != content:
        folder.mkdir(parents=True, exist_ok=True)
        staged = target.with_suffix(".csv.tmp")
        staged.write_text(content)
        staged.replace(target)
    return folder
