"""`mlops versions` (what the model repository holds) and `mlops rollout start|status|promote|rollback`."""
from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable
from typing import Any

from reports.records import ExportReport
from rollout.backends import Backend, BackendError
from settings.files import EXPORT_REPORT_JSON


def register(subparsers: argparse._SubParsersAction,
             add_config_args: Callable[[argparse.ArgumentParser], None]) -> None:
    versions = subparsers.add_parser(
        "versions", help="list the model repository's versions: blessing, export verdict, checksums, labels")
    add_config_args(versions)
    versions.add_argument("--json", action="store_true", help="print JSON instead of a table")
    versions.set_defaults(handler=versions_command)

    rollout = subparsers.add_parser("rollout", help="move a published version to traffic: verify, promote, roll back")
    actions = rollout.add_subparsers(dest="action", required=True)
    start = actions.add_parser("start", help="start (or resume) the rollout of a version")
    start.add_argument("--version", type=int, required=True, help="the published version to roll out")
    start.add_argument("--no-wait", action="store_true",
                       help="after promotion, return instead of waiting out rollout.keep_previous_seconds")
    start.add_argument("--allow-downgrade", action="store_true",
                       help="roll out a version older than the stable one")
    start.add_argument("--retry", action="store_true",
                       help="roll out again a version whose last rollout was rolled back (without it, `start` "
                            "reports that outcome and does nothing)")
    status = actions.add_parser("status", help="the rollout in progress and the recorded outcomes")
    status.add_argument("--json", action="store_true", help="print the whole state document as JSON")
    promote = actions.add_parser("promote", help="promote the candidate now (or retire the kept previous version)")
    promote.add_argument("--no-wait", action="store_true", help="do not wait out rollout.keep_previous_seconds")
    actions.add_parser("rollback", help="roll the current rollout back (also just after a promotion)")
    for action in (start, status, promote, actions.choices["rollback"]):
        add_config_args(action)
    rollout.set_defaults(handler=rollout_command)


def version_rows(base_dir: str, model: str) -> list[dict[str, Any]]:
    """One row per published version: blessing, task kind, export verdict, checksum state, labels and serving
    tracks."""
    from serving.repository.base import TRACK_CONFIG_FILES
    from serving.repository.factory import open_repository

    repository = open_repository(base_dir)
    tracks = {track: open_repository(base_dir, track) for track in TRACK_CONFIG_FILES}
    served = {track: set(r.served_versions(model)) for track, r in tracks.items()}
    labels = {track: r.labels(model) for track, r in tracks.items()}
    rows = []
    for version in repository.versions(model):
        publication = repository.publication(model, version)
        try:
            report = ExportReport.from_dict(json.loads(repository.read_version_file(model, version,
                                                                                    EXPORT_REPORT_JSON)))
            export = "passed" if report.passed else "FAILED"
        except (OSError, ValueError):
            export = "no report"
        check = repository.verify(model, version)
        blessed = publication.get("blessed")
        rows.append({
            "version": version,
            "blessed": "yes" if blessed else ("no" if blessed is False else "unknown"),
            "task": (publication.get("task") or {}).get("kind", "unknown"),
            # The decision threshold chosen with the calibration (components/calibration.py); None when none was.
            "threshold": (publication.get("calibration") or {}).get("threshold"),
            "export": export,
            "checksums": check.state,
            "checksum_problems": check.problems,
            "labels": sorted(f"{label}" for track in tracks for label, v in labels[track].items() if v == version),
            "served_by": sorted(track for track in tracks if version in served[track]),
            "published_at": publication.get("published_at", ""),
        })
    return rows


