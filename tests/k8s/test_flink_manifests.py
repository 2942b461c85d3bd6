"""k8s/flink holds together: the job server reaches the REST service the operator makes for the FlinkDeployment, the
SDK worker pool listens where the pipeline's EXTERNAL environment points, the NetworkPolicies name the ports the
Flink configuration fixes and admit no one to the worker pool, and the SDK workers see the pipeline root where the
pipeline's pods do. Whether the API server accepts it all is tests/k8s/test_apply_real.py."""
from __future__ import annotations

import pytest

from settings.config import load_config
from tests.k8s.networkpolicy import Pod, admits
from tests.k8s.render import render

NAMESPACE = "mlops"


@pytest.fixture(scope="module")
def objects() -> dict[str, dict]:
    return {o["kind"] + "/" + o["metadata"]["name"]: o for o in render("k8s/flink")}


def _args(container: dict) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in container.get("args", []) if a.startswith("--"))


def test_the_job_server_submits_to_the_operators_rest_service(objects):
    flink = objects["FlinkDeployment/beam-flink"]
    [server] = objects["Deployment/beam-job-server"]["spec"]["template"]["spec"]["containers"]
    # The flink-kubernetes-operator names the JobManager's REST service <name>-rest (ExternalServiceDecorator).
    rest = f"{flink['metadata']['name']}-rest:{flink['spec']['flinkConfiguration']['rest.port']}"
    assert _args(server)["flink-master"] == rest
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert int(_args(server)["job-port"]) == ports["job"] and int(_args(server)["artifact-port"]) == ports["artifact"]
    service = objects["Service/beam-job-server"]
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)
    assert service["spec"]["selector"].items() <= objects["Deployment/beam-job-server"]["spec"]["template"][
        "metadata"]["labels"].items()


def test_each_taskmanager_has_the_worker_pool_the_external_environment_names(objects):
    flink = objects["FlinkDeployment/beam-flink"]
    spec = flink["spec"]["taskManager"]["podTemplate"]["spec"]
    [pool] = [c for c in spec["containers"] if c["name"] == "beam-worker-pool"]
    port = int(pool["command"][-1].removeprefix("--service_port="))
    assert pool["command"][:3] == ["python", "-m", "apache_beam.runners.worker.worker_pool_main"]
    assert [p["containerPort"] for p in pool["ports"]] == [port]
    # The overrides a user passes (docs/tutorials/beam-runners.md) load into a valid config.
    config = load_config(None, ["beam.runner=flink", "beam.job_endpoint=beam-job-server:8099",
                                "beam.environment_type=EXTERNAL", f"beam.environment_config=localhost:{port}",
                                "output_root=/mlops/outputs",
                                'beam.extra_args=["--artifact_endpoint=beam-job-server:8098"]'])
    assert config.beam.environment_config == f"localhost:{port}"
    assert config.beam.extra_args == ["--artifact_endpoint=beam-job-server:8098"]
    # Two TaskManagers of one slot: parallelism 2, as the local cluster runs.
    assert flink["spec"]["taskManager"]["replicas"] * int(
        flink["spec"]["flinkConfiguration"]["taskmanager.numberOfTaskSlots"]) == int(
        flink["spec"]["flinkConfiguration"]["parallelism.default"])


def test_the_sdk_workers_see_the_pipeline_root_where_the_pipelines_pods_do(objects):
    [tfjob] = [o for o in render("k8s/training/job") if o["kind"] == "TFJob"]
    worker = tfjob["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    spec = objects["FlinkDeployment/beam-flink"]["spec"]["taskManager"]["podTemplate"]["spec"]

    def mount(pod: dict, container: dict) -> tuple[str, str]:
        [volume] = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
        [path] = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == volume["name"]]
        return volume["persistentVolumeClaim"]["claimName"], path

    [pool] = [c for c in spec["containers"] if c["name"] == "beam-worker-pool"]
    assert mount(spec, pool) == mount(worker, worker["containers"][0])


def test_the_policies_admit_flinks_own_traffic_and_no_one_to_the_worker_pool(objects):
    policies = [o for o in objects.values() if o["kind"] == "NetworkPolicy"]
    conf = objects["FlinkDeployment/beam-flink"]["spec"]["flinkConfiguration"]
    jobmanager = Pod(NAMESPACE, {"app.kubernetes.io/name": "beam-flink", "app.kubernetes.io/component": "jobmanager"})
    taskmanager = Pod(NAMESPACE, {"app.kubernetes.io/name": "beam-flink",
                                  "app.kubernetes.io/component": "taskmanager"})
    server = Pod(NAMESPACE, {"app.kubernetes.io/name": "beam-job-server"})
    stranger = Pod("default", {"app.kubernetes.io/name": "anything"})
    # admits(policies, target, source, port)
    assert admits(policies, jobmanager, taskmanager, int(conf["jobmanager.rpc.port"]))
    assert admits(policies, jobmanager, taskmanager, int(conf["blob.server.port"]))
    assert admits(policies, jobmanager, server, int(conf["rest.port"]))
    assert admits(policies, taskmanager, jobmanager, int(conf["taskmanager.rpc.port"]))
    assert admits(policies, taskmanager, taskmanager, int(conf["taskmanager.data.port"]))
    assert not admits(policies, jobmanager, stranger, int(conf["rest.port"]))
    assert not admits(policies, server, stranger, 8099)
    for source in (jobmanager, taskmanager, server, stranger):
        assert not admits(policies, taskmanager, source, 50000)
