"""The data stages on the in-process runner and on a Flink cluster, side by side: wall time, CPU and peak memory.

    .venv/bin/python -m benchmarks.beam_runners                       # 1x, 10x, 100x on both runners
    .venv/bin/python -m benchmarks.beam_runners --scales 1 10         # fewer scales
    .venv/bin/python -m benchmarks.beam_runners --scales 100 --runners direct --append   # add to an earlier run

Each scale runs `mlops run --data-only` (ExampleGen, StatisticsGen, validation, Transform) without the cache on 1x,
10x and 100x the taxi sample (benchmarks/data_stages.py makes the files): first on Beam's in-process runner (the
default config), then on a standing Flink 1.19 cluster on this machine (`mlops cluster flink start`: a JobManager,
two TaskManagers of one slot each, Beam's Flink job server, parallelism 2), started once after the in-process runs
so its idle JVMs do not share the CPUs with them. Needs `make flink`.

CPU seconds are the kernel's user + system time of every process involved, read from /proc (psutil): for the
in-process runner the run's process tree; for Flink the run's tree plus the growth, over the run, of the cluster's
process trees (the JVMs and the SDK workers they start; a worker that exits is counted in its parent's children
time). Peak memory is the largest sum of resident memory over those same processes, sampled twice a second (the
idle cluster's share is reported beside it). Stage times come from ML Metadata. Figures land in
outputs/bench/beam_runners.json with a chart beside it (beam_runners.png).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from benchmarks.data_stages import STAGES, data_folder
from benchmarks.measure import REPO
from benchmarks.taxi_data import read_sample

TASKMANAGERS = 2
PARALLELISM = 2
TASKMANAGER_MEMORY = "3072m"
TASK_OFF_HEAP = "512m"


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def cpu_seconds(pids: list[int]) -> float:
    """User + system time of each process tree, its reaped children included (/proc/<pid>/stat)."""
    total = 0.0
    for process in (p for pid in pids for p in tree(pid)):
        try:
            times = process.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
        except psutil.Error:
            pass
    return total


def resident_gib(processes: list[psutil.Process]) -> float:
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**30


def run(command: list[str], log_path: Path, cluster_pids: list[int]) -> tuple[float, float, float]:
    """Runs `command`; returns (wall s, CPU s of its tree and of the cluster's growth, peak resident GiB of both)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore"}
    cluster_before = cpu_seconds(cluster_pids)
    peak = 0.0
    started = time.monotonic()
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.is_set():
                everything = tree(process.pid) + [p for pid in cluster_pids for p in tree(pid)]
                peak = max(peak, resident_gib(everything))
                done.wait(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(process.pid, 0)
        done.set()
        sampler.join()
    wall = time.monotonic() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command)} failed; see {log_path}")
    cpu = usage.ru_utime + usage.ru_stime + cpu_seconds(cluster_pids) - cluster_before
    return wall, cpu, peak


def measure(runner: str, scale: int, root: Path, overrides: list[str], cluster_pids: list[int]) -> dict:
    rows = len(read_sample()[1]) * scale
    output = root / "runs" / f"{runner}-{scale}x"
    shutil.rmtree(output, ignore_errors=True)
    output.mkdir(parents=True)
    command = [sys.executable, "-m", "pipeline.cli", "run", "--data-only",
               "--set", f"data.path={data_folder(root, scale)}", "--set", f"output_root={output}",
               "--set", "enable_cache=false", *[flag for o in overrides for flag in ("--set", o)]]
    load = os.getloadavg()[0]
    wall, cpu, peak = run(command, output / "run.log", cluster_pids)
    [summary_file] = (output / "runs").glob("*/summary.json")
    seconds = json.loads(summary_file.read_text())["stage_seconds"]
    stages = {group: round(sum(seconds.get(node, 0.0) for node in nodes), 1) for group, nodes in STAGES.items()}
    return {"runner": runner, "scale": scale, "rows": rows, "stage_seconds": stages,
            "data_stage_seconds": round(sum(stages.values()), 1), "wall_seconds": round(wall, 1),
            "cpu_seconds": round(cpu, 1), "peak_rss_gib": round(peak, 2),
            "load_average": round((load + os.getloadavg()[0]) / 2, 1)}


def flink_jobs(state, since_ms: float) -> list[dict]:
    """The Flink jobs that started after `since_ms` (epoch ms): name, state, seconds and task count (REST API)."""
    from pipeline import flink_cluster

    jobs = [j for j in flink_cluster.rest(state, "/jobs/overview")["jobs"] if j["start-time"] >= since_ms]
    return [{"name": j["name"], "state": j["state"], "seconds": round(j["duration"] / 1000, 1),
             "tasks": j["tasks"]["total"]} for j in sorted(jobs, key=lambda j: j["start-time"])]


