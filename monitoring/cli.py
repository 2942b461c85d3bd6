"""`mlops monitor`: judge a window of request logs against the serving version's training data (monitoring/monitor.py).

Exit codes: 0 no threshold crossed (or too few requests to judge), 3 a threshold crossed or an anomaly found (with
--retrain: whatever the retraining run did, unless it failed), 4 a threshold crossed and the retraining run failed, 2
a problem to fix first (no logs, a version without training data, a bad window), 1 the Pushgateway did not take the
figures."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable


def register(subparsers: argparse._SubParsersAction,
             add_config_args: Callable[[argparse.ArgumentParser], None]) -> None:
    monitor = subparsers.add_parser(
        "monitor", help="served requests against the version's training data (skew) and the window before (drift): "
                        "an HTML page, a JSON record and Prometheus gauges; exit code 3 when a threshold is crossed",
        epilog="exit codes: 0 no threshold crossed (or too few requests to judge); 3 a feature flagged (with "
               "--retrain: the run published a version, found nothing new, was not blessed, or was skipped by the "
               "cooldown); 4 a feature flagged and the retraining run failed; 2 a problem to fix first (no logs, a "
               "version without training data, a bad window); 1 the Pushgateway did not take the gauges")
    add_config_args(monitor)
    monitor.add_argument("--since", help="the window's start: an ISO 8601 UTC time (2026-01-31T14:00:00Z) or a span "
                                         "before now (90m, 2h, 1d)")
    monitor.add_argument("--until", help="the window's end, written as --since (default: now)")
    monitor.add_argument("--last", type=int, metavar="N",
                         help="the last N logged requests (default without --since: monitoring.window_requests)")
    monitor.add_argument("--version", type=int,
                         help="judge this version's requests (default: the version that answered most of them)")
    monitor.add_argument("--pushgateway", metavar="URL",
                         help="PUT the gauges to this Prometheus Pushgateway (default: monitoring.pushgateway)")
    monitor.add_argument(
        "--retrain", action="store_true",
        help="when a threshold is crossed, run the pipeline here (as `mlops run` does, same --config and --set) on "
             "data.path; the new version is blessed and published as usual, and rolled out with `mlops rollout "
             "start`. Skipped when a retrain for the same serving version started within "
             "monitoring.retrain_cooldown_hours. It runs the local pipeline, not Kubeflow: the cluster's CronJob "
             "does not pass it (docs/tutorials/monitoring.md)")
    monitor.set_defaults(handler=monitor_command)


def _print_summary(record: dict, folder: str) -> None:
    window = record["window"]
    if window["files"]:
        print(f"window: {window['requests']:,} requests ({window['rows']:,} rows) answered by version "
              f"{record['version']}, logged {window['from']} to {window['to']}")
    if not record["judged"]:
        print(f"not judged: {record['note']}")
    for feature in record["features"]:
        marks = []
        for comparison in ("skew", "drift"):
            distance = feature[comparison]
            if distance is not None and distance["crossed"]:
                marks.append(f"{comparison} {distance['value']:.4f} > {distance['threshold']:.4f} "
                             f"({distance['measure']})")
        marks += feature["anomalies"]
        if marks:
            print(f"  FLAGGED {feature['name']}: " + "; ".join(marks))
    if record["judged"]:
        print(f"{len(record['flagged'])} feature(s) flagged" if record["flagged"] else "no threshold crossed")
        if not record["previous"]["judged"]:
            print("drift not judged: the window before holds too few requests")
    print(f"report: {record['files']['html']}\nrecord: {record['files']['json']}\ngauges: {record['files']['prom']}"
          f"\noutput folder: {folder}")


def _print_retrain(record: dict) -> None:
    retrain = record["retrain"]
    if retrain["outcome"] == "failed":
        print(f"error: {retrain['note']}", file=sys.stderr)
        return
    if not retrain["started"]:
        print(f"retrain: {retrain['note']}")
        return
    print(f"\nretrain: {retrain['note']}")
    if retrain.get("run_id"):
        print(f"  run         {retrain['run_id']} (started {retrain['started_at']}, finished {retrain['finished_at']})"
              f"\n  run report  {retrain['report']}")
    print(f"  record      {record['files']['json']}")


def monitor_command(args: argparse.Namespace) -> int:
    from monitoring.logs import now_utc
    from monitoring.monitor import monitor, read_record, window_from_arguments
    from settings.config import load_config

    config = load_config(args.config, args.overrides)
    now = now_utc()
    window = window_from_arguments(args.since, args.until, args.last, config.monitoring.window_requests, now)
    result = monitor(config, window, version=args.version, pushgateway=args.pushgateway, now=now)
    # What is printed is read back from the record the run wrote.
    _print_summary(read_record(result.folder), result.folder)
    if result.push_error:
        print(f"error: {result.push_error}", file=sys.stderr)
    if args.retrain:
        from monitoring.retrain import retrain

        result = retrain(config, result)
        _print_retrain(read_record(result.folder))
    return result.exit_code
