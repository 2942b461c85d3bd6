"""`mlops predict` start-up: the wall time of a fresh `mlops predict` process, for `--help` (the command line's
imports alone) and for a one-row prediction over REST and over gRPC against a local `mlops serve`, and what each
process imports.

    .venv/bin/python -m benchmarks.predict_startup                    # a tiny model of its own, in a temporary folder
    .venv/bin/python -m benchmarks.predict_startup --model-base-path outputs/serving/taxi --model-name taxi
    .venv/bin/python -m benchmarks.predict_startup --before-repo /tmp/before   # also an older checkout's client

The server (`python -m serving.cli serve`, as benchmarks/serving_benchmark.py starts it) is started once and asked
once over each transport before anything is timed, so the figures are the client's start-up plus one answered
request. Each cell runs once unmeasured (the page cache), then `--repeats` times; the table shows the median and the
range. A last run of each cell under `python -X importtime` counts the modules it imports, adds up their import time
and says whether TensorFlow was among them. The target (issue 27) is under 2 s for either transport. Wall time
depends on the machine's load: the load average is printed beside the figures.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.measure import REPO
from benchmarks.serving_benchmark import ServerProcess

TARGET_S = 2.0
CLI = "from pipeline.cli import console_main; console_main()"
TINY_MODEL = "tiny"
TINY_ROW = {"fare": 2.5, "trip_start_hour": 7, "payment_type": "Cash"}
HEAVY_MODULES = ("tensorflow", "tfx", "apache_beam", "pandas")


def save_tiny_model(export_dir: Path) -> None:
    """A SavedModel that takes the three features of TINY_ROW and answers `probabilities`."""
    import warnings

    sys.path.insert(0, str(REPO))
    from components.compat import select_native_log_level

    select_native_log_level(into_log=False)  # this process's TensorFlow notices are not the figures
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import tensorflow as tf

    module = tf.Module()
    specs = [tf.TensorSpec([None], tf.float32, name="fare"), tf.TensorSpec([None], tf.int64, name="trip_start_hour"),
             tf.TensorSpec([None], tf.string, name="payment_type")]

    @tf.function(input_signature=specs)
    def serve(fare, trip_start_hour, payment_type):
        logits = 0.1 * fare + 0.01 * tf.cast(trip_start_hour, tf.float32) - tf.cast(
            tf.equal(payment_type, "Cash"), tf.float32)
        return {"probabilities": tf.sigmoid(logits)}

    tf.saved_model.save(module, str(export_dir), signatures={"serving_default": serve})


def one_row_csv(folder: Path) -> Path:
    """The embedded taxi data's first row, as a CSV file (`mlops predict --csv` leaves out the label)."""
    sys.path.insert(0, str(REPO))
    from pipeline.data import EMBEDDED_TAXI_DIR

    with (EMBEDDED_TAXI_DIR / "data.csv").open(newline="") as f:
        reader = csv.reader(f)
        header, first = next(reader), next(reader)
    path = folder / "row.csv"
    with path.open("w", newline="") as f:
        csv.writer(f).writerows([header, first])
    return path


def cells(server: ServerProcess, model: str, rows: list[str]) -> dict[str, list[str]]:
    """The `mlops predict` arguments of each cell."""
    return {
        "--help": ["predict", "--help"],
        "REST predict": ["predict", "--rest", f"http://{server.rest_target}", "--model", model, *rows],
        "gRPC predict": ["predict", "--grpc", server.grpc_target, "--model", model, *rows],
    }


def run_once(repo: Path, arguments: list[str], importtime: bool = False) -> tuple[float, str]:
    """The wall seconds of one fresh `mlops` process from `repo`, and its stderr."""
    env = {**os.environ, "PYTHONPATH": str(repo)}
    command = [sys.executable, *(["-X", "importtime"] if importtime else []), "-c", CLI, *arguments]
    started = time.monotonic()
    done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"`mlops {' '.join(arguments)}` from {repo} failed ({done.returncode}):\n"
                           f"{done.stderr[-2000:]}")
    return wall, done.stderr


def imports(stderr: str) -> dict:
    """What an `-X importtime` run imported: the module count, their total import seconds, the heavy ones among
    them."""
    names, total_us = set(), 0
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "| imported package" in line:
            continue
        _, cumulative, name = line.removeprefix("import time:").split("|")
        names.add(name.strip())
        if not name.startswith("  "):  # a top-level import: its cumulative time holds its nested ones
            total_us += int(cumulative)
    return {"modules": len(names), "import_seconds": round(total_us / 1e6, 3),
            "heavy": [m for m in HEAVY_MODULES if m in names]}


def measure(repo: Path, arguments: list[str], repeats: int) -> dict:
    run_once(repo, arguments)  # unmeasured: the page cache
    walls = [run_once(repo, arguments)[0] for _ in range(repeats)]
    return {"median_s": round(statistics.median(walls), 3), "min_s": round(min(walls), 3),
            "max_s": round(max(walls), 3), **imports(run_once(repo, arguments, importtime=True)[1])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-base-path", type=Path,
                        help="folder of <integer version>/ SavedModels (default: a tiny model saved for the run)")
    parser.add_argument("--model-name", default=TINY_MODEL)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each cell (default 5)")
    parser.add_argument("--before-repo", type=Path,
                        help="checkout of the code before (e.g. `git archive` of an older commit): its client is "
                             "timed too, against the same server")
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "benchmarks")
    args = parser.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="predict_startup_"))
    if args.model_base_path is None:
        base_path, model = scratch / TINY_MODEL, TINY_MODEL
        save_tiny_model(base_path / "1")
        rows = ["--json", json.dumps(TINY_ROW)]
    else:
        base_path, model = args.model_base_path.resolve(), args.model_name
        rows = ["--csv", str(one_row_csv(scratch))]
    repos = {"after": REPO}
    if args.before_repo:
        repos = {"before": args.before_repo.resolve(), **repos}
    server = ServerProcess(REPO, base_path, model, [])
    results: dict = {"load_average": [round(os.getloadavg()[0], 2)], "target_s": TARGET_S, "cells": {}}
    try:
        predict_cells = cells(server, model, rows)
        run_once(REPO, predict_cells["REST predict"])  # the server's first calls load the model: not measured
        run_once(REPO, predict_cells["gRPC predict"])
        for label, repo in repos.items():
            for cell, arguments in predict_cells.items():
                results["cells"][f"{label} | {cell}"] = measure(repo, arguments, args.repeats)
    finally:
        server.stop()
    results["load_average"].append(round(os.getloadavg()[0], 2))

    print(f"`mlops predict` start-up, {args.repeats} runs per cell (load average "
          f"{results['load_average'][0]} -> {results['load_average'][1]}, {os.cpu_count()} CPUs)")
    print(f"{'cell':<28} {'median s':>9} {'range s':>13} {'modules':>8} {'imports s':>10}  heavy modules")
    for cell, figures in results["cells"].items():
        print(f"{cell:<28} {figures['median_s']:>9.2f} {figures['min_s']:>6.2f}-{figures['max_s']:<6.2f} "
              f"{figures['modules']:>8} {figures['import_seconds']:>10.2f}  {', '.join(figures['heavy']) or '-'}")
    for transport in ("REST", "gRPC"):
        median = results["cells"][f"after | {transport} predict"]["median_s"]
        print(f"target: {transport} predict under {TARGET_S:.0f} s: {'met' if median < TARGET_S else 'NOT met'} "
              f"({median:.2f} s)")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "predict_startup.json").write_text(json.dumps(results, indent=2))
    print(f"figures in {args.out / 'predict_startup.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
