"""The data stages on a real Apache Flink cluster (`mlops cluster flink start`: a JobManager, two TaskManagers and
Beam's Flink job server, each its own process) with parallelism 2: their outputs equal the in-process runner's, Flink's
REST API shows the jobs and both TaskManagers' records, and a stage that fails on Flink reaches the user as one
sentence. Needs `make flink` (part of `make test`)."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline import flink_cluster
from pipeline.beam import job_failure
from settings.config import load_config
from tests.conftest import as_cli_flags, small_overrides

# Every stage of a data-only run that runs a Beam job.
BEAM_STAGES = ("CsvExampleGen", "StatisticsGen", "Transform")


@pytest.fixture(scope="session")
def flink(tmp_path_factory):
    """The standing cluster, started once for the session and stopped by process id afterwards."""
    config = load_config(None, [f"output_root={tmp_path_factory.mktemp('flink')}"])
    state = flink_cluster.start(config)
    try:
        yield config, state
    finally:
        assert flink_cluster.stop(config), "the cluster's processes were gone before the end of the session"


def _data_only_run(data: Path, output_root: Path, *extra: str):
    from pipeline.runner import run_local

    config = load_config(None, small_overrides(data, output_root, *extra))
    run_local(config, data_only=True)
    return Path(config.pipeline_root)


@pytest.fixture(scope="session")
def runs(flink, taxi_slice, tmp_path_factory):
    """The same data-only run on Beam's in-process runner and on the Flink cluster with parallelism 2."""
    config, state = flink
    direct = _data_only_run(taxi_slice, tmp_path_factory.mktemp("direct"))
    on_flink = _data_only_run(taxi_slice, tmp_path_factory.mktemp("on-flink"), *state.beam_overrides(parallelism=2))
    return direct, on_flink


def _one(root: Path, pattern: str) -> Path:
    [path] = root.glob(pattern)
    return path


def _split_rows(root: Path) -> dict[str, int]:
    import tensorflow as tf

    examples = _one(root, "CsvExampleGen/examples/*")
    return {split.name: sum(1 for _ in tf.data.TFRecordDataset(sorted(map(str, split.glob("*.gz"))),
                                                               compression_type="GZIP"))
            for split in sorted(examples.glob("Split-*"))}


def test_example_gen_splits_rows_the_same_on_flink(runs):
    direct, on_flink = runs
    rows = _split_rows(direct)
    assert sum(rows.values()) == 2000 and len(rows) == 3
    assert _split_rows(on_flink) == rows


def _statistics(root: Path) -> dict[str, dict]:
    """Per split and feature: the counts, the numeric moments and extremes, the strings' distinct and top values."""
    import tensorflow_data_validation as tfdv

    figures = {}
    for split in sorted(_one(root, "StatisticsGen/statistics/*").glob("Split-*")):
        [dataset] = tfdv.load_stats_binary(str(split / "FeatureStats.pb")).datasets
        features = {"num_examples": dataset.num_examples}
        for feature in dataset.features:
            name = feature.path.step[0]
            if feature.HasField("num_stats"):
                stats = feature.num_stats
                features[name] = (stats.common_stats.num_non_missing, stats.num_zeros,
                                  stats.mean, stats.std_dev, stats.min, stats.max)
            else:
                stats = feature.string_stats
                features[name] = (stats.common_stats.num_non_missing, stats.unique,
                                  tuple((v.value, v.frequency) for v in stats.top_values))
        figures[split.name] = features
    return figures


def test_statistics_gen_computes_the_same_statistics_on_flink(runs):
    direct, on_flink = _statistics(runs[0]), _statistics(runs[1])
    assert direct.keys() == on_flink.keys() and direct["Split-train"]["num_examples"] > 1000
    for split, features in direct.items():
        assert features.keys() == on_flink[split].keys()
        for name, figures in features.items():
            if name == "num_examples" or isinstance(figures[-1], tuple):  # counts and strings' top values: exact
                assert on_flink[split][name] == figures, (split, name)
            else:  # sums merged in another order differ in the last bits only
                assert on_flink[split][name] == pytest.approx(figures, rel=1e-9), (split, name)


def test_transform_analyzers_give_the_same_results_on_flink(runs):
    """The transform graph holds what the analyzers computed (means, quantile boundaries, vocabularies): both graphs
    turn the same raw rows into the same features."""
    import tensorflow as tf
    import tensorflow_transform as tft

    direct, on_flink = (tft.TFTransformOutput(str(_one(root, "Transform/transform_graph/*"))) for root in runs)
    # The vocabularies exactly (the other asset, components/transform's constants, holds floats summed in another
    # order on Flink: the transformed features below compare them within tolerance).
    vocabularies = load_config(None).data.vocab_features
    assert vocabularies and all(Path(direct.transform_savedmodel_dir, "assets", name).exists() for name in vocabularies)
    for name in vocabularies:
        assert direct.vocabulary_by_name(name) == on_flink.vocabulary_by_name(name), name
    files = sorted(map(str, _one(runs[0], "CsvExampleGen/examples/*/Split-eval").glob("*.gz")))
    raw = next(iter(tf.data.TFRecordDataset(files, compression_type="GZIP").batch(200))).numpy()
    expected, actual = (_transformed(output, raw) for output in (direct, on_flink))
    assert expected.keys() == actual.keys() and len(expected) > 5
    for name, values in expected.items():
        # float32 features from means and variances summed in another order: a few ulps apart.
        np.testing.assert_allclose(actual[name], values, rtol=1e-6, atol=1e-6, err_msg=name)


