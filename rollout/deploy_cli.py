"""`mlops deploy local [--stop | --status]`: the stable and canary servers, Envoy and Prometheus on this machine
(rollout/local_stack.py)."""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable


def register(subparsers: argparse._SubParsersAction,
             add_config_args: Callable[[argparse.ArgumentParser], None]) -> None:
    deploy = subparsers.add_parser(
        "deploy", help="run the serving stack: `local` starts the stable and canary servers, Envoy and Prometheus")
    targets = deploy.add_subparsers(dest="target", required=True)
    local = targets.add_parser("local", help="the stack on this machine (docs/tutorials/local-rollout.md)")
    add_config_args(local)
    what = local.add_mutually_exclusive_group()
    what.add_argument("--stop", action="store_true", help="stop every process the running stack started")
    what.add_argument("--status", action="store_true", help="the stack's processes, router weights and scrapes")
    local.add_argument("--json", action="store_true", help="with --status: print JSON")
    deploy.set_defaults(handler=deploy_command)


def deploy_command(args: argparse.Namespace) -> int:
    from rollout import local_stack
    from settings.config import load_config

    config = load_config(args.config, args.overrides)
    settings = config.rollout.local
    base = config.serving_base_dir
    if args.stop:
        stopped = local_stack.stop(base, settings.stack_dir)
        print(f"stopped {', '.join(stopped)}" if stopped else "no local stack was running")
        return 0
    if args.status:
        report = local_stack.status(base, settings.stack_dir)
        if report is None:
            print("no local stack is running; start it with `mlops deploy local`")
            return 1
        if args.json:
            print(json.dumps(report, indent=2))
            return 0
        for name, process in report["processes"].items():
            where = f"  REST {process['rest']}  gRPC {process['grpc']}" if "rest" in process else ""
            print(f"{name:<12} pid {process['pid']:<8} {'running' if process['running'] else 'NOT RUNNING'}{where}")
        print(f"router       REST {report['router']['rest']}  gRPC {report['router']['grpc']}  canary "
              f"{report.get('canary_percent', '?')}%  copied to the canary {report.get('shadow_percent', '?')}%  "
              f"{report.get('weights_error', '')}")
        for target in report.get("targets", []):
            print(f"scrape       {target['track']:<7} {target['instance']:<22} {target['health']} "
                  f"{target['last_error']}")
        print(f"prometheus   {report['prometheus']}  {report.get('targets_error', '')}")
        return 0
    stack = local_stack.start(
        base, config.model_name, settings.stack_dir, settings.servers_per_track, settings.router_rest_port,
        settings.router_grpc_port, settings.prometheus_port, config.rollout.prometheus.scrape_interval_seconds,
        config.rollout.prometheus.track_label, config_args=serve_config_args(args.config, args.overrides))
    for server in stack.servers:
        print(f"{server.name:<10} mlops serve pid {server.pid}: REST {server.rest}  gRPC {server.grpc}; "
              f"{server.request_log or 'request logging not reported'}")
    print(f"clients    REST {stack.router_rest}/v1/models/{config.model_name}:predict  gRPC {stack.router_grpc} "
          f"(Envoy pid {stack.router_pid}; canary {stack.router().canary_weight()}%)")
    print(f"prometheus {stack.prometheus_url} (pid {stack.prometheus_pid}); `mlops rollout start --version V` moves "
          "traffic through the router and measures it there")
    print(f"state      {stack.folder}/{local_stack.STACK_FILE}; stop with `mlops deploy local --stop`")
    return 0


def serve_config_args(config_path: str | None, overrides: list[str]) -> list[str]:
    """The --config and --set flags that give each `mlops serve` of the stack this command's config (its
    serving.request_log section): the file by its absolute path, as the servers may run from another folder."""
    import os

    flags = ["--config", os.path.abspath(config_path)] if config_path else []
    return flags + [flag for override in overrides for flag in ("--set", override)]
