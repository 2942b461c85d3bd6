"""CPU seconds per 1,000 requests of every process on a request's path (server, log proxy, router), read from /proc.

A process's CPU time (user + system, all its threads) over a window, divided by the requests answered in it, is what
each request costs that process, whatever else the machine is doing: unlike requests/s, it does not fall when other
load takes the cores (only the cache and scheduling effects of that load remain). It does depend on concurrency (one
client leaves the server idle between requests, 16 let it amortize wake-ups), so it is measured at 1 and 16 clients.
A few thousand requests per cell are enough: the count of clock ticks (10 ms each) is then in the hundreds.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

PROC = Path("/proc")


def stat_cpu_ticks(stat: str) -> int:
    """utime + stime, in clock ticks, of a /proc/<pid>/stat line (proc(5): fields 14 and 15). The command name in
    parentheses may hold spaces and parentheses itself, so fields are counted after its last ')'."""
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def process_cpu_s(pid: int, proc: Path = PROC) -> float:
    """CPU seconds process `pid` has used so far, all its threads, user and system."""
    return stat_cpu_ticks((proc / str(pid) / "stat").read_text()) / os.sysconf("SC_CLK_TCK")


def cpu_snapshot(pids: Mapping[str, int], proc: Path = PROC) -> dict[str, float]:
    """role (server, log proxy, router ...) -> CPU seconds its process has used so far."""
    return {role: process_cpu_s(pid, proc) for role, pid in pids.items()}


def per_1000(before: Mapping[str, float], after: Mapping[str, float], requests: int) -> dict[str, float]:
    """role -> CPU seconds its process spent per 1,000 requests between two snapshots."""
    if requests <= 0:
        raise ValueError(f"CPU per request needs at least one request answered, not {requests}.")
    return {role: 1000 * (after[role] - before[role]) / requests for role in before}


def cores_used(before: Mapping[str, float], after: Mapping[str, float], seconds: float) -> dict[str, float]:
    """role -> CPUs its process kept busy on average over the window (1.0: one core all the time)."""
    return {role: (after[role] - before[role]) / seconds for role in before}


def added(path: Mapping[str, float], reference: Mapping[str, float]) -> float:
    """How much more CPU per request a path's processes spend together than the reference path's: 0.10 is 10% more."""
    return sum(path.values()) / sum(reference.values()) - 1


def requests_per_s_at(cpu_s_per_1000: float, cpus: float) -> float:
    """The rate at which a process costing `cpu_s_per_1000` saturates `cpus` CPUs (where it becomes the bottleneck,
    if it can use them all)."""
    return 1000 * cpus / cpu_s_per_1000
