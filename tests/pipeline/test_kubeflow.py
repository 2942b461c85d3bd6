"""mlops compile kubeflow: the local DAG compiled by TFX's KubeflowV2DagRunner; mlops submit kubeflow against a fake
KFP API server."""
import json
from pathlib import Path

import pytest
import yaml

from pipeline import cli
from pipeline.kubeflow import IMAGE_PROJECT_ROOT, KubeflowError, compile_pipeline, embedded_sample_in_image, submit
from pipeline.pipeline import create_pipeline
from settings.config import load_config
from tests.fake_kfp import FakeKfpServer

IMAGE = "registry.example/tfx-mlops:1.0"
KUBEFLOW = ["kubeflow.output_root=gs://bucket/tfx-mlops", f"kubeflow.image={IMAGE}"]
# Every task's resources and retries, the Trainer's and the Evaluator's own over them.
TASK_SETTINGS = ["kubeflow.tasks.cpu_request=500m", "kubeflow.tasks.memory_request=2Gi", "kubeflow.tasks.retries=2",
                 "kubeflow.components.Trainer.cpu_limit=4", "kubeflow.components.Trainer.memory_limit=16Gi",
                 "kubeflow.components.Trainer.retries=0", "kubeflow.components.Evaluator.memory_request=8G",
                 "kubeflow.components.Evaluator.retry_backoff_seconds=30"]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kfp")
    config = load_config(None, [*KUBEFLOW, *TASK_SETTINGS, f"output_root={folder}/local"])
    return config, {name: compile_pipeline(config, str(folder / name))
                    for name in ("pipeline.yaml", "again.yaml", "pipeline.json")}


def local_dag(config, baseline):
    """Node id -> upstream node ids of the DAG LocalDagRunner runs, with the given baseline."""
    config = load_config(None, [*KUBEFLOW, f"output_root={config.output_root}", f"evaluation.baseline={baseline}"])
    return {node.id: sorted(n.id for n in node.upstream_nodes) for node in create_pipeline(config).components}


def test_the_yaml_spec_has_every_local_component_with_the_same_dependencies(compiled):
    config, results = compiled
    spec = yaml.safe_load(Path(results["pipeline.yaml"].path).read_text())
    assert spec["schemaVersion"] == "2.1.0" and spec["pipelineInfo"]["name"] == "taxi"
    local = local_dag(config, "stable")
    assert results["pipeline.yaml"].tasks == local
    assert set(spec["root"]["dag"]["tasks"]) == set(local) == {
        "CsvExampleGen", "StatisticsGen", "ImportSchemaGen", "ExampleValidator", "DataValidationGate", "Transform",
        "Trainer", "Optimizer", "ServingBaseline", "Evaluator", "Exporter", "Publisher"}
    assert any("evaluation.baseline previous_blessed -> stable" in note for note in results["pipeline.yaml"].notes)


def test_the_yaml_spec_compares_with_the_stable_version_through_serving_baseline(compiled):
    _, results = compiled
    spec = yaml.safe_load(Path(results["pipeline.yaml"].path).read_text())
    tasks = spec["root"]["dag"]["tasks"]
    assert results["pipeline.yaml"].tasks["Evaluator"] == ["CsvExampleGen", "Optimizer", "ServingBaseline"]
    assert tasks["Evaluator"]["inputs"]["artifacts"]["baseline_model"]["taskOutputArtifact"] == {
        "producerTask": "ServingBaseline", "outputArtifactKey": "model"}
    parameters = tasks["ServingBaseline"]["inputs"]["parameters"]
    assert parameters["serving_base_dir"]["runtimeValue"]["constant"] == "gs://bucket/tfx-mlops/serving"
    assert parameters["rule"]["runtimeValue"]["constant"] == "stable"
    # The repository is its input, which KFP's cache cannot see: never reused.
    assert tasks["ServingBaseline"]["cachingOptions"] == {}
    executors = spec["deploymentSpec"]["executors"]
    assert executors["Evaluator_executor"]["container"]["args"][1] == "components.serving_baseline.evaluator.Executor"
    assert not any("resolver" in json.dumps(e) for e in executors.values())


