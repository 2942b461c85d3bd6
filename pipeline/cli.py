"""The `mlops` command line."""
from __future__ import annotations

import argparse
import atexit
import gc
import logging
import os
import shlex
import sys
import threading
import time
from typing import NoReturn

from components.compat import select_native_log_level
from monitoring import cli as monitoring_cli
from pipeline import cluster_cli
from rollout import cli as rollout_cli
from rollout import deploy_cli
from serving import cli as serving_cli
from settings.arguments import add_config_args, run_command
from settings.errors import UserError


def _run(args: argparse.Namespace) -> int:
    from pipeline.runner import run_local
    from settings.config import load_config

    config = load_config(args.config, args.overrides)
    summary = run_local(config, data_only=args.data_only)
    _unraisable_to(summary.log_path)
    if args.serve_after and not args.data_only:
        if not summary.pushed_path:
            print("nothing was published (the model was not blessed), so there is nothing to serve.", file=sys.stderr)
            return 1
        from pipeline.runner import first_eval_row, stderr_to_file
        from serving.demo import serve_and_predict

        print("\nserving the model repository's stable version locally (TF Serving's REST and gRPC APIs)")
        # TensorFlow's C++ log lines from loading and running the model go to the run's log, as during the run.
        with stderr_to_file(summary.log_path):
            serve_and_predict(config.serving_base_dir, config.model_name, first_eval_row(config))
    return 0


def _unraisable_to(log_path: str) -> None:
    """Sends what Python can only print ("Exception ignored in: ...") to the run's log from now on: TensorFlow's
    function objects that outlive the run fail in their finalizers at interpreter exit, after the log is closed."""
    def to_log(unraisable, sys=sys, default=sys.__unraisablehook__, open=open) -> None:
        # Bound as defaults: at interpreter exit this module's globals may already be gone.
        with open(log_path, "a") as log:
            console, sys.stderr = sys.stderr, log
            try:
                default(unraisable)
            finally:
                sys.stderr = console

    # A host with a hook of its own (a test runner) keeps it.
    if sys.unraisablehook is sys.__unraisablehook__ or getattr(sys.unraisablehook, "__qualname__", "").startswith(
            _unraisable_to.__qualname__):
        sys.unraisablehook = to_log


def _init(args: argparse.Namespace) -> int:
    from pipeline.init.bootstrap import init_project

    # The command as the user could type it again, for the written files' headers (main may get argv, not sys.argv).
    words = ["mlops", "init", "--data", args.data, "--label", args.label]
    words += ["--output", args.output] if args.output != "." else []
    words += ["--name", args.name] if args.name else []
    init_project(args.data, args.label, args.output, args.name, args.force, command=shlex.join(words))
    return 0


def _train(args: argparse.Namespace) -> int:
    from pipeline.training import train
    from settings.config import load_config

    overrides = list(args.overrides)
    if args.workers is not None:
        overrides.append(f"training.workers={args.workers}")
    config = load_config(args.config, overrides)
    train(config)
    return 0


def _compile(args: argparse.Namespace) -> int:
    from pipeline.kubeflow import compile_pipeline
    from pipeline.preflight import check_config
    from settings.config import load_config

    config = load_config(args.config, args.overrides)
    check_config(config)
    compiled = compile_pipeline(config, args.output)
    for note in compiled.notes:
        print(f"note: {note}")
    print(f"compiled {len(compiled.tasks)} tasks to {compiled.path}\n  image          {compiled.image}\n"
          f"  pipeline root  {compiled.pipeline_root}")
    for name, value in compiled.parameters.items():
        print(f"  parameter      {name} = {value}")
    for task, upstream in compiled.tasks.items():
        print(f"  task           {task}" + (f" <- {', '.join(upstream)}" if upstream else ""))
        settings = compiled.settings.get(task)
        if settings:
            names = {"resourceCpuRequest": "cpu request", "resourceCpuLimit": "cpu limit",
                     "resourceMemoryRequest": "memory request", "resourceMemoryLimit": "memory limit"}
            resources = ", ".join(f"{names[key]} {value}" for key, value in settings["resources"].items()
                                  if key in names)
            print(f"                 {resources or 'no resources set'}; retries {settings['retries']}; "
                  f"cache {'on' if settings['cache'] else 'off'}")
    return 0


def _parameters(pairs: list[str]) -> dict[str, str]:
    from settings.config import ConfigError

    values = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ConfigError(f"--param '{pair}' must look like NAME=VALUE, for example data_root=gs://bucket/csv.")
        values[name] = value
    return values


