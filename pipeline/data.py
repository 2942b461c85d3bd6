"""Where the input CSVs are, and the checks that stop a run before TFX sees a broken folder."""
from __future__ import annotations

import csv
from pathlib import Path

import tfx

EMBEDDED_TAXI_DIR = Path(tfx.__file__).parent / "examples" / "chicago_taxi_pipeline" / "data" / "simple"


class DataError(ValueError):
    """The data folder or a CSV in it cannot be used; the message names the path and what to do."""


def resolve_data_dir(path: str, output_root: str = "outputs") -> Path:
    """The configured folder, the Chicago taxi sample that ships inside the tfx wheel when empty, or a dataset
    bundled with scikit-learn (sklearn:iris, sklearn:diabetes) written as a CSV below `output_root`."""
    from pipeline import datasets

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
            with open(path, newline="", encoding="utf-8") as f:
                reader = csv.reader(f)
                first = next(reader, None)
                if not first or not any(cell.strip() for cell in first):
                    raise DataError(f"CSV file {path} is empty; it needs a header row and data rows.")
                rows = 0
                for row in reader:
                    if not row:
                        continue
                    rows += 1
                    if len(row) != len(first):
                        raise DataError(
                            f"CSV file {path} line {reader.line_num} has {len(row)} fields but the header has "
                            f"{len(first)}; fix or remove that row."
                        )
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
