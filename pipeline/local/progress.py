"""Stage-by-stage progress on the console, read from ML Metadata while a run goes on.

TFX's runners have no progress callbacks, but every runner records each execution of each node in ML Metadata as it
starts and as it ends (complete, cached or failed). A background thread reads that record (pipeline/metadata.py) and
prints what changed. A display must never fail a run: whatever goes wrong while reading is logged and skipped, and
the run's own result is decided elsewhere.
"""
from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO

from pipeline import metadata

_LOGGER = logging.getLogger(__name__)


class StageProgress:
    """Prints `[i/n] Stage ...` when a node starts and `... done in 12.3s (cached)` when it ends, for the run of
    `pipeline_name` that begins after `track()` is entered."""

    def __init__(self, stages: list[str], out: TextIO | None = None, metadata_path: str = "",
                 pipeline_name: str = "", poll_seconds: float = 0.5):
        self.stages = stages
        self.out = out or sys.stdout
        self.metadata_path = metadata_path
        self.pipeline_name = pipeline_name
        self.poll_seconds = poll_seconds
        self.started = time.monotonic()
        self.current: str | None = None
        # Node -> (seconds, served from the cache), for every node that finished.
        self.finished: dict[str, tuple[float, bool]] = {}
        self.failed_node: str | None = None
        self._announced: set[str] = set()
        self._known_runs: set[int] | None = None
        self._run_id: int | None = None
        self._store = None
        self._warned = False
        self._lock = threading.Lock()

    def _index(self, node: str) -> str:
        position = self.stages.index(node) + 1 if node in self.stages else "?"
        return f"[{position}/{len(self.stages)}]"

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def _print(self, line: str) -> None:
        print(f"{self.elapsed():7.1f}s  {line}", file=self.out, flush=True)

    def _show(self, executions: list[metadata.NodeExecution]) -> None:
        for execution in executions:
            node = execution.node
            if not node or node in self.finished:
                continue
            if node not in self._announced:
                self._announced.add(node)
                self._print(f"{self._index(node)} {node} ...")
            if execution.finished:
                self.finished[node] = (execution.seconds, execution.cached)
                cached = " (cached)" if execution.cached else ""
                self._print(f"{self._index(node)} {node} done in {execution.seconds:.1f}s{cached}")
                if self.current == node:
                    self.current = None
            elif execution.failed:
                self.failed_node = node
                self.current = node
            else:
                self.current = node

    def poll(self) -> None:
        """Reads the run's executions once and prints what changed; never raises."""
        with self._lock:
            try:
                # One connection for the whole run: MLMD logs every new one.
                self._store = self._store or metadata.connect(self.metadata_path)
                store = self._store
                if self._run_id is None:
                    runs = metadata.runs(store, self.pipeline_name)
                    new = [run for run in runs if run.id not in (self._known_runs or set())]
                    if self._known_runs is None or not new:
                        return
                    self._run_id = new[-1].id
                [run] = store.get_contexts_by_id([self._run_id])
                self._show(metadata.run_executions(store, run, self.pipeline_name))
            except metadata.NoRecordError:
                pass
            except Exception as error:  # noqa: BLE001  (the display must not fail the run)
                self._store = None
                self._warn(error)

    def _remember_earlier_runs(self) -> None:
        try:
            store = metadata.connect(self.metadata_path)
            self._known_runs = {run.id for run in metadata.runs(store, self.pipeline_name)}
        except metadata.NoRecordError:
            self._known_runs = set()
        except Exception as error:  # noqa: BLE001
            self._warn(error)
            self._known_runs = set()

    def _warn(self, error: Exception) -> None:
        if not self._warned:
            self._warned = True
            _LOGGER.warning("progress display could not read ML Metadata (the run goes on): %s", error)

    def failed(self) -> None:
        """Reports the stage that was running or failed when the run stopped."""
        self.poll()
        node = self.failed_node or self.current
        if node:
            self.current = node
            self._print(f"{self._index(node)} {node} FAILED")

    @contextlib.contextmanager
    def track(self) -> Iterator[StageProgress]:
        """Polls ML Metadata in a background thread while the body runs, then once more at the end."""
        self._remember_earlier_runs()
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(self.poll_seconds):
                self.poll()

        thread = threading.Thread(target=watch, name="stage-progress", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join(timeout=10)
            self.poll()
