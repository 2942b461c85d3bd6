"""The Publisher's plain function: staged, checksummed, numbered versions; the same model is the same version; a
changed file is caught; publishing serves nothing after the first version; `mlops versions` reports it all; a
version carries its training schema and statistics for `mlops monitor`."""
import json
import shutil
from pathlib import Path

import pytest

from components.publisher.publish import (
    TRAINING_SCHEMA_FILE,
    TRAINING_STATISTICS_FILE,
    TrainingData,
    publish_model,
)
from rollout.cli import version_rows
from serving.repository.base import RepositoryError
from serving.repository.local import ModelRepository
from tests.serving.conftest import save_tiny_model

# Reports the pipeline wrote (tests/reports/test_records.py reads them back).
REPORTS = Path(__file__).resolve().parents[1] / "fixtures" / "reports"


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    folder = tmp_path_factory.mktemp("exports")
    out = {}
    for name, bias in (("a", 1.0), ("b", 2.0)):
        path = save_tiny_model(folder / name, bias)
        (path / "export_report.json").write_text(json.dumps({"passed": True}))
        out[name] = path
    return out


def test_versions_grow_and_the_same_model_is_the_same_version(tmp_path, exports):
    base = tmp_path / "serving"
    first = publish_model(str(exports["a"]), str(base), "taxi", {"blessed": True})
    assert (first.version, first.new, first.bootstrapped) == (1, True, ("stable", "canary"))
    again = publish_model(str(exports["a"]), str(base), "taxi", {"blessed": True})
    assert (again.version, again.new, again.bootstrapped) == (1, False, ())
    second = publish_model(str(exports["b"]), str(base), "taxi", {"blessed": True})
    assert (second.version, second.new, second.bootstrapped) == (2, True, ())
    repository = ModelRepository(base)
    assert repository.labels("taxi") == {"stable": 1}, "publishing version 2 routes nothing to it"
    assert ModelRepository.for_track(base, "canary").labels("taxi") == {"canary": 1}
    assert sorted(p.name for p in (base / "taxi").iterdir()) == ["1", "2"], "no staging folder is left behind"
    manifest = json.loads((base / "taxi" / "2" / "MANIFEST.json").read_text())["files"]
    assert {"saved_model.pb", "publication.json", "export_report.json"} <= set(manifest)


def test_a_failed_export_report_is_never_published(tmp_path, exports):
    failed = tmp_path / "failed"
    save_tiny_model(failed, 0.5)
    (failed / "export_report.json").write_text(json.dumps({"passed": False}))
    with pytest.raises(RepositoryError, match="never published"):
        publish_model(str(failed), str(tmp_path / "serving"), "taxi", {"blessed": True})
    assert not (tmp_path / "serving" / "taxi").exists()


@pytest.mark.parametrize("report", [{"artifacts": []}, {"passed": "yes"}])
def test_an_export_report_without_a_verdict_is_refused_with_what_to_do(tmp_path, report):
    unreadable = save_tiny_model(tmp_path / "unreadable", 0.5)
    (unreadable / "export_report.json").write_text(json.dumps(report))
    with pytest.raises(RepositoryError, match=r"export_report.json cannot be read \(the export report('s 'passed' is "
                                              r"'yes': expected true or false| has no 'passed')"
                                              r".*export the model again"):
        publish_model(str(unreadable), str(tmp_path / "serving"), "taxi", {"blessed": True})
    assert not (tmp_path / "serving" / "taxi").exists()


def test_versions_lists_blessing_export_checksums_and_labels(tmp_path, exports):
    base = tmp_path / "serving"
    publish_model(str(exports["a"]), str(base), "taxi", {"blessed": True})
    publish_model(str(exports["b"]), str(base), "taxi", {"blessed": True})
    ModelRepository(base).add_version("taxi", exports["a"], version=3)  # by hand: no publication record
    (base / "taxi" / "2" / "export_report.json").write_text(json.dumps({"passed": True, "tampered": 1}))
    rows = {row["version"]: row for row in version_rows(str(base), "taxi")}
    assert rows[1]["blessed"] == "yes" and rows[1]["export"] == "passed" and rows[1]["checksums"] == "ok"
    assert rows[1]["labels"] == ["canary", "stable"] and rows[1]["served_by"] == ["canary", "stable"]
    assert rows[2]["checksums"] == "MISMATCH" and rows[2]["checksum_problems"] == ["export_report.json: changed"]
    assert rows[2]["labels"] == [] and rows[2]["served_by"] == []
    assert rows[3]["blessed"] == "unknown"


def test_a_version_below_the_latest_is_refused(tmp_path, exports):
    repository = ModelRepository(tmp_path / "serving")
    repository.add_version("taxi", exports["a"], version=5)
    with pytest.raises(RepositoryError, match="only grow"):
        repository.add_version("taxi", exports["b"], version=4)


def test_a_calibrated_model_publishes_its_decision_threshold(tmp_path):
    export = save_tiny_model(tmp_path / "calibrated", 1.5)
    # A calibration record as the Optimizer wrote it for the taxi model.
    calibration = json.loads((REPORTS / "taxi" / "calibration.json").read_text())
    (export / "export_report.json").write_text(json.dumps({"passed": True, "calibration": calibration}))
    base = tmp_path / "serving"
    publish_model(str(export), str(base), "taxi", {"blessed": True})
    publication = ModelRepository(base).publication("taxi", 1)
    assert publication["calibration"] == {key: calibration[key] for key in ("method", "threshold", "objective",
                                                                            "fitted_on", "rows")}
    assert version_rows(str(base), "taxi")[0]["threshold"] == calibration["threshold"]


