"""TFX's LocalDagRunner, but each node starts as soon as the nodes it depends on finish: independent stages
(StatisticsGen beside Transform, the Exporter beside the Evaluator) run side by side, as on Kubeflow Pipelines.

TFX's own runner launches the nodes one after another in topological order (its TODO b/171319478 asks for this).
Here too each node runs through TFX's Launcher, so drivers, caching and ML Metadata records are TFX's own; the
second stage runs in a stage worker process (pipeline/stage_workers.py). ML Metadata access is serialized across
the processes: SQLite takes one writer at a time, and a second one fails with 'database is locked'.
"""
from __future__ import annotations

import datetime
import fcntl
import logging
import os
import queue
import threading
from typing import Any

from tfx.dsl.compiler import constants
from tfx.orchestration import metadata
from tfx.orchestration.local import runner_utils
from tfx.orchestration.local.local_dag_runner import LocalDagRunner
from tfx.orchestration.portable import launcher, runtime_parameter_utils
from tfx.proto.orchestration import pipeline_pb2

from pipeline.stage_workers import StageWorkers

_LOGGER = logging.getLogger(__name__)


class _MetadataLock:
    """Held while a node reads or writes ML Metadata: re-entrant within a thread, exclusive across the threads of
    this process (a lock) and across processes (an flock on a file beside the SQLite database)."""

    def __init__(self, path: str):
        self._path = path
        self._lock = threading.RLock()
        self._depth = 0
        self._fd: int | None = None

    def acquire(self) -> None:
        self._lock.acquire()
        if self._depth == 0:
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        self._depth += 1

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            os.close(self._fd)  # releases the flock
            self._fd = None
        self._lock.release()


class _SerializedMetadata(metadata.Metadata):
    """An ML Metadata connection whose every use holds the metadata lock."""

    def __init__(self, connection_config: Any, lock: _MetadataLock):
        super().__init__(connection_config)
        self._metadata_lock = lock

    def __enter__(self) -> metadata.Metadata:
        self._metadata_lock.acquire()
        try:
            return super().__enter__()
        except BaseException:
            self._metadata_lock.release()
            raise

    def __exit__(self, *exc_info: Any) -> None:
        try:
            super().__exit__(*exc_info)
        finally:
            self._metadata_lock.release()


# One per process: the worker process builds its own from the path it is handed.
_LOCKS: dict[str, _MetadataLock] = {}


def _lock_for(path: str) -> _MetadataLock:
    return _LOCKS.setdefault(path, _MetadataLock(path))


def _connection_config(pipeline: pipeline_pb2.Pipeline) -> Any:
    deployment_config = runner_utils.extract_local_deployment_config(pipeline)
    config = deployment_config.metadata_connection_config
    kind = config.WhichOneof("connection_config")
    return getattr(config, kind) if kind else None  # None: the orchestrator brings its own (Kubernetes)


def _lock_path(connection_config: Any) -> str | None:
    """The lock file beside an SQLite database; None for any other store (in memory, a server), which stage workers
    cannot share or which takes concurrent writers itself."""
    if not hasattr(connection_config, "WhichOneof") or connection_config.WhichOneof("config") != "sqlite":
        return None
    return f"{connection_config.sqlite.filename_uri}.lock"


def launch_node(pipeline: pipeline_pb2.Pipeline, node_id: str) -> None:
    """Runs one node of `pipeline` (its runtime parameters substituted) through TFX's Launcher."""
    deployment_config = runner_utils.extract_local_deployment_config(pipeline)
    connection_config = _connection_config(pipeline)
    lock_path = _lock_path(connection_config)
    [node] = [n.pipeline_node for n in pipeline.nodes if n.pipeline_node.node_info.id == node_id]
    _LOGGER.info("Component %s is running (process %d).", node_id, os.getpid())
    launcher.Launcher(
        pipeline_node=node,
        mlmd_connection=(_SerializedMetadata(connection_config, _lock_for(lock_path)) if lock_path
                         else metadata.Metadata(connection_config)),
        pipeline_info=pipeline.pipeline_info,
        pipeline_runtime_spec=pipeline.runtime_spec,
        executor_spec=runner_utils.extract_executor_spec(deployment_config, node_id),
        custom_driver_spec=runner_utils.extract_custom_driver_spec(deployment_config, node_id),
    ).launch()
    _LOGGER.info("Component %s is finished.", node_id)


