"""Stage-by-stage progress on the console while TFX's LocalDagRunner launches each component."""
from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import TextIO

from ml_metadata.proto import metadata_store_pb2


class StageProgress:
    """Prints `[i/n] Stage ... done in 12.3s` for each component, marking those served from the cache."""

    def __init__(self, stages: list[str], out: TextIO = sys.stdout):
        self.stages = stages
        self.out = out
        self.started = time.monotonic()
        self.current: str | None = None
        self.stage_started = 0.0
        self.finished: dict[str, tuple[float, bool]] = {}

    def _index(self, node: str) -> str:
        position = self.stages.index(node) + 1 if node in self.stages else "?"
        return f"[{position}/{len(self.stages)}]"

    def start(self, node: str) -> None:
        self.current, self.stage_started = node, time.monotonic()
        self._print(f"{self._index(node)} {node} ...")

    def finish(self, node: str, cached: bool) -> None:
        took = time.monotonic() - self.stage_started
        self.finished[node] = (took, cached)
        self._print(f"{self._index(node)} {node} done in {took:.1f}s{' (cached)' if cached else ''}")
        self.current = None

    def failed(self) -> None:
        """Reports the stage that was running when the run stopped."""
        if self.current:
            took = time.monotonic() - self.stage_started
            self._print(f"{self._index(self.current)} {self.current} FAILED after {took:.1f}s")

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def _print(self, line: str) -> None:
        print(f"{self.elapsed():7.1f}s  {line}", file=self.out, flush=True)

    @contextlib.contextmanager
    def track(self) -> Iterator[StageProgress]:
        """Wraps TFX's component launcher for the duration of a run (LocalDagRunner has no callbacks)."""
        from tfx.orchestration.portable import launcher

        original = launcher.Launcher.launch
        progress = self

        def launch(component_launcher):
            node = component_launcher._pipeline_node.node_info.id
            progress.start(node)
            execution_info = original(component_launcher)
            progress.finish(node, _was_cached(component_launcher, execution_info))
            return execution_info

        launcher.Launcher.launch = launch
        try:
            yield self
        finally:
            launcher.Launcher.launch = original


def _was_cached(component_launcher, execution_info) -> bool:
    if execution_info is None or not execution_info.execution_id:
        return False
    with component_launcher._mlmd_connection as m:
        [execution] = m.store.get_executions_by_id([execution_info.execution_id])
    return execution.last_known_state == metadata_store_pb2.Execution.CACHED
