"""The command-line arguments every `mlops` command that reads the config takes."""
from __future__ import annotations

import argparse


def add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config (default: the Chicago taxi job)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override one config key, e.g. --set training.train_steps=500 (repeatable)",
    )
