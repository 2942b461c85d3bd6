"""`mlops cluster flink start|stop|status`: a standing Flink cluster on this machine for the Beam stages
(pipeline/flink_cluster.py; docs/concepts/beam.md)."""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable


def register(subparsers: argparse._SubParsersAction,
             add_config_args: Callable[[argparse.ArgumentParser], None]) -> None:
    cluster = subparsers.add_parser("cluster", help="a standing engine for the Beam stages on this machine: "
                                                    "`flink start|stop|status`")
    engines = cluster.add_subparsers(dest="engine", required=True)
    flink = engines.add_parser("flink", help="Apache Flink: a JobManager, TaskManagers and Beam's Flink job server")
    flink.add_argument("action", choices=["start", "stop", "status"],
                       help="start the cluster, stop the processes it started, or print their state")
    add_config_args(flink)
    flink.add_argument("--json", action="store_true", help="with status: print JSON")
    cluster.set_defaults(handler=cluster_command)


def cluster_command(args: argparse.Namespace) -> int:
    from pipeline import flink_cluster
    from settings.config import load_config

    config = load_config(args.config, args.overrides)
    if args.action == "start":
        state = flink_cluster.start(config)
        print(f"Flink cluster started: REST {state.rest_url}, Beam job server {state.job_endpoint}")
        for process in state.processes:
            print(f"  {process.name:<16}pid {process.pid:<8}log {process.log}")
        settings = config.cluster.flink
        parallelism = settings.taskmanagers * settings.slots_per_taskmanager
        print("run the Beam stages on it with:\n  mlops run " + " ".join(
            f"--set {override}" for override in state.beam_overrides(parallelism)))
        return 0
    if args.action == "stop":
        stopped = flink_cluster.stop(config)
        print(f"stopped {', '.join(stopped)}" if stopped else "no Flink cluster was running")
        return 0
    report = flink_cluster.status(config)
    if report is None:
        print("no Flink cluster is running; start it with `mlops cluster flink start`")
        return 1
    if args.json:
        print(json.dumps({"rest": report.state.rest_url, "job_endpoint": report.state.job_endpoint,
                          "flink_version": report.flink_version, "processes": report.alive,
                          "taskmanagers": report.taskmanagers, "jobs": report.jobs}, indent=2))
        return 0
    print(f"Flink {report.flink_version}: REST {report.state.rest_url}, Beam job server {report.state.job_endpoint}")
    for name, alive in report.alive.items():
        print(f"  {name:<16}{'running' if alive else 'gone'}")
    for manager in report.taskmanagers:
        print(f"  TaskManager {manager['id']}: {manager['slotsNumber'] - manager['freeSlots']}/"
              f"{manager['slotsNumber']} slots busy")
    for job in report.jobs:
        print(f"  job {job['jid']} {job['state']:<9} {job['duration'] / 1000:.1f}s  {job['name']}")
    return 0 if all(report.alive.values()) else 1