def launch_serialized(pipeline_bytes: bytes, node_id: str) -> None:
    """launch_node for a pipeline sent as bytes: what a stage worker receives (pipeline/stage_workers.py)."""
    launch_node(pipeline_pb2.Pipeline.FromString(pipeline_bytes), node_id)


class ConcurrentDagRunner(LocalDagRunner):
    """Runs a pipeline locally, each node once its upstream nodes are done: one node at a time in this process, the
    others at the same time in idle stage workers (StageWorkers, started by the caller), in topological order.

    A failed node stops what depends on it, while the nodes that do not go on, so that a gate (a node of `gates`,
    such as the data validation gate) still gives its verdict on what made another node fail. A failed gate ends the
    run at once: nothing else starts, and what runs in workers is abandoned (the caller's StageWorkers stop it).
    The failure raised is the gate's, else the first one."""

    def __init__(self, workers: StageWorkers | None = None, gates: frozenset[str] = frozenset()):
        super().__init__()
        self._workers = workers
        self._gates = gates

    def run_with_ir(self, pipeline: pipeline_pb2.Pipeline,
                    run_options: pipeline_pb2.RunOptions | None = None) -> None:
        if run_options is not None or not self._workers or _lock_path(_connection_config(pipeline)) is None:
            # Partial runs (from_nodes / to_nodes snapshots), one stage at a time, and ML Metadata outside an SQLite
            # file: TFX's own runner.
            super().run_with_ir(pipeline, run_options)
            return
        workers = self._workers
        runtime_parameter_utils.substitute_runtime_parameter(
            pipeline, {constants.PIPELINE_RUN_ID_PARAMETER_NAME: datetime.datetime.now().isoformat()})
        pipeline_bytes = pipeline.SerializeToString()
        order = [node.pipeline_node for node in pipeline.nodes]
        done = {node.node_info.id for node in order if node.execution_options.HasField("skip")}
        waiting = [node for node in order if node.node_info.id not in done]
        # In the order they happened.
        failures: dict[str, BaseException] = {}
        # The node run here goes on a thread, so that the loop hands ready nodes to workers meanwhile.
        here: queue.Queue[tuple[str, BaseException | None]] = queue.Queue()
        running_here: str | None = None

        def run_here(node_id: str) -> None:
            try:
                launch_node(pipeline, node_id)
                here.put((node_id, None))
            except BaseException as error:  # noqa: BLE001  (raised by the loop)
                here.put((node_id, error))

        def gate_failed() -> bool:
            return any(node in self._gates for node in failures)

        while True:
            finished = workers.poll(timeout=0.05)
            while not here.empty():
                finished.append(here.get())
                running_here = None
            for node_id, error in finished:
                if error is None:
                    done.add(node_id)
                else:
                    failures[node_id] = error
            ready = [] if gate_failed() else [node for node in waiting if set(node.upstream_nodes) <= done]
            for node in ready:
                worker = workers.idle()
                if running_here is None:
                    running_here = node.node_info.id
                    threading.Thread(target=run_here, args=(running_here,), name=f"stage-{running_here}",
                                     daemon=True).start()
                elif worker is not None:
                    worker.run(pipeline_bytes, node.node_info.id)
                else:
                    break
                waiting.remove(node)
            in_workers = [] if gate_failed() else workers.busy()
            if running_here is None and not in_workers and not ready:
                break
        if failures:
            gates = [node for node in failures if node in self._gates]
            raise failures[gates[0] if gates else next(iter(failures))]
        if waiting:
            raise RuntimeError(f"nodes {[n.node_info.id for n in waiting]} never became ready: their upstream nodes "
                               "are not in the pipeline.")
