"""Where a pipeline run's time goes: per stage and per process, wall time and CPU time, and the fixed costs.

    .venv/bin/python -m benchmarks.profile_pipeline                      # `mlops run --serve-after`, default config
    .venv/bin/python -m benchmarks.profile_pipeline --set beam.direct_running_mode=multi_processing
    .venv/bin/python -m benchmarks.profile_pipeline --data-only --set data.path=outputs/bench/data/10x

Runs `mlops run` in a fresh output folder without the cache, reads its stage lines as they are printed and samples
the CPU time and resident memory of every process of its tree four times a second. CPU time is charged to the stage
running when it was spent and to the kind of process that spent it: the `mlops` process itself, Beam's worker
processes, converter subprocesses, Node.js and the rest. The whole tree's CPU time is also taken exactly from the
kernel when the run ends (wait4), so what the sampling missed (processes that ended between two samples) shows as
`unsampled`. Then it times the fixed costs every process pays before any work: starting Python and importing
TensorFlow, TFX, Beam, TF Transform and the `mlops` command line, each in a fresh process.

CPU time (user + system) is far less sensitive to other jobs on the machine than wall time; the load average is
printed beside both. Figures land in <out>/profile_pipeline.json.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import psutil

from benchmarks.measure import REPO

STAGE_LINE = re.compile(r"\[\d+/\d+\] (\S+) (\.\.\.|done in [\d.]+s)")
SAMPLE_SECONDS = 0.25
# Phases outside the stages: before the first stage starts, between stages (TFX's drivers and publishers), after
# the last one (summary, report, serving).
START_UP, BETWEEN, AFTER = "(start-up)", "(between stages)", "(after the stages)"
IMPORTS = {
    "python": "pass",
    "tensorflow": "import tensorflow",
    "apache_beam": "import apache_beam",
    "tfx": "from tfx.orchestration.local.local_dag_runner import LocalDagRunner",
    "tensorflow_transform": "import tensorflow_transform",
    "tensorflow_model_analysis": "import tensorflow_model_analysis",
    "mlops command line": "import pipeline.cli",
    "mlops run (pipeline built)": "import pipeline.pipeline",
}


def process_kind(process: psutil.Process, root_pid: int) -> str:
    if process.pid == root_pid:
        return "mlops"
    try:
        command = " ".join(process.cmdline())
    except psutil.Error:
        return "other"
    if "sdk_worker_main" in command or "apache_beam" in command:
        return "beam worker"
    if "tensorflowjs" in command:
        return "tfjs converter"
    if "components.distributed" in command:
        return "training worker"
    if "multiprocessing.spawn" in command and process.ppid() == root_pid:
        return "stage worker"  # pipeline/local/stage_workers.py
    if Path(command.split(" ")[0]).name.startswith("node"):
        return "node"
    return "python" if "python" in command else "other"


class TreeSampler:
    """Charges the CPU time of every process below `root` to the current phase and the process's kind."""

    def __init__(self, root: psutil.Process):
        self.root = root
        self.phase = START_UP
        self.cpu = defaultdict(float)           # (phase, kind) -> CPU seconds
        self.peak_rss = defaultdict(float)      # phase -> peak GiB of the tree
        self.phase_wall: dict[str, float] = {}  # phase -> wall seconds spent in it, in order of first entry
        self._phase_started = time.monotonic()
        self.processes: dict[int, dict] = {}    # pid -> kind, first and last seen, CPU seconds
        self._last_cpu: dict[int, float] = {}
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.started = time.monotonic()

    def set_phase(self, phase: str) -> None:
        with self._lock:
            self._sample()
            now = time.monotonic()
            self.phase_wall[self.phase] = self.phase_wall.get(self.phase, 0.0) + now - self._phase_started
            self._phase_started = now
            self.phase = phase

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._done.wait(SAMPLE_SECONDS):
            with self._lock:
                self._sample()

    def _sample(self) -> None:
        try:
            tree = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return
        rss = 0
        now = time.monotonic() - self.started
        for process in tree:
            try:
                with process.oneshot():
                    times = process.cpu_times()
                    cpu = times.user + times.system
                    rss += process.memory_info().rss
                    record = self.processes.get(process.pid)
                    if record is None:
                        record = self.processes[process.pid] = {
                            "kind": process_kind(process, self.root.pid), "first_seen": now, "cpu": 0.0}
            except psutil.Error:
                continue
            delta = cpu - self._last_cpu.get(process.pid, 0.0)
            self._last_cpu[process.pid] = cpu
            record["last_seen"] = now
            record["cpu"] = cpu
            self.cpu[(self.phase, record["kind"])] += delta
        self.peak_rss[self.phase] = max(self.peak_rss[self.phase], rss / 2**30)


