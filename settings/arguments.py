"""The command line's shared pieces: the arguments every command that reads the config takes, and the one place an
error a user can fix becomes a message and an exit status."""
from __future__ import annotations

import argparse
import sys

from settings.errors import UserError


def add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config (default: the Chicago taxi job)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override one config key, e.g. --set training.train_steps=500 (repeatable)",
    )


def run_command(args: argparse.Namespace) -> int:
    """Runs the parsed command (`args.handler`) and returns its exit status; a UserError becomes its message on
    stderr and its exit status here, and nowhere else."""
    try:
        return args.handler(args)
    except UserError as e:
        print(f"{e.prefix}: {e}", file=sys.stderr)
        return e.exit_code
