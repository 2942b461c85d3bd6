"""Entry point of one training worker: `python -m components.distributed.worker SPEC_JSON [--parent-pid PID]`.

The same command runs under the local launcher and in a TFJob's pods; TF_CONFIG (set by the launcher or by the
training operator) tells MultiWorkerMirroredStrategy which worker this is.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

# Exit codes of 128 and above are retryable under the TFJob `ExitCode` restart policy and for the local launcher:
# a worker that lost a peer exits with this one so that the whole group restarts from the backup.
PEER_LOST_EXIT_CODE = 138


def import_function(path: str) -> Callable[..., Any]:
    module_name, _, name = path.rpartition(".")
    if not module_name:
        raise ValueError(f"run_fn '{path}' must be a dotted path such as components.model.run_fn.")
    return getattr(importlib.import_module(module_name), name)


def _exit_when_orphaned(parent: int, poll_seconds: float = 1.0) -> None:
    """Ends this worker when its launcher `parent` is gone (even a SIGKILLed one), so that no worker outlives it.

    The pid comes from the launcher: by the time this runs (after TensorFlow's import) it may be gone already.
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_seconds)
        os._exit(PEER_LOST_EXIT_CODE)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def run_worker(spec_path: str) -> None:
    """Loads the spec, calls its run_fn with rebuilt FnArgs and, on the chief, copies the model if asked."""
    from components import artifacts
    from components.distributed.cluster import worker_role
    from components.distributed.spec import WorkerSpec

    spec = WorkerSpec.load(spec_path)
    import_function(spec.run_fn)(spec.fn_args())
    # TF_CONFIG is MultiWorkerMirroredStrategy's contract; only the chief's model is the job's result.
    if spec.copy_model_to and worker_role(os.environ.get("TF_CONFIG")).is_chief:
        artifacts.copy_tree(spec.serving_model_dir, spec.copy_model_to)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m components.distributed.worker")
    parser.add_argument("spec", help="the WorkerSpec JSON the Trainer wrote")
    parser.add_argument("--parent-pid", type=int, help="exit when this process (the local launcher) is gone")
    args = parser.parse_args(argv)
    if args.parent_pid:
        _exit_when_orphaned(args.parent_pid)
    import tensorflow as tf
    from absl import logging

    # run_fn reports the worker's role, batch split and class weights at INFO; the launcher keeps them in the log.
    logging.set_verbosity(logging.INFO)
    try:
        run_worker(args.spec)
    except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.CancelledError) as error:
        # A peer died or restarted: collective ops cannot continue without it, but the backup can.
        print(f"lost a peer worker ({type(error).__name__}: {error}); exiting for a restart", file=sys.stderr)
        return PEER_LOST_EXIT_CODE
    return 0


if __name__ == "__main__":
    sys.exit(main())
