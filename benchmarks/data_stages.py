"""The data stages' cost curve: ExampleGen, StatisticsGen, validation and Transform on 1x, 10x and 100x the sample.

    make bench-data                                   # 1x, 10x, 100x with the default config (DirectRunner)
    .venv/bin/python -m benchmarks.data_stages --scales 1 10 --set beam.direct_num_workers=1
    .venv/bin/python -m benchmarks.data_stages --scales 1 10 --modes in_memory multi_processing   # the crossover

Each scale runs `mlops run --data-only` in a fresh output folder, without the cache, as a subprocess whose process
tree's resident memory is sampled; the stage times come from ML Metadata (the run's summary.json). Rows per second
is the rows divided by the data stages' time; CPU s is the kernel's user + system time of the whole process tree
(far less sensitive to other jobs on the machine than wall time; the load average is printed beside it). Figures
land in outputs/bench/data_stages.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from benchmarks.measure import REPO, run_measured
from benchmarks.taxi_data import read_sample, write_synthetic

STAGES = {"ExampleGen": ["CsvExampleGen"], "StatisticsGen": ["StatisticsGen"],
          "validation": ["ImportSchemaGen", "ExampleValidator", "DataValidationGate"], "Transform": ["Transform"]}


def data_folder(root: Path, scale: int) -> Path:
    """The CSV folder for `scale`: the embedded sample itself for 1, a generated file otherwise (kept between runs)."""
    if scale == 1:
        from pipeline.data import EMBEDDED_TAXI_DIR

        return EMBEDDED_TAXI_DIR
    folder = root / "data" / f"{scale}x"
    if not (folder / "data.csv").exists():
        print(f"generating {scale}x the sample in {folder}", flush=True)
        write_synthetic(folder, scale)
    return folder


def measure(scale: int, root: Path, overrides: list[str], mode: str = "") -> dict:
    rows = len(read_sample()[1]) * scale
    output = root / "runs" / f"{scale}x{'-' + mode if mode else ''}"
    if mode:
        overrides = [*overrides, f"beam.direct_running_mode={mode}"]
    shutil.rmtree(output, ignore_errors=True)
    output.mkdir(parents=True)
    command = [sys.executable, "-m", "pipeline.cli", "run", "--data-only",
               "--set", f"data.path={data_folder(root, scale)}", "--set", f"output_root={output}",
               "--set", "enable_cache=false", *[flag for o in overrides for flag in ("--set", o)]]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore"}
    load = os.getloadavg()[0]
    wall, peak, cpu = run_measured(command, env, output / "run.log")
    [summary_file] = (output / "runs").glob("*/summary.json")
    seconds = json.loads(summary_file.read_text())["stage_seconds"]
    stages = {group: round(sum(seconds.get(node, 0.0) for node in nodes), 1) for group, nodes in STAGES.items()}
    total = sum(stages.values())
    return {"scale": scale, "rows": rows, "mode": mode or "(config)", "stage_seconds": stages,
            "data_stage_seconds": round(total, 1), "rows_per_second": round(rows / total),
            "wall_seconds": round(wall, 1), "cpu_seconds": round(cpu, 1), "peak_rss_gib": round(peak, 2),
            "load_average": round((load + os.getloadavg()[0]) / 2, 1)}


def table(results: list[dict]) -> list[str]:
    lines = [f"{'scale':>6}{'rows':>10}{'mode':>18}" + "".join(f"{name + ' s':>16}" for name in STAGES)
             + f"{'total s':>9}{'rows/s':>9}{'CPU s':>8}{'peak GiB':>10}{'load':>6}"]
    for r in results:
        lines.append(f"{str(r['scale']) + 'x':>6}{r['rows']:>10}{r['mode']:>18}"
                     + "".join(f"{r['stage_seconds'][name]:>16.1f}" for name in STAGES)
                     + f"{r['data_stage_seconds']:>9.1f}{r['rows_per_second']:>9}{r['cpu_seconds']:>8.1f}"
                     + f"{r['peak_rss_gib']:>10.2f}{r['load_average']:>6.1f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.data_stages", description=__doc__.splitlines()[0])
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "bench")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every run, e.g. beam.direct_num_workers=1")
    parser.add_argument("--modes", nargs="+", default=[""], metavar="MODE",
                        help="beam.direct_running_mode values to run each scale with, one after the other")
    args = parser.parse_args(argv)
    results = []
    for scale in args.scales:
        for mode in args.modes:
            print(f"data stages on {scale}x the sample{' in ' + mode if mode else ''} ...", flush=True)
            results.append(measure(scale, args.out, args.overrides, mode))
            print("\n".join(table(results[-1:])[1:]), flush=True)
    report = args.out / "data_stages.json"
    report.write_text(json.dumps({"cpus": os.cpu_count(), "overrides": args.overrides, "results": results}, indent=1))
    print("\n" + "\n".join(table(results)) + f"\n\n{report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