def _submit(args: argparse.Namespace) -> int:
    from pipeline.kubeflow import compile_to_temporary, submit
    from pipeline.preflight import check_config
    from settings.config import load_config

    config = load_config(args.config, args.overrides)
    arguments = _parameters(args.params)
    try:
        if not args.package:
            check_config(config)
        package = args.package or compile_to_temporary(config)
        run_id, link = submit(package, args.host or config.kubeflow.host, config.kubeflow.experiment,
                              args.run_name or f"{config.name} {time.strftime('%Y-%m-%d %H-%M-%S')}", arguments,
                              config.kubeflow.namespace)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001  (the KFP client raises urllib3, ApiException and ValueError alike)
        reason = getattr(e, "reason", None) or str(e).splitlines()[0]
        print(f"error: the KFP API at {args.host or config.kubeflow.host} did not take the run: {reason}",
              file=sys.stderr)
        return 1
    print(f"submitted run {run_id}\n  {link}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlops", description="TFX pipeline from CSV to TF Serving.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the whole pipeline locally (LocalDagRunner on Beam)")
    add_config_args(run)
    run.add_argument("--serve-after", action="store_true",
                     help="then serve the pushed model and print one REST and one gRPC prediction for an eval row")
    run.add_argument("--data-only", action="store_true",
                     help="run the data stages only: ExampleGen, StatisticsGen, validation and Transform")
    run.set_defaults(handler=_run)
    init = commands.add_parser(
        "init", help="read a folder of CSV files as the pipeline does; write a schema, a starter config and a "
                     "statistics page")
    init.add_argument("--data", required=True, help="the folder of CSV files (one shared header)")
    init.add_argument("--label", required=True, help="the column to predict")
    init.add_argument("--output", default=".", help="where to write the three files (default: this folder)")
    init.add_argument("--name", default="", help="the pipeline's and the model's name (default: the data folder's)")
    init.add_argument("--force", action="store_true", help="replace files of the same names")
    init.set_defaults(handler=_init)
    serving_cli.register(commands, add_config_args)
    rollout_cli.register(commands, add_config_args)
    deploy_cli.register(commands, add_config_args)
    monitoring_cli.register(commands, add_config_args)
    cluster_cli.register(commands, add_config_args)
    train = commands.add_parser(
        "train", help="train alone on the pipeline's latest Transform output, on N workers (local or TFJob)"
    )
    add_config_args(train)
    train.add_argument("--workers", type=int, help="number of workers (default: training.workers)")
    train.set_defaults(handler=_train)
    compile_ = commands.add_parser("compile", help="compile the pipeline for Kubeflow Pipelines V2")
    compile_.add_argument("target", choices=["kubeflow"], help="the orchestrator to compile for")
    add_config_args(compile_)
    compile_.add_argument("--output", required=True,
                          help="pipeline.yaml (open-source Kubeflow Pipelines 2.x) or pipeline.json (Vertex AI)")
    compile_.set_defaults(handler=_compile)
    submit = commands.add_parser("submit", help="start a run on Kubeflow Pipelines and print its link")
    submit.add_argument("target", choices=["kubeflow"], help="the orchestrator to run on")
    add_config_args(submit)
    submit.add_argument("--host", help="the KFP API, e.g. http://localhost:8080 (default: kubeflow.host)")
    submit.add_argument("--package", help="a pipeline.yaml from mlops compile kubeflow (default: compile now)")
    submit.add_argument("--param", dest="params", action="append", default=[], metavar="NAME=VALUE",
                        help="a runtime parameter: data_root=gs://bucket/csv or train_args='{\"num_steps\": 500}'")
    submit.add_argument("--run-name", help="the run's name (default: pipeline name and time)")
    submit.set_defaults(handler=_submit)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs one command in this process, which goes on afterwards (a test, a notebook); returns the exit status."""
    return _main(argv, collect=True)


def console_main() -> NoReturn:
    """The `mlops` command: runs one command, then ends the process without the interpreter's teardown."""
    _exit_without_teardown(_main(None, collect=False))


def _main(argv: list[str] | None, collect: bool) -> int:
    args = build_parser().parse_args(argv)
    select_native_log_level(into_log=args.command == "run")
    # Library warnings go through logging: into a run's log (pipeline/runner.py), and nowhere outside a run.
    logging.captureWarnings(True)
    logging.getLogger("py.warnings").addHandler(logging.NullHandler())
    try:
        code = run_command(args)
        if collect:
            # Collect TensorFlow's function objects while modules still exist, not at interpreter shutdown.
            gc.collect()
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _exit_without_teardown(code: int) -> NoReturn:
    """Ends the process with `code` as sys.exit would, less the interpreter's teardown: freeing every module and
    object of TensorFlow, TFX and Beam one by one takes seconds after a run and writes nothing a user needs.

    What an exit must still do is done first: other non-daemon threads finish, the atexit handlers run (logging's
    flush and close, multiprocessing's join of child processes, finalizers of temporary folders) and the console
    streams are flushed.
    """
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # what sys.exit runs; os._exit does not
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except OSError:  # a closed pipe (`mlops versions | head`): what is left has no reader
            pass
    os._exit(code)


if __name__ == "__main__":
    console_main()
