"""Worker processes that run pipeline stages beside the `mlops run` process (pipeline/local/dag_runner.py).

The stages are Python-bound (Beam's in-memory runner, graph tracing, conversion), so a second stage on a thread would
share one interpreter lock with the first: a stage runs beside another only in its own process. A worker starts
before the run imports TensorFlow, imports the same libraries on the otherwise idle CPU meanwhile, and then runs
the stages it is handed, one at a time, through TFX's Launcher. This module stays light to import: it is what the
`mlops run` process loads before TensorFlow, and what each worker loads first.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import time
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any

_LOGGER = logging.getLogger(__name__)
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Libraries whose loggers keep handlers of their own: a run passes their records up to the root logger instead.
LIBRARY_LOGGERS = ("absl", "tensorflow")


class StageFailed(RuntimeError):
    """A stage failed in a worker and its exception could not travel back as itself."""


def route_logs_to_stderr() -> None:
    """Every library's log records, from INFO, on this process's stderr (the run's log): the root logger's one
    handler, with absl's and TensorFlow's records passed up to it."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    for name in LIBRARY_LOGGERS:
        library = logging.getLogger(name)
        library.propagate = True
        for handler in list(library.handlers):
            library.removeHandler(handler)


def _serve(tasks: Connection) -> None:
    """A worker's life: import, say so, then run each (pipeline, node) it receives and answer with the outcome."""
    os.dup2(2, 1)  # prints go to the log as well
    from components.compat import select_legacy_keras

    select_legacy_keras()  # before TensorFlow's import
    import apache_beam  # noqa: F401
    import tensorflow  # noqa: F401
    import tensorflow_model_analysis  # noqa: F401
    import tensorflow_transform  # noqa: F401

    route_logs_to_stderr()
    from components.compat import cache_dofn_specs
    from pipeline.local.node_launch import launch_serialized

    cache_dofn_specs()

    tasks.send(("ready", os.getpid()))
    while True:
        try:
            task = tasks.recv()
        except EOFError:
            task = None
        if task is None:
            # Without the interpreter's teardown, which frees TensorFlow's objects one by one for seconds.
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        pipeline_bytes, node_id = task
        try:
            launch_serialized(pipeline_bytes, node_id)
            tasks.send(("done", None))
        except BaseException as error:  # noqa: BLE001  (travels back to the runner)
            _LOGGER.exception("%s failed", node_id)
            tasks.send(("failed", _portable(error)))


def _portable(error: BaseException) -> BaseException:
    """The exception itself when it pickles (a DataValidationError keeps its type), else its text."""
    import pickle

    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001
        return StageFailed("".join(traceback.format_exception_only(type(error), error)).strip())


class StageWorker:
    """One worker process and the stage it runs, if any."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child,), name="mlops-stage-worker", daemon=True)
        self.process.start()
        child.close()
        self.ready = False
        self.node: str | None = None

    @property
    def idle(self) -> bool:
        return self.ready and self.node is None

    def run(self, pipeline_bytes: bytes, node_id: str) -> None:
        self.node = node_id
        self.connection.send((pipeline_bytes, node_id))

    def receive(self) -> tuple[str | None, BaseException | None]:
        """After `wait` found this worker's pipe readable: the node it finished (None for the ready message) and
        its failure, if any."""
        try:
            kind, payload = self.connection.recv()
        except (EOFError, OSError):
            node, self.node, self.ready = self.node, None, False
            return node, StageFailed(f"the stage worker process ended (exit code {self.process.exitcode}).")
        if kind == "ready":
            self.ready = True
            return None, None
        node, self.node = self.node, None
        return node, payload if kind == "failed" else None

    def stop(self, kill: bool = False) -> None:
        if kill:
            self.process.kill()
        else:
            try:
                self.connection.send(None)
            except OSError:
                pass
        self.process.join(timeout=None if not kill else 10)
        self.connection.close()


class StageWorkers:
    """`count` worker processes, started at once (they import while the run gets ready)."""

    def __init__(self, count: int):
        self.workers = [StageWorker() for _ in range(count)]

    def __bool__(self) -> bool:
        return bool(self.workers)

    def wait_ready(self, timeout: float) -> bool:
        """Whether every worker has imported its libraries within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not all(w.ready for w in self.workers) and time.monotonic() < deadline:
            self.poll(timeout=min(0.1, max(0.0, deadline - time.monotonic())))
        return all(w.ready for w in self.workers)

    def idle(self) -> StageWorker | None:
        return next((w for w in self.workers if w.idle), None)

    def busy(self) -> list[StageWorker]:
        return [w for w in self.workers if w.node is not None]

    def poll(self, timeout: float = 0.0) -> list[tuple[str, BaseException | None]]:
        """The (node, failure) of each stage that finished within `timeout` seconds; a worker's ready message is
        taken in passing."""
        alive = {w.connection: w for w in self.workers if w.process.is_alive() or w.connection.poll()}
        if not alive:
            time.sleep(timeout)  # no worker left to hear from: the caller waits on its own stage
            return []
        finished = []
        for connection in wait(list(alive), timeout):
            node, failure = alive[connection].receive()
            if node is not None:
                finished.append((node, failure))
        return finished

    def stop(self, kill: bool = False) -> None:
        for worker in self.workers:
            worker.stop(kill)

    def __enter__(self) -> StageWorkers:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        # On an error or Ctrl-C a worker's stage is abandoned, not awaited.
        self.stop(kill=exc_type is not None)
