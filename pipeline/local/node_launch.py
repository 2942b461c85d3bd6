"""One TFX node run through TFX's Launcher, in whichever process runs it (the runner or a stage worker), with its ML
Metadata access serialized: SQLite takes one writer at a time, and a second one fails with 'database is locked'."""
from __future__ import annotations

import fcntl
import logging
import os
import threading
from typing import Any

from tfx.orchestration import metadata
from tfx.orchestration.local import runner_utils
from tfx.orchestration.portable import launcher
from tfx.proto.orchestration import pipeline_pb2

_LOGGER = logging.getLogger(__name__)


class MetadataLock:
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


class SerializedMetadata(metadata.Metadata):
    """An ML Metadata connection whose every use holds the metadata lock."""

    def __init__(self, connection_config: Any, lock: MetadataLock):
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
_LOCKS: dict[str, MetadataLock] = {}


def lock_for(path: str) -> MetadataLock:
    return _LOCKS.setdefault(path, MetadataLock(path))


def connection_config(pipeline: pipeline_pb2.Pipeline) -> Any:
    deployment_config = runner_utils.extract_local_deployment_config(pipeline)
    config = deployment_config.metadata_connection_config
    kind = config.WhichOneof("connection_config")
    return getattr(config, kind) if kind else None  # None: the orchestrator brings its own (Kubernetes)


def lock_path(connection_config: Any) -> str | None:
    """The lock file beside an SQLite database; None for any other store (in memory, a server), which stage workers
    cannot share or which takes concurrent writers itself."""
    if not hasattr(connection_config, "WhichOneof") or connection_config.WhichOneof("config") != "sqlite":
        return None
    return f"{connection_config.sqlite.filename_uri}.lock"


def launch_node(pipeline: pipeline_pb2.Pipeline, node_id: str) -> None:
    """Runs one node of `pipeline` (its runtime parameters substituted) through TFX's Launcher."""
    deployment_config = runner_utils.extract_local_deployment_config(pipeline)
    connection = connection_config(pipeline)
    lock_file = lock_path(connection)
    [node] = [n.pipeline_node for n in pipeline.nodes if n.pipeline_node.node_info.id == node_id]
    _LOGGER.info("Component %s is running (process %d).", node_id, os.getpid())
    launcher.Launcher(
        pipeline_node=node,
        mlmd_connection=(SerializedMetadata(connection, lock_for(lock_file)) if lock_file
                         else metadata.Metadata(connection)),
        pipeline_info=pipeline.pipeline_info,
        pipeline_runtime_spec=pipeline.runtime_spec,
        executor_spec=runner_utils.extract_executor_spec(deployment_config, node_id),
        custom_driver_spec=runner_utils.extract_custom_driver_spec(deployment_config, node_id),
    ).launch()
    _LOGGER.info("Component %s is finished.", node_id)


def launch_serialized(pipeline_bytes: bytes, node_id: str) -> None:
    """launch_node for a pipeline sent as bytes: what a stage worker receives (pipeline/local/stage_workers.py)."""
    launch_node(pipeline_pb2.Pipeline.FromString(pipeline_bytes), node_id)
