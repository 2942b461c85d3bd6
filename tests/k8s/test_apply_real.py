"""Every kustomization under k8s/ applied server-side to a real kube-apiserver (tests/k8s/controlplane.py): the API
server's validation, defaulting, admission (PodSecurity among it), the CRDs' schemas and CEL rules decide whether it
is accepted, and any warning it answers (a Pod Security violation in a namespace that warns on `restricted`, a
deprecated API, a field it drops) fails the test. Each kustomization is applied with `--dry-run=server` onto a
cluster holding only the namespaces: the overlays name the same objects as the base with changes the server
refuses on a live object (a claim's access modes, a Job's template), so each is judged as its first apply."""
from __future__ import annotations

import pytest
import yaml

from tests.k8s.conftest import COMPONENTS, KUSTOMIZATIONS
from tests.k8s.render import REPO, render

# Custom resources outside any kustomization (applied with kubectl create -f).
LOOSE_FILES = ["k8s/kubedl/tfjob.yaml"]


def objects_of(source: str) -> list[dict]:
    if source in LOOSE_FILES:
        return [d for d in yaml.safe_load_all((REPO / source).read_text()) if d]
    return render(source)


def dry_run(plane, objects: list[dict]):
    return plane.kubectl("apply", "--server-side", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(objects),
                         check=False)


def server_warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("Warning:")]


def test_every_kustomization_is_found():
    assert {"k8s/serving/base", "k8s/serving/bootstrap", "k8s/serving/rollout-job", "k8s/serving/monitor",
            "k8s/serving/monitoring", "k8s/kubedl", "k8s/training/job", "k8s/flink"} <= set(KUSTOMIZATIONS)
    assert COMPONENTS == {"k8s/serving/gateway"}


@pytest.mark.parametrize("kustomization", [k for k in KUSTOMIZATIONS if k not in COMPONENTS] + LOOSE_FILES)
def test_the_api_server_accepts_the_kustomization(cluster, kustomization):
    objects = [o for o in objects_of(kustomization) if o["kind"] != "Namespace"]
    assert objects, kustomization
    result = dry_run(cluster, objects)
    assert result.returncode == 0, f"the API server refused {kustomization}:\n{result.stderr}"
    assert not server_warnings(result.stderr), f"the API server warned on {kustomization}:\n{result.stderr}"
    applied = [line for line in result.stdout.splitlines() if "serverside-applied" in line]
    assert len(applied) == len(objects), result.stdout


