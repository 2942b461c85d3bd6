"""Running a command while sampling the resident memory of its whole process tree."""
from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent


def run_measured(command: list[str], env: dict[str, str], log_path: Path) -> tuple[float, float, float]:
    """Runs `command`, returns (wall seconds, peak resident GiB summed over the process tree, CPU seconds of the
    tree: user + system of the command and every process it waited for, from the kernel)."""
    peak = 0.0
    started = time.monotonic()
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        root = psutil.Process(process.pid)
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.is_set():
                try:
                    tree = [root, *root.children(recursive=True)]
                    peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()) / 2**30)
                except psutil.Error:
                    pass
                done.wait(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(process.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        done.set()
        sampler.join()
    if code != 0:
        raise SystemExit(f"{' '.join(command)} failed with exit code {code}; see {log_path}")
    return time.monotonic() - started, peak, usage.ru_utime + usage.ru_stime
