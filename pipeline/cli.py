"""The `mlops` command line."""
from __future__ import annotations

import argparse
import gc
import os
import sys
import warnings

from pipeline.config import ConfigError, load_config
from serving import cli as serving_cli
from serving.rollout import cli as rollout_cli


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config (default: the Chicago taxi job)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override one config key, e.g. --set training.train_steps=500 (repeatable)",
    )


def _run(args: argparse.Namespace) -> int:
    from components.gates.anomalies import DataValidationError
    from pipeline.data import DataError
    from pipeline.runner import PipelineError, run_local

    config = load_config(args.config, args.overrides)
    try:
        summary = run_local(config)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except DataValidationError as e:
        print(f"stopped by the data-validation gate: {e}", file=sys.stderr)
        return 3
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.serve_after:
        if not summary.pushed_path:
            print("nothing was published (the model was not blessed), so there is nothing to serve.", file=sys.stderr)
            return 1
        from pipeline.runner import first_eval_row
        from serving.demo import serve_and_predict

        print("\nserving the model repository's stable version locally (TF Serving's REST and gRPC APIs)")
        serve_and_predict(config.serving_base_dir, config.model_name, first_eval_row(config))
    return 0


def _train(args: argparse.Namespace) -> int:
    from components.distributed.launcher import WorkerFailedError
    from components.distributed.tfjob import TFJobFailedError
    from pipeline.training import NoTransformOutputError, train

    overrides = list(args.overrides)
    if args.workers is not None:
        overrides.append(f"training.workers={args.workers}")
    config = load_config(args.config, overrides)
    try:
        train(config)
    except NoTransformOutputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (WorkerFailedError, TFJobFailedError) as e:
        print(f"training failed: {e}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlops", description="TFX pipeline from CSV to TF Serving.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the whole pipeline locally (LocalDagRunner on Beam)")
    _add_config_args(run)
    run.add_argument("--serve-after", action="store_true",
                     help="then serve the pushed model and print one REST and one gRPC prediction for an eval row")
    run.set_defaults(handler=_run)
    serving_cli.register(commands)
    rollout_cli.register(commands, _add_config_args)
    train = commands.add_parser(
        "train", help="train alone on the pipeline's latest Transform output, on N workers (local or TFJob)"
    )
    _add_config_args(train)
    train.add_argument("--workers", type=int, help="number of workers (default: training.workers)")
    train.set_defaults(handler=_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    # TensorFlow's C++ start-up chatter (CUDA plug-in registration on CPU machines) hides the stage lines.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    # Beam worker processes inherit this: their library warnings belong in the log, not on the console.
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    warnings.simplefilter("ignore")
    args = build_parser().parse_args(argv)
    try:
        code = args.handler(args)
        # Collect TensorFlow's function objects while modules still exist, not at interpreter shutdown.
        gc.collect()
        return code
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
