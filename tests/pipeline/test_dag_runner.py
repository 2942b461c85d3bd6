"""pipeline/local/dag_runner.py: independent stages at once in two processes, TFX's records, and which failure is
raised."""
import json
import os

import pytest
from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2
from tfx.orchestration.metadata import sqlite_metadata_connection_config
from tfx.orchestration.pipeline import Pipeline

from components.gates.anomalies import DataValidationError
from pipeline.local.dag_runner import ConcurrentDagRunner
from pipeline.local.node_launch import lock_path
from pipeline.local.stage_workers import StageWorkers
from tests.pipeline.dag_components import Source, Step


def started_workers():
    """One stage worker that has imported its libraries (so that a test's stages need not wait for it)."""
    workers = StageWorkers(1)
    assert workers.wait_ready(300), "the stage worker did not start within 300 s"
    return workers


@pytest.fixture(scope="module")
def workers():
    with started_workers() as ready:
        yield ready


def build(tmp_path, steps):
    """Source, then each (name, seconds, fail, upstream) Step, in this order (TFX keeps it among equals)."""
    log_dir = tmp_path / "records"
    log_dir.mkdir()
    nodes = {"Source": Source(log_dir=str(log_dir)).with_id("Source")}
    for name, seconds, fail, upstream in steps:
        nodes[name] = Step(log_dir=str(log_dir), name=name, seconds=seconds, fail=fail,
                           upstream=nodes[upstream].outputs["data"]).with_id(name)
    return Pipeline(pipeline_name="dag", pipeline_root=str(tmp_path / "root"), components=list(nodes.values()),
                    enable_cache=False,
                    metadata_connection_config=sqlite_metadata_connection_config(str(tmp_path / "mlmd.sqlite")))


def records(tmp_path):
    return {path.stem: json.loads(path.read_text()) for path in (tmp_path / "records").glob("*.json")}


def executions(tmp_path):
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = str(tmp_path / "mlmd.sqlite")
    return metadata_store.MetadataStore(config).get_executions()


def test_independent_stages_run_at_once_in_two_processes(tmp_path, workers):
    pipeline = build(tmp_path, [("Left", 3.0, "", "Source"), ("Right", 3.0, "", "Source"),
                                ("After", 0.0, "", "Left")])
    ConcurrentDagRunner(workers).run(pipeline)
    ran = records(tmp_path)
    assert set(ran) == {"Source", "Left", "Right", "After"}
    left, right = ran["Left"], ran["Right"]
    assert left["start"] < right["end"] and right["start"] < left["end"], "Left and Right did not overlap"
    assert {left["pid"], right["pid"]} == {os.getpid(), workers.workers[0].process.pid}
    assert ran["After"]["start"] >= left["end"]
    states = [e.last_known_state for e in executions(tmp_path)]
    assert len(states) == 4 and set(states) == {metadata_store_pb2.Execution.COMPLETE}
    # The two processes took turns on ML Metadata through a lock file beside the database, nowhere else.
    assert (tmp_path / "mlmd.sqlite.lock").exists() and not (tmp_path / ".mlmd.lock").exists()


def test_one_stage_at_a_time_without_workers_runs_everything_here(tmp_path):
    ConcurrentDagRunner(None).run(build(tmp_path, [("Left", 0.0, "", "Source"), ("Right", 0.0, "", "Source")]))
    assert {r["pid"] for r in records(tmp_path).values()} == {os.getpid()}


def test_only_an_sqlite_file_is_shared_with_workers():
    """A store in memory lives in one process only: TFX's own runner keeps every stage here for it."""
    sqlite = metadata_store_pb2.ConnectionConfig()
    sqlite.sqlite.filename_uri = "/runs/metadata.sqlite"
    in_memory = metadata_store_pb2.ConnectionConfig()
    in_memory.fake_database.SetInParent()
    assert lock_path(sqlite) == "/runs/metadata.sqlite.lock"
    assert lock_path(in_memory) is None
    assert lock_path(None) is None


def test_a_failed_gate_ends_the_run_at_once(tmp_path):
    """The gate's verdict is raised while a stage beside it still runs in the worker: that stage is abandoned, and
    nothing after the gate starts."""
    pipeline = build(tmp_path, [("Gate", 0.5, "gate", "Source"), ("Slow", 120.0, "", "Source"),
                                ("AfterGate", 0.0, "", "Gate")])
    with pytest.raises(DataValidationError, match="failed validation"), started_workers() as own:
        ConcurrentDagRunner(own, gates=frozenset({"Gate"})).run(pipeline)
    ran = records(tmp_path)
    assert "AfterGate" not in ran
    assert "Slow" not in ran, "the run waited for a stage beside the failed gate instead of abandoning it"
    assert not own.workers[0].process.is_alive()


def test_a_gate_still_explains_a_failure_beside_it(tmp_path):
    """Crash fails first; the gate, which does not depend on it, still runs and its verdict is the one raised."""
    pipeline = build(tmp_path, [("Slow", 2.0, "", "Source"), ("Crash", 0.0, "crash", "Source"),
                                ("Gate", 0.0, "gate", "Slow"), ("AfterCrash", 0.0, "", "Crash")])
    with pytest.raises(DataValidationError, match="failed validation"), started_workers() as own:
        ConcurrentDagRunner(own, gates=frozenset({"Gate"})).run(pipeline)
    ran = records(tmp_path)
    assert ran["Crash"]["end"] < ran["Gate"]["start"]
    assert "AfterCrash" not in ran


def test_without_a_gate_verdict_the_first_failure_is_raised_after_independent_stages(tmp_path, workers):
    pipeline = build(tmp_path, [("Slow", 2.0, "", "Source"), ("Crash", 0.0, "crash", "Source"),
                                ("AfterSlow", 0.0, "", "Slow"), ("AfterCrash", 0.0, "", "Crash")])
    with pytest.raises(ValueError, match="Crash: crashed"):
        ConcurrentDagRunner(workers, gates=frozenset({"Gate"})).run(pipeline)
    ran = records(tmp_path)
    assert {"Slow", "AfterSlow", "Crash"} <= set(ran) and "AfterCrash" not in ran


def test_a_verdict_from_the_worker_keeps_its_type(tmp_path, workers):
    # Busy runs here (first in topological order), so the gate runs in the worker.
    pipeline = build(tmp_path, [("Busy", 1.0, "", "Source"), ("Gate", 0.0, "gate", "Source")])
    with pytest.raises(DataValidationError, match="failed validation") as caught:
        ConcurrentDagRunner(workers, gates=frozenset({"Gate"})).run(pipeline)
    assert [str(a) for a in caught.value.anomalies] == ["[train] Gate: the data failed validation"]
    assert caught.value.exit_code == 3 and os.path.join("Gate", "data") in caught.value.report_path
    ran = records(tmp_path)
    assert ran["Gate"]["pid"] == workers.workers[0].process.pid and ran["Busy"]["pid"] == os.getpid()
