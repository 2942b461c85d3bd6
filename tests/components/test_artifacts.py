"""The artifact layout and its I/O on TensorFlow's in-memory file system (ram://): nothing may assume a local path."""
import uuid

import pytest
import tensorflow as tf
from tensorflow_metadata.proto.v0 import anomalies_pb2
from tfx.utils import path_utils

from components import artifacts
from components.distributed.spec import WorkerSpec
from components.gates.anomalies import read_anomalies


@pytest.fixture
def root():
    path = f"ram://artifacts-{uuid.uuid4().hex}"
    yield path
    artifacts.remove_tree(path)


def write_examples(folder: str, count: int) -> None:
    with tf.io.TFRecordWriter(artifacts.join(folder, "data_tfrecord-00000-of-00001.gz"), options="GZIP") as writer:
        for i in range(count):
            example = tf.train.Example()
            example.features.feature["i"].int64_list.value.append(i)
            writer.write(example.SerializeToString())


def test_the_layout_is_tfx_s_own():
    uri = "gs://bucket/pipelines/taxi/Trainer/model/7"
    assert artifacts.serving_model_dir(uri) == path_utils.serving_model_dir(uri)
    assert artifacts.parent(artifacts.serving_model_dir(uri) + "/") == uri
    assert artifacts.split_uri(uri, "eval") == f"{uri}/Split-eval"
    assert artifacts.absolute("gs://bucket/x") == "gs://bucket/x" and artifacts.absolute("x").startswith("/")


def test_the_split_reader_reads_records_from_any_file_system(root):
    folder = artifacts.split_uri(root, "eval")
    artifacts.make_dirs(folder)
    write_examples(folder, 5)
    records = artifacts.read_records(folder, limit=3)
    assert [tf.train.Example.FromString(r).features.feature["i"].int64_list.value[0] for r in records] == [0, 1, 2]
    assert len(artifacts.read_records(folder)) == 5
    with pytest.raises(FileNotFoundError, match="no example files"):
        artifacts.read_records(artifacts.split_uri(root, "train"))


def test_copy_tree_crosses_file_systems_both_ways(root, tmp_path):
    source = tmp_path / "model"
    (source / "variables").mkdir(parents=True)
    (source / "saved_model.pb").write_bytes(b"pb")
    (source / "variables" / "variables.index").write_bytes(b"index")
    artifacts.copy_tree(str(source), artifacts.join(root, "version"))
    assert artifacts.read_bytes(artifacts.join(root, "version", "variables", "variables.index")) == b"index"
    back = tmp_path / "back"
    artifacts.copy_tree(artifacts.join(root, "version"), str(back))
    assert (back / "saved_model.pb").read_bytes() == b"pb" and (back / "variables" / "variables.index").exists()
    with pytest.raises(FileNotFoundError):
        artifacts.copy_tree(artifacts.join(root, "absent"), str(tmp_path / "x"))


def test_reports_specs_and_single_files(root):
    report = artifacts.join(root, "Optimizer", "optimized_model", "9", artifacts.OPTIMIZATION_REPORT_FILE)
    artifacts.write_json(report, {"stages": ["prune"]})
    assert artifacts.read_json(report) == {"stages": ["prune"]}
    assert artifacts.only_file(artifacts.parent(report)) == report
    spec = WorkerSpec(run_fn="components.model.run_fn", train_files=["t/*"], eval_files=["e/*"],
                      serving_model_dir=f"{root}/model/Format-Serving", model_run_dir=f"{root}/model_run")
    path = spec.save(artifacts.join(artifacts.workers_dir(spec.model_run_dir), "spec.json"))
    assert WorkerSpec.load(path) == spec
    artifacts.remove_tree(artifacts.workers_dir(spec.model_run_dir))
    assert not artifacts.exists(path)


def test_the_data_gate_reads_anomalies_from_any_file_system(root):
    report = anomalies_pb2.Anomalies()
    report.anomaly_info["fare"].description = "Expected FLOAT, got STRING"
    artifacts.write_bytes(artifacts.join(artifacts.split_uri(root, "train"), artifacts.SCHEMA_DIFF_FILE),
                          report.SerializeToString())
    artifacts.write_bytes(artifacts.join(artifacts.split_uri(root, "eval"), artifacts.SCHEMA_DIFF_FILE),
                          anomalies_pb2.Anomalies().SerializeToString())
    found = read_anomalies(root, ["train", "eval"])
    assert [str(a) for a in found] == ["[train] fare: Expected FLOAT, got STRING"]


def test_a_worker_spec_gives_tfx_fn_args_with_a_data_accessor(tmp_path):
    from tfx.components.trainer.fn_args_utils import DataAccessor, FnArgs

    spec = WorkerSpec(run_fn="components.model.run_fn", train_files=["t/*"], eval_files=["e/*"], train_steps=5,
                      serving_model_dir=str(tmp_path / "serving"), model_run_dir=str(tmp_path / "model_run"))
    fn_args = spec.fn_args()
    assert isinstance(fn_args, FnArgs) and isinstance(fn_args.data_accessor, DataAccessor)
    assert (fn_args.train_files, fn_args.eval_files, fn_args.train_steps) == (["t/*"], ["e/*"], 5)
    assert fn_args.serving_model_dir == str(tmp_path / "serving")