def versions_command(args: argparse.Namespace) -> int:
    from settings.config import load_config

    config = load_config(args.config, args.overrides)
    rows = version_rows(config.serving_base_dir, config.model_name)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no published version of {config.model_name!r} under {config.serving_base_dir}; run the pipeline.")
        return 0
    print(f"{'version':>7}  {'blessed':<8} {'task':<11} {'threshold':<9} {'export':<9} {'checksums':<11} "
          f"{'labels':<15} {'served by':<15} published")
    for row in rows:
        threshold = "-" if row["threshold"] is None else f"{row['threshold']:.4f}"
        print(f"{row['version']:>7}  {row['blessed']:<8} {row['task']:<11} {threshold:<9} {row['export']:<9} "
              f"{row['checksums']:<11} {','.join(row['labels']) or '-':<15} {','.join(row['served_by']) or '-':<15} "
              f"{row['published_at']}")
        for problem in row["checksum_problems"][:5]:
            print(f"         ! {problem}")
    return 0


def router_weight(backend: Backend) -> str:
    """The canary's share as the router applies it now: after promotion or a rollback's route step it is 0, whatever
    step the state names."""
    try:
        weight = f"{backend.canary_weight()}%"
        copied = backend.shadow_percent() if backend.can_mirror() else 0
    except (BackendError, OSError) as e:
        return f"unknown ({e})"
    # At the shadow step the canary answers copies of the users' requests that no user gets.
    return f"{weight}, {copied}% of the requests copied to it" if copied else weight


def _print_status(document: dict[str, Any], report_dir: str | None, backend: Backend) -> None:
    from rollout.controller import describe_figures
    from rollout.report import report_paths

    current = document.get("current")
    if current is None:
        print("no rollout in progress")
    else:
        print(f"rollout {current['id']}: version {current['candidate']} over stable {current['stable']}, phase "
              f"{current['phase']}, canary traffic {router_weight(backend)}" + (f", PAUSED: {current['paused']}"
                                                                        if current.get("paused") else ""))
        for event in current.get("events", [])[-5:]:
            print(f"  {event['at']}  {event['message']}")
    for record in document.get("history", [])[-5:]:
        print(f"{record['finished_at']}  version {record['candidate']} over {record['stable']}: {record['outcome']}"
              + (f" ({record['reason']})" if record.get("reason") else ""))
        for event in record.get("events", []):
            if "figures" in event:
                print(f"    {describe_figures(event['figures'])}")
        page = report_paths(report_dir, record)[1] if report_dir is not None else None
        if page is not None:
            import tensorflow as tf

            if tf.io.gfile.exists(page):
                print(f"    report: {page}")


# 128 + SIGTERM, what a shell reports for a process the signal ended.
TERMINATED_EXIT_CODE = 143


class Terminated(BaseException):
    """SIGTERM (a deleted or evicted pod, `kill`): unwinds the controller as Ctrl-C does, so its Lease is released."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


def rollout_command(args: argparse.Namespace) -> int:
    from rollout.factory import build_controller
    from settings.config import load_config

    config = load_config(args.config, args.overrides)
    controller = build_controller(config)
    if args.action == "status":
        document = controller.document()
        print(json.dumps(document, indent=2) if args.json else "", end="\n" if args.json else "")
        if not args.json:
            _print_status(document, controller.report_dir, controller.backend)
        return 0
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        if args.action == "start":
            record = controller.start(args.version, wait_retain=not args.no_wait, retry=args.retry,
                                      allow_downgrade=args.allow_downgrade)
        elif args.action == "promote":
            record = controller.promote(wait_retain=not args.no_wait)
        else:
            record = controller.rollback()
    except Terminated:
        print("stopped by SIGTERM: the controller's lock was released and the state keeps the rollout where it was; "
              "`mlops rollout status` shows it, and the same command resumes it.", file=sys.stderr)
        return TERMINATED_EXIT_CODE
    finally:
        signal.signal(signal.SIGTERM, previous)
    outcome = record.get("outcome")
    if outcome == "rolled_back":
        return 3
    # Paused on inconclusive windows: traffic stays where it was; the state says why.
    if record.get("paused"):
        return 4
    return 0
