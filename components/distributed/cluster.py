"""TF_CONFIG, the cluster description MultiWorkerMirroredStrategy reads, and which worker is the chief."""
from __future__ import annotations

import contextlib
import json
import socket
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WorkerRole:
    """This process's place in the cluster; one worker (the chief) when there is no TF_CONFIG."""

    task_type: str
    index: int
    workers: int
    has_chief_task: bool = False

    @property
    def is_chief(self) -> bool:
        # MultiWorkerMirroredStrategy's own rule: a 'chief' task if the cluster has one, else worker 0.
        if self.has_chief_task:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.index == 0


def worker_role(tf_config_json: str | None) -> WorkerRole:
    """Reads a TF_CONFIG value (None or empty: a single worker)."""
    tf_config = json.loads(tf_config_json) if tf_config_json else {}
    cluster = tf_config.get("cluster") or {}
    if not cluster:
        return WorkerRole("worker", 0, 1)
    task = tf_config.get("task") or {}
    workers = sum(len(cluster.get(kind, [])) for kind in ("chief", "worker"))
    return WorkerRole(task.get("type", "worker"), int(task.get("index", 0)), workers, "chief" in cluster)


def tf_config(addresses: list[str], index: int) -> dict[str, Any]:
    """TF_CONFIG for worker `index` of a worker-only cluster (worker 0 is the chief)."""
    return {"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": index}}


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports that were free a moment ago; all are held open until every one is chosen."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
        return ports