def run_profiled(command: list[str], env: dict[str, str], log_path: Path) -> dict:
    """Runs `command`, following its stage lines; returns stage times, CPU per stage and process kind, processes."""
    started = time.monotonic()
    load_before = os.getloadavg()
    stages: dict[str, dict] = {}
    console: list[str] = []
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=log, cwd=REPO, text=True,
                                   bufsize=1)
        sampler = TreeSampler(psutil.Process(process.pid))
        sampler.start()
        for line in process.stdout:
            console.append(line.rstrip("\n"))
            log.write(line)
            match = STAGE_LINE.search(line)
            if not match:
                continue
            node, what = match.groups()
            now = time.monotonic() - started
            if what == "...":
                stages[node] = {"start": now}
            else:
                stages.setdefault(node, {"start": now})["end"] = now
                stages[node]["reported_seconds"] = float(what.split()[-1][:-1])
            # Stages that run at once (parallel_stages) share a phase: "StatisticsGen + Transform".
            running = [n for n, s in stages.items() if "end" not in s]
            sampler.set_phase(AFTER if what != "..." and _is_last(line) else " + ".join(running) or BETWEEN)
        _, status, usage = os.wait4(process.pid, 0)
        sampler.set_phase(AFTER)
        sampler.stop()
    wall = time.monotonic() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command)} failed; see {log_path}")
    sampled = sum(sampler.cpu.values())
    tree_cpu = usage.ru_utime + usage.ru_stime
    return {
        "wall_seconds": round(wall, 1),
        "tree_cpu_seconds": round(tree_cpu, 1),
        "unsampled_cpu_seconds": round(max(0.0, tree_cpu - sampled), 1),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "stages": stages,
        "phase_seconds": {phase: round(seconds, 2) for phase, seconds in sampler.phase_wall.items()},
        "cpu": {f"{phase}|{kind}": round(seconds, 2) for (phase, kind), seconds in sampler.cpu.items()},
        "peak_rss_gib": {phase: round(gib, 2) for phase, gib in sampler.peak_rss.items()},
        "processes": sorted(sampler.processes.values(), key=lambda p: p["first_seen"]),
        "console": console,
    }


def _is_last(line: str) -> bool:
    position = re.search(r"\[(\d+)/(\d+)\]", line)
    return bool(position) and position.group(1) == position.group(2)