def test_a_version_publishes_how_its_rows_are_read(tmp_path):
    # `mlops predict --csv` reads the training file as ExampleGen did: these markers, without this label.
    export = save_tiny_model(tmp_path / "model", 1.5)
    request = {"missing_values": ["NA"], "label_columns": ["body_mass_g"]}
    (export / "export_report.json").write_text(json.dumps({"passed": True, "request": request}))
    publish_model(str(export), str(tmp_path / "serving"), "penguins", {"blessed": True})
    assert ModelRepository(tmp_path / "serving").publication("penguins", 1)["request"] == request


def test_an_uncalibrated_model_publishes_no_threshold(tmp_path, exports):
    base = tmp_path / "serving"
    publish_model(str(exports["a"]), str(base), "taxi", {"blessed": True})
    assert "calibration" not in ModelRepository(base).publication("taxi", 1)
    assert version_rows(str(base), "taxi")[0]["threshold"] is None


def training_files(folder, statistics=b"statistics"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "schema.pbtxt").write_text('feature { name: "fare" type: FLOAT }\n')
    (folder / "FeatureStats.pb").write_bytes(statistics)
    return TrainingData(schema=str(folder / "schema.pbtxt"), statistics=str(folder / "FeatureStats.pb"))


def test_a_version_carries_its_training_schema_and_statistics_where_tf_serving_ignores_them(tmp_path, exports):
    import tensorflow as tf

    base = tmp_path / "serving"
    training = training_files(tmp_path / "training")
    published = publish_model(str(exports["a"]), str(base), "taxi", {"blessed": True}, training)
    version = base / "taxi" / str(published.version)
    assert (version / TRAINING_SCHEMA_FILE).read_bytes() == (tmp_path / "training" / "schema.pbtxt").read_bytes()
    assert (version / TRAINING_STATISTICS_FILE).read_bytes() == b"statistics"
    assert TRAINING_SCHEMA_FILE.startswith("assets.extra/") and TRAINING_STATISTICS_FILE.startswith("assets.extra/")
    manifest = json.loads((version / "MANIFEST.json").read_text())["files"]
    assert {TRAINING_SCHEMA_FILE, TRAINING_STATISTICS_FILE} <= set(manifest)
    assert ModelRepository(base).verify("taxi", published.version).state == "ok"
    loaded = tf.saved_model.load(str(version))
    assert "serving_default" in loaded.signatures


def test_the_same_model_and_data_are_the_same_version_and_other_data_a_new_one(tmp_path, exports):
    base = str(tmp_path / "serving")
    training = training_files(tmp_path / "training")
    first = publish_model(str(exports["a"]), base, "taxi", {"blessed": True}, training)
    again = publish_model(str(exports["a"]), base, "taxi", {"blessed": True}, training)
    assert (first.version, first.new, again.version, again.new) == (1, True, 1, False)
    other = publish_model(str(exports["a"]), base, "taxi", {"blessed": True},
                          training_files(tmp_path / "other", b"other statistics"))
    assert (other.version, other.new) == (2, True)
    bare = publish_model(str(exports["a"]), base, "taxi", {"blessed": True})
    assert (bare.version, bare.new) == (3, True), "without the training data it is another version's content"
    assert not (tmp_path / "serving" / "taxi" / "3" / "assets.extra").exists()


def test_a_missing_training_file_is_refused_before_anything_is_written(tmp_path, exports):
    training = training_files(tmp_path / "training")
    training = TrainingData(schema=training.schema, statistics=str(tmp_path / "nowhere" / "FeatureStats.pb"))
    with pytest.raises(RepositoryError) as error:
        publish_model(str(exports["a"]), str(tmp_path / "serving"), "taxi", {"blessed": True}, training)
    assert str(error.value) == (f"the training data file {tmp_path}/nowhere/FeatureStats.pb does not exist, so the "
                                "version could not carry it; publish from a pipeline run whose StatisticsGen and "
                                "schema artifacts are in place.")
    assert not (tmp_path / "serving" / "taxi").exists()


def test_the_executor_takes_the_schema_and_the_train_splits_statistics(tmp_path):
    from tfx.types import artifact_utils, standard_artifacts

    from components.publisher.executor import training_data

    schema = standard_artifacts.Schema()
    schema.uri = str(tmp_path / "schema")
    statistics = standard_artifacts.ExampleStatistics()
    statistics.uri = str(tmp_path / "statistics")
    statistics.split_names = artifact_utils.encode_split_names(["train", "eval"])
    assert training_data({"schema": [schema], "statistics": [statistics]}) == TrainingData(
        schema=f"{tmp_path}/schema/schema.pbtxt", statistics=f"{tmp_path}/statistics/Split-train/FeatureStats.pb")
    assert training_data({"schema": [schema]}) is None
    assert training_data({"schema": [], "statistics": [statistics]}) is None
    assert training_data({}) is None


def test_the_same_model_bytes_with_another_export_report_publish_nothing_new(tmp_path, exports):
    # An uncached re-run writes the same model with other latencies in its export report: the same version.
    base = tmp_path / "serving"
    first = publish_model(str(exports["a"]), str(base), "taxi", {"blessed": True})
    rerun = tmp_path / "rerun"
    shutil.copytree(exports["a"], rerun)
    (rerun / "export_report.json").write_text(json.dumps({"passed": True, "latency_ms": 1.5}))
    (rerun / "export_report.html").write_text("<p>1.5 ms</p>")
    again = publish_model(str(rerun), str(base), "taxi", {"blessed": True})
    assert (first.version, again.version, again.new) == (1, 1, False)
    (rerun / "variables" / "variables.index").write_bytes(b"other weights")
    changed = publish_model(str(rerun), str(base), "taxi", {"blessed": True})
    assert (changed.version, changed.new) == (2, True), "other model bytes are a new version"