def test_each_task_has_the_configured_resources_retries_and_caching(compiled):
    _, results = compiled
    spec = yaml.safe_load(Path(results["pipeline.yaml"].path).read_text())
    tasks, executors = spec["root"]["dag"]["tasks"], spec["deploymentSpec"]["executors"]

    def resources(task):
        return executors[spec["components"][tasks[task]["componentRef"]["name"]]["executorLabel"]]["container"][
            "resources"]

    assert resources("Trainer") == {"resourceCpuRequest": "500m", "cpuRequest": 0.5, "resourceCpuLimit": "4",
                                    "cpuLimit": 4.0, "resourceMemoryRequest": "2Gi",
                                    "memoryRequest": pytest.approx(2.147483648), "resourceMemoryLimit": "16Gi",
                                    "memoryLimit": pytest.approx(17.179869184)}
    assert resources("Evaluator") == {"resourceCpuRequest": "500m", "cpuRequest": 0.5, "resourceMemoryRequest": "8G",
                                      "memoryRequest": 8.0}
    assert resources("CsvExampleGen") == resources("Publisher") == {
        "resourceCpuRequest": "500m", "cpuRequest": 0.5, "resourceMemoryRequest": "2Gi",
        "memoryRequest": pytest.approx(2.147483648)}
    assert "retryPolicy" not in tasks["Trainer"]
    assert tasks["Evaluator"]["retryPolicy"] == {"maxRetryCount": 2, "backoffDuration": "30s", "backoffFactor": 2.0,
                                                 "backoffMaxDuration": "3600s"}
    assert tasks["Transform"]["retryPolicy"]["backoffDuration"] == "60s"
    assert {name: task["cachingOptions"].get("enableCache", False) for name, task in tasks.items()} == {
        name: name != "ServingBaseline" for name in tasks}
    assert results["pipeline.yaml"].settings["Trainer"]["retries"] == 0


def test_caching_off_and_an_unknown_component_or_quantity(tmp_path):
    off = compile_pipeline(load_config(None, [*KUBEFLOW, "kubeflow.enable_cache=false"]), str(tmp_path / "p.yaml"))
    spec = yaml.safe_load(Path(off.path).read_text())
    assert all(task["cachingOptions"] == {} for task in spec["root"]["dag"]["tasks"].values())
    with pytest.raises(KubeflowError, match="kubeflow.components names Trainr, which this pipeline does not have"):
        compile_pipeline(load_config(None, [*KUBEFLOW, "kubeflow.components.Trainr.cpu_limit=2"]),
                         str(tmp_path / "q.yaml"))
    with pytest.raises(ValueError, match="kubeflow.tasks.memory_limit '4GB' is not a Kubernetes quantity"):
        load_config(None, [*KUBEFLOW, "kubeflow.tasks.memory_limit=4GB"])


def test_every_component_runs_in_the_configured_image_with_the_image_paths(compiled):
    _, results = compiled
    spec = yaml.safe_load(Path(results["pipeline.yaml"].path).read_text())
    executors = spec["deploymentSpec"]["executors"]
    assert len(executors) == 12
    for name, executor in executors.items():
        container = executor["container"]
        assert container["image"] == IMAGE, name
        assert container["command"][:3] == ["python", "-m", "tfx.orchestration.kubeflow.v2.container."
                                            "kubeflow_v2_run_executor"]
    beam_args = executors["Transform_executor"]["container"]["args"]
    assert f"--setup_file={IMAGE_PROJECT_ROOT}/setup.py" in beam_args
    schema = spec["root"]["dag"]["tasks"]["ImportSchemaGen"]["inputs"]["parameters"]["schema_file"]
    assert schema["runtimeValue"]["constant"] == f"{IMAGE_PROJECT_ROOT}/pipeline/configs/taxi_schema.pbtxt"
    assert results["pipeline.yaml"].pipeline_root == "gs://bucket/tfx-mlops/pipelines/taxi"
    publisher = spec["root"]["dag"]["tasks"]["Publisher"]["inputs"]["parameters"]
    assert publisher["serving_base_dir"]["runtimeValue"]["constant"] == "gs://bucket/tfx-mlops/serving"


def test_the_spec_carries_the_runtime_parameters_with_their_defaults(compiled):
    _, results = compiled
    spec = yaml.safe_load(Path(results["pipeline.yaml"].path).read_text())
    parameters = spec["root"]["inputDefinitions"]["parameters"]
    assert parameters == {
        "data_root": {"parameterType": "STRING", "defaultValue": embedded_sample_in_image(), "isOptional": True},
        "train_args": {"parameterType": "STRING", "defaultValue": '{"num_steps": 2000}', "isOptional": True},
    }
    tasks = spec["root"]["dag"]["tasks"]
    assert tasks["CsvExampleGen"]["inputs"]["parameters"]["input_base"] == {"componentInputParameter": "data_root"}
    assert tasks["Trainer"]["inputs"]["parameters"]["train_args"] == {"componentInputParameter": "train_args"}


