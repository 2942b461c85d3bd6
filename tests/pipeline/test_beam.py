"""`beam.runner` and its keys become Beam's pipeline arguments in one place (pipeline/beam.py), checked up front."""
import csv

import numpy as np
import pytest

from benchmarks.taxi_data import read_sample, write_synthetic
from pipeline.beam import beam_pipeline_args
from pipeline.data import count_csv_rows
from settings.config import ConfigError, load_config

SETUP = "/app/setup.py"


def args_for(*overrides):
    return beam_pipeline_args(load_config(None, list(overrides)).beam, SETUP)


def test_direct_runner_is_the_default():
    assert args_for() == ["--runner=DirectRunner", f"--setup_file={SETUP}", "--direct_running_mode=multi_processing",
                          "--direct_num_workers=0"]


@pytest.mark.parametrize("overrides, expected", [
    (["beam.runner=PortableRunner", "beam.job_endpoint=localhost:8099", "beam.environment_type=EXTERNAL",
      "beam.environment_config=localhost:50000"],
     ["--job_endpoint=localhost:8099", "--environment_type=EXTERNAL", "--environment_config=localhost:50000"]),
    (["beam.runner=FlinkRunner", "beam.flink_master=flink-jobmanager:8081",
      "beam.environment_config=registry.example/beam-sdk:2.61", "beam.parallelism=8"],
     ["--flink_master=flink-jobmanager:8081", "--environment_type=DOCKER",
      "--environment_config=registry.example/beam-sdk:2.61", "--parallelism=8"]),
    (["beam.runner=SparkRunner", "beam.spark_master_url=spark://spark-master:7077",
      "beam.environment_config=registry.example/beam-sdk:2.61"],
     ["--spark_master_url=spark://spark-master:7077", "--environment_type=DOCKER",
      "--environment_config=registry.example/beam-sdk:2.61"]),
    (["beam.runner=DataflowRunner", "beam.project=my-project", "beam.region=europe-west1",
      "beam.temp_location=gs://bucket/tmp", "beam.extra_args=[--max_num_workers=20]"],
     ["--project=my-project", "--region=europe-west1", "--temp_location=gs://bucket/tmp", "--max_num_workers=20"]),
])
def test_each_runner_gets_its_arguments(overrides, expected):
    runner = overrides[0].split("=")[1]
    assert args_for(*overrides) == [f"--runner={runner}", f"--setup_file={SETUP}", *expected]


def test_short_runner_names_and_a_standing_flink_job_server():
    """`beam.runner: flink` with the job server `mlops cluster flink start` prints, and its PROCESS command."""
    args = args_for("beam.runner=flink", "beam.job_endpoint=127.0.0.1:8099", "beam.environment_type=PROCESS",
                    "beam.environment_config=/srv/flink/sdk-worker", "beam.parallelism=2")
    assert args == ["--runner=FlinkRunner", f"--setup_file={SETUP}", "--job_endpoint=127.0.0.1:8099",
                    "--environment_type=PROCESS", '--environment_config={"command": "/srv/flink/sdk-worker"}',
                    "--parallelism=2"]
    assert args_for("beam.runner=direct")[0] == "--runner=DirectRunner"
    assert args_for("beam.runner=dataflow", "beam.project=p", "beam.region=r",
                    "beam.temp_location=gs://b/t")[0] == "--runner=DataflowRunner"


@pytest.mark.parametrize("overrides, workers", [
    (["beam.direct_running_mode=in_memory"], "1"),
    (["beam.direct_running_mode=in_memory", "beam.direct_num_workers=4"], "1"),
    (["beam.direct_running_mode=multi_processing", "beam.direct_num_workers=4"], "4"),
    (["beam.direct_running_mode=multi_threading"], "0"),
])
def test_in_memory_runs_one_worker(overrides, workers):
    """More in_memory workers only split each bundle across threads of this process: slower, never faster."""
    assert args_for(*overrides)[-1] == f"--direct_num_workers={workers}"


@pytest.mark.parametrize("overrides, message", [
    (["beam.runner=FlinkRunner"], r"beam.runner FlinkRunner needs beam.job_endpoint \(.*\) or beam.flink_master"),
    (["beam.runner=flink"], r"beam.runner FlinkRunner needs beam.job_endpoint"),
    (["beam.runner=SparkRunner"], "beam.runner SparkRunner needs beam.spark_master_url"),
    (["beam.runner=PortableRunner", "beam.job_endpoint=localhost:8099"],
     "beam.environment_type DOCKER needs beam.environment_config"),
    (["beam.runner=DataflowRunner", "beam.project=p"], "needs beam.region and beam.temp_location"),
    (["beam.runner=DataflowRunner", "beam.project=p", "beam.region=r", "beam.temp_location=/tmp"],
     "beam.temp_location must be a gs:// folder"),
    (["beam.runner=SamzaRunner"], "'beam.runner' must be one of 'DirectRunner', 'PortableRunner'"),
])
def test_a_runner_without_what_it_needs_is_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_the_pipeline_passes_them_to_every_beam_component(tmp_path):
    from pipeline.pipeline import create_pipeline

    config = load_config(None, [f"output_root={tmp_path}", "beam.runner=PortableRunner",
                                "beam.job_endpoint=localhost:8099", "beam.environment_type=LOOPBACK"])
    tfx_pipeline = create_pipeline(config, data_only=True)
    nodes = {node.id for node in tfx_pipeline.components}
    assert {"Transform", "DataValidationGate"} <= nodes and "Trainer" not in nodes
    assert tfx_pipeline.beam_pipeline_args[:1] == ["--runner=PortableRunner"]
    assert "--job_endpoint=localhost:8099" in tfx_pipeline.beam_pipeline_args