def table(results: list[dict]) -> list[str]:
    lines = [f"{'runner':>8}{'scale':>6}{'rows':>10}" + "".join(f"{name + ' s':>16}" for name in STAGES)
             + f"{'stages s':>10}{'wall s':>8}{'CPU s':>8}{'peak GiB':>10}{'load':>6}"]
    for r in results:
        lines.append(f"{r['runner']:>8}{str(r['scale']) + 'x':>6}{r['rows']:>10}"
                     + "".join(f"{r['stage_seconds'][name]:>16.1f}" for name in STAGES)
                     + f"{r['data_stage_seconds']:>10.1f}{r['wall_seconds']:>8.1f}{r['cpu_seconds']:>8.1f}"
                     + f"{r['peak_rss_gib']:>10.2f}{r['load_average']:>6.1f}")
    return lines


def chart(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scales = sorted({r["scale"] for r in results})
    runners = [name for name in ("direct", "flink") if any(r["runner"] == name for r in results)]
    by = {(r["runner"], r["scale"]): r for r in results}
    figure, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    width = 0.8 / len(runners)
    for panel, (key, title, unit) in zip(axes, [("wall_seconds", "wall time", "seconds"),
                                                ("cpu_seconds", "CPU (all processes)", "seconds"),
                                                ("peak_rss_gib", "peak resident memory", "GiB")], strict=True):
        for offset, (runner, colour) in enumerate(zip(runners, ("#4c72b0", "#dd8452"), strict=False)):
            xs = [i + offset * width for i, s in enumerate(scales) if (runner, s) in by]
            panel.bar(xs, [by[runner, s][key] for s in scales if (runner, s) in by], width, color=colour,
                      label="in-process" if runner == "direct" else f"Flink, {TASKMANAGERS} TaskManagers")
        panel.set_xticks([i + width * (len(runners) - 1) / 2 for i in range(len(scales))],
                         [f"{s}x" for s in scales])
        panel.set(title=title, xlabel="taxi sample scale", ylabel=unit)
    axes[0].legend(fontsize=8)
    figure.suptitle(f"data stages (mlops run --data-only), {os.cpu_count()} CPUs")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.beam_runners", description=__doc__.splitlines()[0])
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--runners", nargs="+", default=["direct", "flink"], choices=["direct", "flink"])
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "bench")
    parser.add_argument("--append", action="store_true",
                        help="keep the earlier report's figures for the runners and scales not run now")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    report = args.out / "beam_runners.json"
    results: list[dict] = []
    cluster: dict = {}
    if args.append and report.exists():
        earlier = json.loads(report.read_text())
        results = [r for r in earlier["results"] if not (r["runner"] in args.runners and r["scale"] in args.scales)]
        cluster = earlier["cluster"] if "flink" not in args.runners else {}

    def write() -> None:
        report.write_text(json.dumps({"cpus": os.cpu_count(), "memory_gib": round(psutil.virtual_memory().total
                                                                                   / 2**30, 1),
                                      "cluster": cluster, "results": results}, indent=1))
        chart(results, args.out / "beam_runners.png")

    if "direct" in args.runners:
        for scale in args.scales:
            print(f"in-process runner on {scale}x the sample ...", flush=True)
            results.append(measure("direct", scale, args.out, [], []))
            print("\n".join(table(results[-1:])[1:]), flush=True)
            write()
    if "flink" in args.runners:
        from pipeline import flink_cluster
        from settings.config import load_config

        config = load_config(None, [f"output_root={args.out / 'flink'}",
                                    f"cluster.flink.taskmanagers={TASKMANAGERS}",
                                    "cluster.flink.slots_per_taskmanager=1",
                                    # At the default 1536m, 0m off-heap a TaskManager ran out of direct memory on
                                    # 10x (Beam's Fn API buffers): 512m of it, within 3 GiB per TaskManager.
                                    f"cluster.flink.taskmanager_memory={TASKMANAGER_MEMORY}",
                                    f"cluster.flink.taskmanager_task_off_heap_memory={TASK_OFF_HEAP}"])
        started = time.monotonic()
        state = flink_cluster.start(config)
        try:
            pids = [p.pid for p in state.processes]
            cluster.update({"start_seconds": round(time.monotonic() - started, 1), "taskmanagers": TASKMANAGERS,
                            "parallelism": PARALLELISM, "taskmanager_memory": TASKMANAGER_MEMORY,
                            "task_off_heap": TASK_OFF_HEAP,
                            "idle_rss_gib": round(resident_gib([p for pid in pids for p in tree(pid)]), 2)})
            for scale in args.scales:
                print(f"Flink on {scale}x the sample ...", flush=True)
                since = time.time() * 1000
                results.append(measure("flink", scale, args.out, state.beam_overrides(PARALLELISM), pids))
                results[-1]["flink_jobs"] = flink_jobs(state, since)
                results[-1]["cluster"] = dict(cluster)
                print("\n".join(table(results[-1:])[1:]), flush=True)
                write()
        finally:
            flink_cluster.stop(config)
    write()
    print("\n" + "\n".join(table(results)) + f"\n\n{report}\n{args.out / 'beam_runners.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