def test_a_pod_the_restricted_standard_refuses_is_refused(cluster):
    """The PodSecurity admission of the fixture's namespaces is on: a root pod is refused, not accepted."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "root", "namespace": "mlops-serving"},
           "spec": {"containers": [{"name": "c", "image": "busybox", "securityContext": {"runAsUser": 0}}]}}
    result = dry_run(cluster, [pod])
    assert result.returncode != 0 and 'violates PodSecurity "restricted:latest"' in result.stderr, result.stderr


def test_a_route_the_gateway_api_cel_rules_refuse_is_refused(cluster):
    """The CRDs' CEL rules run: an HTTPRoute whose backend weights are fine but whose path match is a bad prefix."""
    route = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
             "metadata": {"name": "bad", "namespace": "mlops-serving"},
             "spec": {"rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "no-leading-slash"}}]}]}}
    result = dry_run(cluster, [route])
    assert result.returncode != 0 and "The HTTPRoute \"bad\" is invalid" in result.stderr, \
        result.stderr


@pytest.mark.parametrize("kind, mutate, refusal", [
    ("HTTPRoute", lambda o: o["spec"]["rules"][0]["backendRefs"][0].update(wieght=5),
     ".wieght: field not declared in schema"),
    ("HTTPRoute", lambda o: o["spec"]["rules"][0]["backendRefs"][0].update(weight="50%"),
     ".weight: expected numeric (int or float), got string"),
    ("GRPCRoute", lambda o: o["spec"]["rules"][0].update(backendRef=[]), ".backendRef: field not declared in schema"),
    ("Inference", lambda o: o["spec"]["predictors"][0].update(trafficWieght=10),
     ".trafficWieght: field not declared in schema"),
    ("Inference", lambda o: o["spec"]["predictors"][0].pop("name"), "spec.predictors[0].name: Required value"),
    ("ModelVersion", lambda o: o["spec"].update(modelNmae="taxi"), ".modelNmae: field not declared in schema"),
    ("TFJob", lambda o: o["spec"].update(cleanPodPolicey="All"), ".cleanPodPolicey: field not declared in schema"),
    ("FlinkDeployment", lambda o: o["spec"]["taskManager"].update(replica=2), ".replica: field not declared in schema"),
    ("FlinkDeployment", lambda o: o["spec"].update(flinkVersion="v1_21"),
     'spec.flinkVersion: Unsupported value: "v1_21"'),
    ("FlinkDeployment", lambda o: o["spec"]["flinkConfiguration"].update({"taskmanager.numberOfTaskSlots": 1}),
     ".flinkConfiguration.taskmanager.numberOfTaskSlots: expected string"),
    ("Deployment", lambda o: o["spec"]["template"]["spec"].update(serviceAcountName="tfserving"),
     ".serviceAcountName: field not declared in schema"),
])
def test_a_misspelled_or_mistyped_field_is_refused(cluster, kind, mutate, refusal):
    """The server's strict field validation and the CRDs' schemas refuse what a typo makes of a manifest."""
    sources = [k for k in KUSTOMIZATIONS if k not in COMPONENTS] + LOOSE_FILES
    obj = next(o for source in sources for o in objects_of(source) if o["kind"] == kind)
    assert dry_run(cluster, [obj]).returncode == 0
    mutate(obj)
    result = dry_run(cluster, [obj])
    assert result.returncode != 0 and refusal in result.stderr, f"the broken {kind}: {result.stderr}"


RESTRICTED_FLINK_NAMESPACE = "flink-restricted"


def flink_pods() -> dict[str, dict]:
    """The JobManager's and TaskManagers' pods as the flink-kubernetes-operator makes them from k8s/flink's
    FlinkDeployment: each role's podTemplate, with the image put into the container it names flink-main-container
    (the operator's own settings it merges in are ports, resources, env and configMap volumes, none of which the
    Pod Security Standards restrict)."""
    [deployment] = [o for o in render("k8s/flink") if o["kind"] == "FlinkDeployment"]
    pods = {}
    for role in ("jobManager", "taskManager"):
        template = deployment["spec"][role]["podTemplate"]
        spec = {**template["spec"], "serviceAccountName": deployment["spec"]["serviceAccount"]}
        for container in spec["containers"]:
            if container["name"] == "flink-main-container":
                container["image"] = deployment["spec"]["image"]
        metadata = {"name": f"beam-flink-{role.lower()}", "namespace": deployment["metadata"]["namespace"],
                    "labels": template["metadata"]["labels"]}
        pods[role] = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    return pods


@pytest.mark.parametrize("role", ["jobManager", "taskManager"])
def test_the_flink_pods_meet_the_restricted_standard(cluster, role):
    """PodSecurity judges a custom resource's pod templates only once its operator creates the pods: the API server
    admits k8s/flink's JobManager and TaskManager pods (the latter with the SDK worker pool beside Flink) in a
    namespace that enforces `restricted` (theirs, `mlops`, does not: KubeDL's injected init container needs that),
    and refuses them with the worker pool's root user put back."""
    cluster.namespace(RESTRICTED_FLINK_NAMESPACE)
    # The ServiceAccount admission plugin looks the pods' account up: it is created for real.
    [account] = [o for o in render("k8s/flink") if o["kind"] == "ServiceAccount"]
    account["metadata"]["namespace"] = RESTRICTED_FLINK_NAMESPACE
    cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(account))
    pod = flink_pods()[role]
    pod["metadata"]["namespace"] = RESTRICTED_FLINK_NAMESPACE
    result = dry_run(cluster, [pod])
    assert result.returncode == 0 and not server_warnings(result.stderr), result.stderr
    pod["spec"]["containers"][-1]["securityContext"].pop("runAsNonRoot")
    pod["spec"]["containers"][-1]["securityContext"]["runAsUser"] = 0
    pod["spec"]["securityContext"].pop("runAsNonRoot")
    result = dry_run(cluster, [pod])
    assert result.returncode != 0 and 'violates PodSecurity "restricted:latest"' in result.stderr, result.stderr