def _transformed(output, raw: np.ndarray) -> dict[str, np.ndarray]:
    """The transform graph (a TF1 graph: TFX's Transform saves it so) applied to serialized raw examples."""
    import tensorflow as tf

    with tf.compat.v1.Graph().as_default():
        examples = tf.compat.v1.placeholder(tf.string, [None])
        outputs = output.transform_raw_features(tf.io.parse_example(examples, output.raw_feature_spec()))
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.tables_initializer())
            values = session.run(outputs, feed_dict={examples: raw})
    # Sparse outputs by their values (their indices are the rows', the same for both graphs on the same rows).
    return {name: getattr(value, "values", value) for name, value in values.items()}


def test_flink_ran_every_beam_stage_as_jobs_on_both_taskmanagers(flink, runs):
    _, state = flink
    jobs = flink_cluster.rest(state, "/jobs/overview")["jobs"]
    assert len(jobs) >= len(BEAM_STAGES)
    assert {job["state"] for job in jobs} == {"FINISHED"}
    managers = {manager["id"] for manager in flink_cluster.rest(state, "/taskmanagers")["taskmanagers"]}
    assert len(managers) == 2
    records: dict[str, int] = {}
    for job in jobs:
        for manager, count in flink_cluster.records_per_taskmanager(state, job["jid"]).items():
            records[manager] = records.get(manager, 0) + count
    assert set(records) == managers
    assert all(count > 0 for count in records.values()), records


def test_a_stage_that_fails_on_flink_is_one_sentence(flink, taxi_slice, tmp_path):
    _, state = flink
    overrides = state.beam_overrides(parallelism=2) + ["beam.environment_config=/nonexistent/sdk-worker"]
    command = [sys.executable, "-c", "from pipeline.cli import console_main; console_main()", "run", "--data-only",
               *as_cli_flags(small_overrides(taxi_slice, tmp_path, *overrides))]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line.startswith("error: CsvExampleGen failed: its Beam job ")
    # Flink's own words for a worker command that is not there (java.lang.ProcessBuilder's IOException).
    assert "failed on the runner: java.io.IOException: error=2, No such file or directory; " in line
    assert "see the full log at " in line


def test_job_failure_keeps_the_python_exception_of_a_java_trace():
    trace = ("Pipeline BeamApp-1 failed in state FAILED: java.lang.RuntimeException: Error received from SDK harness "
             "for instruction 7: Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n    g()\n"
             "ValueError: column fare holds text\n\n\tat org.apache.beam.Foo.bar(Foo.java:1)\n")
    assert job_failure(RuntimeError(trace)) == ("its Beam job BeamApp-1 failed on the runner: ValueError: column fare "
                                                "holds text")
    java_only = "Pipeline BeamApp-2 failed in state FAILED: java.io.IOException: disk full\n\tat a.b(C.java:1)"
    assert job_failure(RuntimeError(java_only)) == ("its Beam job BeamApp-2 failed on the runner: java.io.IOException: "
                                                    "disk full")
    assert job_failure(RuntimeError("Pipeline construction failed")) is None


def test_status_and_stop_without_a_cluster_say_so(tmp_path, capsys):
    from pipeline import cli

    assert cli.main(["cluster", "flink", "status", "--set", f"output_root={tmp_path}"]) == 1
    assert cli.main(["cluster", "flink", "stop", "--set", f"output_root={tmp_path}"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "no Flink cluster is running; start it with `mlops cluster flink start`", "no Flink cluster was running"]


def test_start_without_flink_installed_is_one_sentence(tmp_path, capsys):
    from pipeline import cli

    missing = tmp_path / "no-flink"
    assert cli.main(["cluster", "flink", "start", "--set", f"output_root={tmp_path}",
                     "--set", f"cluster.flink.flink_env={missing}"]) == 1
    assert capsys.readouterr().err == (f"error: Flink is not installed in {missing}; run `make flink` (Flink 1.19 "
                                       "from PyPI and Beam's Flink job server from Maven Central).\n")


def test_a_cluster_needs_a_taskmanager_with_a_slot():
    from settings.config import ConfigError

    assert load_config(None, ["cluster.flink.taskmanagers=1", "cluster.flink.slots_per_taskmanager=1"])
    for override in ("cluster.flink.taskmanagers=0", "cluster.flink.slots_per_taskmanager=0"):
        with pytest.raises(ConfigError, match="must be 1 or more"):
            load_config(None, [override])


def test_the_taskmanagers_memory_settings_reach_flinks_conf(tmp_path):
    """Flink's own default (no task off-heap memory) unless set: 10x the sample needed more direct memory."""
    state = flink_cluster.ClusterState(rest_port=1, rpc_port=2, job_port=3, artifact_port=4, expansion_port=5,
                                       worker_command="sdk-worker")
    for overrides, off_heap in (([], "0m"), (["cluster.flink.taskmanager_task_off_heap_memory=512m"], "512m")):
        settings = load_config(None, ["cluster.flink.taskmanager_memory=3072m", *overrides]).cluster.flink
        conf = flink_cluster._flink_conf(flink_cluster.flink_home(settings), settings, state, tmp_path)
        assert conf["taskmanager.memory.task.off-heap.size"] == off_heap
        assert conf["taskmanager.memory.process.size"] == "3072m"