def test_compiling_twice_gives_the_same_bytes(compiled):
    _, results = compiled
    assert Path(results["pipeline.yaml"].path).read_bytes() == Path(results["again.yaml"].path).read_bytes()


def test_the_vertex_job_keeps_the_blessed_model_baseline(compiled):
    config, results = compiled
    job = json.loads(Path(results["pipeline.json"].path).read_text())
    tasks = results["pipeline.json"].tasks
    assert tasks["Evaluator"] == ["BaselineModelResolver-model-resolver", "CsvExampleGen", "Optimizer"]
    local = local_dag(config, "latest_blessed")
    assert {k: v for k, v in tasks.items() if "Resolver" not in k and k != "Evaluator"} == {
        k: v for k, v in local.items() if "Resolver" not in k and k != "Evaluator"}
    assert job["runtimeConfig"]["gcsOutputDirectory"] == "gs://bucket/tfx-mlops/pipelines/taxi"
    assert job["runtimeConfig"]["parameterValues"]["train_args"] == '{"num_steps": 2000}'


def test_a_local_or_non_gcs_output_root_or_a_local_data_path_is_refused(tmp_path):
    with pytest.raises(KubeflowError, match="kubeflow.output_root must be a bucket"):
        compile_pipeline(load_config(None, [f"kubeflow.output_root={tmp_path}"]), str(tmp_path / "p.yaml"))
    with pytest.raises(KubeflowError, match="only object store where the Publisher can publish model versions"):
        compile_pipeline(load_config(None, ["kubeflow.output_root=s3://b/x", f"kubeflow.image={IMAGE}"]),
                         str(tmp_path / "p.yaml"))
    with pytest.raises(KubeflowError, match="kubeflow.data_path '/data' is not a URI"):
        compile_pipeline(load_config(None, [*KUBEFLOW, "kubeflow.data_path=/data"]), str(tmp_path / "p.yaml"))
    with pytest.raises(KubeflowError, match="must end in .yaml"):
        compile_pipeline(load_config(None, KUBEFLOW), str(tmp_path / "p.txt"))
    # A bundled dataset exists only where a local run wrote it; the image's sample is the taxi data, not iris.
    with pytest.raises(KubeflowError, match=r"data.path sklearn:iris is written on this machine at run time"):
        compile_pipeline(load_config(None, [*KUBEFLOW, "data.path=sklearn:iris"]), str(tmp_path / "p.yaml"))
    assert not (tmp_path / "p.yaml").exists()


def test_submit_starts_a_run_and_prints_its_link(compiled, capsys):
    config, results = compiled
    package = results["pipeline.yaml"].path
    with FakeKfpServer() as kfp:
        code = cli.main(["submit", "kubeflow", "--host", kfp.url, "--package", package, "--run-name", "first",
                         "--param", "train_args={\"num_steps\": 50}", *sum((["--set", o] for o in KUBEFLOW), [])])
        out = capsys.readouterr().out
        assert code == 0, out
        [run] = kfp.runs.values()
        assert f"{kfp.url}/#/runs/details/{run['run_id']}" in out
        assert run["display_name"] == "first"
        assert run["runtime_config"]["parameters"] == {"train_args": '{"num_steps": 50}'}
        assert run["pipeline_spec"] == yaml.safe_load(Path(package).read_text())
        [experiment] = kfp.experiments.values()
        assert experiment["display_name"] == config.kubeflow.experiment
        assert experiment["experiment_id"] == run["experiment_id"]
        # A second run joins the same experiment.
        run_id, link = submit(package, kfp.url, config.kubeflow.experiment, "second", {})
        assert len(kfp.experiments) == 1 and kfp.runs[run_id]["experiment_id"] == experiment["experiment_id"]
        assert link == f"{kfp.url}/#/runs/details/{run_id}"


def test_what_the_api_refuses_is_one_sentence(compiled, capsys):
    _, results = compiled
    with FakeKfpServer() as kfp:
        code = cli.main(["submit", "kubeflow", "--host", kfp.url, "--package", results["pipeline.yaml"].path,
                         "--param", "epochs=3"])
        assert code == 1
        assert "did not take the run" in capsys.readouterr().err
        assert not kfp.runs
    with pytest.raises(KubeflowError, match="takes the .yaml form"):
        submit(results["pipeline.json"].path, "http://127.0.0.1:1", "e", "r", {})