def import_costs(env: dict[str, str], repeats: int) -> dict[str, dict]:
    """Wall and CPU seconds of a fresh Python process that imports one thing and exits (the median of `repeats`)."""
    costs = {}
    for name, statement in IMPORTS.items():
        walls, cpus = [], []
        for _ in range(repeats):
            started = time.monotonic()
            process = subprocess.Popen([sys.executable, "-c", f"import components; {statement}"], env=env, cwd=REPO,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            _, _, usage = os.wait4(process.pid, 0)
            walls.append(time.monotonic() - started)
            cpus.append(usage.ru_utime + usage.ru_stime)
        costs[name] = {"wall_seconds": round(sorted(walls)[len(walls) // 2], 2),
                       "cpu_seconds": round(sorted(cpus)[len(cpus) // 2], 2)}
    return costs


KINDS = ("mlops", "stage worker", "beam worker", "tfjs converter", "training worker", "node", "python", "other")


def stage_table(result: dict) -> list[str]:
    cpu: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for key, seconds in result["cpu"].items():
        phase, kind = key.split("|")
        cpu[phase][kind] += seconds
    kinds = [k for k in KINDS if any(k in by_kind for by_kind in cpu.values())]
    header = f"{'phase':<34}{'wall s':>8}{'CPU s':>8}" + "".join(f"{k[:14]:>16}" for k in kinds) + f"{'peak GiB':>10}"
    lines = [header, "-" * len(header)]
    # Wall time per phase as the run spent it (phases sum to the whole run); BETWEEN gathers the gaps between stages.
    phase_wall = result["phase_seconds"]
    phases = [p for p in phase_wall if p not in (BETWEEN, AFTER)] + [BETWEEN, AFTER]
    for phase in phases:
        wall = phase_wall.get(phase, 0.0)
        by_kind = cpu.get(phase, {})
        total = sum(by_kind.values())
        if wall < 0.05 and total < 0.05:
            continue
        lines.append(f"{phase:<34}{wall:>8.1f}{total:>8.1f}" + "".join(f"{by_kind.get(k, 0.0):>16.1f}" for k in kinds)
                     + f"{result['peak_rss_gib'].get(phase, 0.0):>10.2f}")
    totals = defaultdict(float)
    for by_kind in cpu.values():
        for kind, seconds in by_kind.items():
            totals[kind] += seconds
    lines.append("-" * len(header))
    lines.append(f"{'whole run':<34}{result['wall_seconds']:>8.1f}{result['tree_cpu_seconds']:>8.1f}"
                 + "".join(f"{totals.get(k, 0.0):>16.1f}" for k in kinds)
                 + f"{max(result['peak_rss_gib'].values(), default=0.0):>10.2f}")
    lines.append("(CPU s of the whole run is the kernel's figure for the process tree; "
                 f"{result['unsampled_cpu_seconds']} s of it ended between two samples)")
    return lines


def process_table(result: dict) -> list[str]:
    by_kind: dict[str, list[dict]] = defaultdict(list)
    for record in result["processes"]:
        by_kind[record["kind"]].append(record)
    lines = [f"{'process kind':<18}{'count':>6}{'CPU s':>8}{'mean lifetime s':>17}"]
    for kind in KINDS:
        records = by_kind.get(kind)
        if records:
            lifetime = sum(r["last_seen"] - r["first_seen"] for r in records) / len(records)
            lines.append(f"{kind:<18}{len(records):>6}{sum(r['cpu'] for r in records):>8.1f}{lifetime:>17.1f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_pipeline", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "bench")
    parser.add_argument("--config", default=None)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--data-only", action="store_true", help="ExampleGen to Transform only")
    parser.add_argument("--import-repeats", type=int, default=3, help="fresh processes per import measured (0: none)")
    args = parser.parse_args(argv)
    output = args.out / "profile_run"
    shutil.rmtree(output, ignore_errors=True)
    output.mkdir(parents=True)
    command = [sys.executable, "-m", "pipeline.cli", "run", "--data-only" if args.data_only else "--serve-after",
               "--set", f"output_root={output}", "--set", "enable_cache=false",
               *(["--config", args.config] if args.config else []),
               *[flag for o in args.overrides for flag in ("--set", o)]]
    env = dict(os.environ)
    print(f"profiling {' '.join(command[2:])} ...", flush=True)
    result = run_profiled(command, env, output / "profile.log")
    result["command"] = command[1:]
    result["cpus"] = os.cpu_count()
    lines = [f"wall {result['wall_seconds']} s, CPU {result['tree_cpu_seconds']} s on {os.cpu_count()} CPUs; load "
             f"average {result['load_average_before'][0]} before, {result['load_average_after'][0]} after", "",
             *stage_table(result), "",
             "each stage's own wall s, as the run reported it: " + ", ".join(
                 f"{node} {stage['reported_seconds']:.1f}" for node, stage in result["stages"].items()
                 if "reported_seconds" in stage),
             "", *process_table(result)]
    if args.import_repeats:
        print("timing imports in fresh processes ...", flush=True)
        result["imports"] = import_costs(env, args.import_repeats)
        lines += ["", f"{'a fresh process that imports':<32}{'wall s':>8}{'CPU s':>8}"]
        lines += [f"{name:<32}{c['wall_seconds']:>8.2f}{c['cpu_seconds']:>8.2f}"
                  for name, c in result["imports"].items()]
    report = args.out / "profile_pipeline.json"
    report.write_text(json.dumps(result, indent=1))
    print("\n".join(lines) + f"\n\n{report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