@pytest.mark.parametrize("rows, mode", [(None, "multi_processing"), (0, "in_memory"), (5000, "in_memory"),
                                        (5001, "multi_processing")])
def test_auto_runs_in_memory_up_to_the_crossover(rows, mode):
    beam = load_config(None, ["beam.direct_running_mode=auto", "beam.in_memory_max_rows=5000"]).beam
    assert beam_pipeline_args(beam, SETUP, rows)[2] == f"--direct_running_mode={mode}"


@pytest.mark.parametrize("mode", ["in_memory", "multi_threading", "multi_processing"])
def test_a_mode_set_by_name_holds_whatever_the_rows(mode):
    beam = load_config(None, [f"beam.direct_running_mode={mode}"]).beam
    for rows in (None, 0, 10**9):
        assert beam_pipeline_args(beam, SETUP, rows)[2] == f"--direct_running_mode={mode}"


def test_rows_are_counted_over_every_csv_file_without_headers(tmp_path):
    (tmp_path / "a.csv").write_text("x,y\n1,2\n3,4\n")
    (tmp_path / "b.CSV").write_text("x,y\n5,6")  # no line break after the last row
    (tmp_path / "header_only.csv").write_text("x,y\n")
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "notes.txt").write_text("not\ndata\n")
    assert count_csv_rows(tmp_path) == 3


@pytest.mark.parametrize("max_rows, mode", [(2000, "in_memory"), (1999, "multi_processing")])
def test_a_local_run_chooses_the_mode_by_its_csv_rows(taxi_slice, tmp_path, max_rows, mode):
    from pipeline.pipeline import create_pipeline

    config = load_config(None, [f"output_root={tmp_path}", f"data.path={taxi_slice}",
                                "beam.direct_running_mode=auto", f"beam.in_memory_max_rows={max_rows}"])
    assert f"--direct_running_mode={mode}" in create_pipeline(config, data_only=True).beam_pipeline_args


def test_the_synthetic_data_keeps_the_sample_s_columns_and_distributions(tmp_path):
    header, sample = read_sample()
    assert write_synthetic(tmp_path / "a", 2, seed=3) == 2 * len(sample)
    write_synthetic(tmp_path / "b", 2, seed=3)
    assert (tmp_path / "a" / "data.csv").read_bytes() == (tmp_path / "b" / "data.csv").read_bytes()
    with open(tmp_path / "a" / "data.csv", newline="") as f:
        reader = csv.reader(f)
        assert next(reader) == header
        rows = list(reader)
    column = {name: i for i, name in enumerate(header)}

    def share(table, predicate):
        return np.mean([predicate(row) for row in table])

    def big_tipper(row):
        return bool(row[column["tips"]]) and float(row[column["tips"]]) > 0.2 * float(row[column["fare"]] or 0)

    assert share(rows, big_tipper) == pytest.approx(share(sample, big_tipper), abs=0.01)
    for name in ("pickup_latitude", "company", "trip_miles"):
        index = column[name]
        missing = share(rows, lambda r, i=index: r[i] == "")
        assert missing == pytest.approx(share(sample, lambda r, i=index: r[i] == ""), abs=0.01), name
    fares = [float(r[column["fare"]]) for r in rows if r[column["fare"]]]
    assert np.mean(fares) == pytest.approx(np.mean([float(r[column["fare"]]) for r in sample]), rel=0.03)
    assert len({tuple(r) for r in rows}) > 0.9 * len(rows), "rows are jittered, not copied"


def test_a_portable_runners_workers_get_absolute_local_paths(tmp_path, monkeypatch):
    """SDK workers run in a folder of their own: relative local paths become absolute for portable runners only;
    absolute paths and URIs stay as written."""
    monkeypatch.chdir(tmp_path)
    relative = ["output_root=outputs", "data.path=data/taxi", "artifact_root=artifacts"]
    flink = ["beam.runner=flink", "beam.job_endpoint=127.0.0.1:8099", "beam.environment_type=LOOPBACK"]
    config = load_config(None, [*relative, *flink])
    assert (config.output_root, config.data.path, config.artifact_root) == (
        str(tmp_path / "outputs"), str(tmp_path / "data/taxi"), str(tmp_path / "artifacts"))
    config = load_config(None, relative)
    assert (config.output_root, config.data.path, config.artifact_root) == ("outputs", "data/taxi", "artifacts")
    config = load_config(None, ["output_root=/mlops/outputs", "data.path=gs://bucket/taxi", *flink])
    assert (config.output_root, config.data.path) == ("/mlops/outputs", "gs://bucket/taxi")
