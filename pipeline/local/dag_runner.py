"""TFX's LocalDagRunner, but each node starts as soon as the nodes it depends on finish: independent stages
(StatisticsGen beside Transform, the Exporter beside the Evaluator) run side by side, as on Kubeflow Pipelines.

TFX's own runner launches the nodes one after another in topological order (its TODO b/171319478 asks for this).
Here too each node runs through TFX's Launcher, so drivers, caching and ML Metadata records are TFX's own; the
second stage runs in a stage worker process (pipeline/local/stage_workers.py); pipeline/local/node_launch.py
serializes ML Metadata access across the processes.
"""
from __future__ import annotations

import datetime
import queue
import threading

from tfx.dsl.compiler import constants
from tfx.orchestration.local.local_dag_runner import LocalDagRunner
from tfx.orchestration.portable import runtime_parameter_utils
from tfx.proto.orchestration import pipeline_pb2

from pipeline.local.node_launch import connection_config, launch_node, lock_path
from pipeline.local.stage_workers import StageWorkers


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
        if run_options is not None or not self._workers or lock_path(connection_config(pipeline)) is None:
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
