"""ML Metadata queries (pipeline/metadata.py) and the progress display that reads them, on records laid out as TFX
writes them."""
import io
import json

import pytest

from pipeline import metadata
from pipeline.local.progress import StageProgress
from tests.mlmd_records import Execution, Recorder


@pytest.fixture
def recorded(tmp_path):
    """Two runs of 'taxi' (the second served from the cache) and one run of another pipeline in the same file."""
    path = str(tmp_path / "metadata.db")
    recorder = Recorder(path)
    first = recorder.run("run-1")
    examples = recorder.artifact("Examples", "gs://bucket/CsvExampleGen/examples/1", json.dumps(["train", "eval"]))
    graph = recorder.artifact("TransformGraph", "gs://bucket/Transform/transform_graph/3")
    transformed = recorder.artifact("Examples", "gs://bucket/Transform/transformed_examples/3",
                                    json.dumps(["train", "eval"]))
    recorder.execution(first, "CsvExampleGen", outputs={"examples": [examples]})
    recorder.execution(first, "Transform", outputs={"transform_graph": [graph], "transformed_examples": [transformed]})
    failed = recorder.execution(first, "Trainer", state=Execution.FAILED)
    second = recorder.run("run-2")
    recorder.execution(second, "CsvExampleGen", Execution.CACHED, outputs={"examples": [examples]})
    recorder.execution(second, "Transform", Execution.CACHED,
                       outputs={"transform_graph": [graph], "transformed_examples": [transformed]})
    other = Recorder(path, pipeline="other")
    other.execution(other.run("other-run"), "CsvExampleGen",
                    outputs={"examples": [other.artifact("Examples", "/x", json.dumps(["train"]))]})
    return path, recorder, failed


def test_latest_run_and_its_outputs(recorded):
    path, _, _ = recorded
    store = metadata.connect(path)
    assert [run.name for run in metadata.runs(store, "taxi")] == ["run-1", "run-2"]
    run = metadata.latest_run(store, "taxi")
    assert run.name == "run-2"
    outputs = {(o.node, o.key, o.type_name): o.artifact.uri for o in metadata.run_outputs(store, run, "taxi")}
    assert outputs == {
        ("CsvExampleGen", "examples", "Examples"): "gs://bucket/CsvExampleGen/examples/1",
        ("Transform", "transform_graph", "TransformGraph"): "gs://bucket/Transform/transform_graph/3",
        ("Transform", "transformed_examples", "Examples"): "gs://bucket/Transform/transformed_examples/3",
    }


def test_latest_transform_output_and_eval_split(recorded):
    store = metadata.connect(recorded[0])
    outputs = metadata.latest_outputs(store, "taxi", "Transform")
    assert outputs["transform_graph"].uri == "gs://bucket/Transform/transform_graph/3"
    assert metadata.latest_split(store, "taxi", "CsvExampleGen", "examples", "eval") == \
        "gs://bucket/CsvExampleGen/examples/1/Split-eval"
    with pytest.raises(metadata.NoRecordError, match="has no 'test' split, only train, eval"):
        metadata.latest_split(store, "taxi", "CsvExampleGen", "examples", "test")


def test_what_was_never_recorded_is_one_sentence(recorded, tmp_path):
    store = metadata.connect(recorded[0])
    with pytest.raises(metadata.NoRecordError, match="pipeline 'taxi' has never run Publisher; run the pipeline first"):
        metadata.latest_outputs(store, "taxi", "Publisher")
    with pytest.raises(metadata.NoRecordError, match="no run of pipeline 'taxi' finished Trainer"):
        metadata.latest_outputs(store, "taxi", "Trainer")
    with pytest.raises(metadata.NoRecordError, match="no run of pipeline 'nobody' is recorded"):
        metadata.latest_run(store, "nobody")
    with pytest.raises(metadata.NoRecordError, match="no ML Metadata database at"):
        metadata.connect(str(tmp_path / "absent.db"))


def test_progress_prints_each_stage_of_the_new_run_only(tmp_path):
    path = str(tmp_path / "metadata.db")
    recorder = Recorder(path)
    old = recorder.run("old")
    recorder.execution(old, "CsvExampleGen")
    out = io.StringIO()
    progress = StageProgress(["CsvExampleGen", "StatisticsGen", "Trainer"], out, path, "taxi", poll_seconds=60)
    with progress.track():
        run = recorder.run("new")
        recorder.execution(run, "CsvExampleGen", Execution.CACHED)
        running = recorder.execution(run, "StatisticsGen", Execution.RUNNING)
        progress.poll()
        assert progress.current == "StatisticsGen"
        recorder.set_state(running, Execution.COMPLETE, 2.0)
    lines = [line.split("s  ", 1)[1] for line in out.getvalue().splitlines()]
    assert lines == ["[1/3] CsvExampleGen ...", "[1/3] CsvExampleGen done in 0.0s (cached)",
                     "[2/3] StatisticsGen ...", lines[3]]
    assert lines[3].startswith("[2/3] StatisticsGen done in ") and not lines[3].endswith("(cached)")
    assert set(progress.finished) == {"CsvExampleGen", "StatisticsGen"}
    assert progress.finished["CsvExampleGen"][1] is True and progress.current is None


def test_progress_names_the_failed_stage(tmp_path):
    path = str(tmp_path / "metadata.db")
    recorder = Recorder(path)
    out = io.StringIO()
    progress = StageProgress(["CsvExampleGen", "Trainer"], out, path, "taxi", poll_seconds=60)
    with progress.track():
        run = recorder.run("r")
        recorder.execution(run, "CsvExampleGen")
        recorder.execution(run, "Trainer", Execution.FAILED)
    progress.failed()
    assert progress.current == "Trainer"
    assert out.getvalue().splitlines()[-1].endswith("[2/2] Trainer FAILED")


def test_progress_never_fails_the_run(tmp_path, caplog):
    """An unreadable database only costs the display: no exception leaves poll() or track()."""
    path = tmp_path / "metadata.db"
    path.write_bytes(b"this is not a SQLite file")
    out = io.StringIO()
    progress = StageProgress(["CsvExampleGen"], out, str(path), "taxi", poll_seconds=0.01)
    with progress.track():
        progress.poll()
    progress.failed()
    assert progress.finished == {} and out.getvalue() == ""
    assert "progress display could not read ML Metadata" in caplog.text
