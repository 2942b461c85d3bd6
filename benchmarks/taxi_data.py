"""Synthetic Chicago taxi CSV at N times the embedded sample's rows, with the sample's columns and distributions.

    .venv/bin/python -m benchmarks.taxi_data --scale 10 --output outputs/bench/data/10x

Each output row is a sample row drawn with replacement (so the joint distribution, missing cells included, is the
sample's), then jittered so rows are not copies: fares, tips and trip lengths are scaled by one factor near 1 per
row (so the big-tipper label, tips > 0.2 * fare, keeps its share), coordinates move by a few metres. The same scale
and seed give the same file, byte for byte.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

from pipeline.data import EMBEDDED_TAXI_DIR

SAMPLE = EMBEDDED_TAXI_DIR / "data.csv"
# Scaled together by one factor per row; the label compares tips with fare, so it does not move.
MONEY_AND_LENGTH = ("fare", "tips", "trip_miles")
SECONDS = "trip_seconds"
COORDINATES = ("pickup_latitude", "pickup_longitude", "dropoff_latitude", "dropoff_longitude")
SCALE_SPREAD = 0.05
COORDINATE_SPREAD = 0.0005


def read_sample(path: Path = SAMPLE) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        return header, [row for row in reader if row]


def _jitter(row: list[str], index: dict[str, int], factor: float, shift: np.ndarray) -> list[str]:
    out = list(row)
    for name in MONEY_AND_LENGTH:
        cell = out[index[name]]
        if cell:
            out[index[name]] = f"{float(cell) * factor:.2f}"
    cell = out[index[SECONDS]]
    if cell:
        out[index[SECONDS]] = str(round(float(cell) * factor))
    for name, delta in zip(COORDINATES, shift, strict=True):
        cell = out[index[name]]
        if cell:
            out[index[name]] = f"{float(cell) + delta:.6f}"
    return out


def write_synthetic(output: Path, scale: int, seed: int = 0, chunk_rows: int = 100_000) -> int:
    """Writes `output`/data.csv with `scale` times the sample's rows; returns the number of rows written."""
    header, rows = read_sample()
    index = {name: i for i, name in enumerate(header)}
    total = len(rows) * scale
    rng = np.random.default_rng(seed)
    output.mkdir(parents=True, exist_ok=True)
    with open(output / "data.csv", "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        for start in range(0, total, chunk_rows):
            n = min(chunk_rows, total - start)
            picks = rng.integers(0, len(rows), n)
            factors = np.exp(rng.normal(0.0, SCALE_SPREAD, n))
            shifts = rng.normal(0.0, COORDINATE_SPREAD, (n, len(COORDINATES)))
            writer.writerows(_jitter(rows[p], index, float(k), s) for p, k, s in zip(picks, factors, shifts,
                                                                                     strict=True))
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.taxi_data", description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, required=True, help="times the sample's rows (10, 100, ...)")
    parser.add_argument("--output", type=Path, required=True, help="folder for data.csv")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.scale < 1:
        parser.error("--scale must be at least 1")
    rows = write_synthetic(args.output, args.scale, args.seed)
    print(f"wrote {rows} rows to {args.output / 'data.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
