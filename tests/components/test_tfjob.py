"""The TFJob backend without a cluster: the objects it builds against the operators' published CRD schemas
(tests/fixtures/crds), and its wait loop against a fake CustomObjectsApi."""
import copy
from pathlib import Path

import jsonschema
import kubernetes.client
import pytest
import yaml
from kubernetes.client.rest import ApiException

from components.distributed.executor import run_distributed_training, tfjob_name
from components.distributed.spec import WorkerSpec
from components.distributed.tfjob import APIS, TFJobFailedError, build_tfjob, run_tfjob
from settings.config import load_config
from tests.k8s.crds import crd_schema

PRIMITIVES = {"str": {"type": "string"}, "int": {"type": "integer"}, "bool": {"type": "boolean"},
              "float": {"type": "number"}, "datetime": {"type": "string"}, "date": {"type": "string"}, "object": {}}


def _required(model: type) -> list[str]:
    """Fields the client's model refuses to leave empty (its setters raise on None under client-side validation)."""
    instance = model.__new__(model)
    instance.local_vars_configuration = kubernetes.client.Configuration()
    required = []
    for attribute in model.openapi_types:
        try:
            setattr(instance, attribute, None)
        except ValueError:
            required.append(model.attribute_map[attribute])
    return required


def _type_schema(name: str, defs: dict) -> dict:
    if name in PRIMITIVES:
        return PRIMITIVES[name]
    if name.startswith("list["):
        return {"type": "array", "items": _type_schema(name[5:-1], defs)}
    if name.startswith("dict("):
        return {"type": "object", "additionalProperties": _type_schema(name[5:-1].split(", ", 1)[1], defs)}
    if name not in defs:
        model = getattr(kubernetes.client, name)
        defs[name] = {}  # reserved before recursing: models refer to themselves (JSONSchemaProps and the like)
        defs[name] = {
            "type": "object",
            "additionalProperties": False,
            "required": _required(model),
            "properties": {model.attribute_map[a]: _type_schema(t, defs) for a, t in model.openapi_types.items()},
        }
    return {"$ref": f"#/$defs/{name}"}


# The CRDs type these as plain strings; the values are those the operators' Go API defines (kubeflow/training-operator
# pkg/apis/kubeflow.org/v1: TFReplicaType, RestartPolicy, CleanPodPolicy; KubeDL uses the same ones).
REPLICA_TYPES = ["Chief", "Master", "PS", "Worker", "Evaluator"]
RESTART_POLICIES = ["Always", "OnFailure", "Never", "ExitCode"]
CLEAN_POD_POLICIES = ["All", "Running", "None"]


def tfjob_schema(operator: str) -> dict:
    """The operator's published TFJob CRD schema (tests/fixtures/crds), unknown fields refused, the job's metadata
    from the Kubernetes client's ObjectMeta model, and the enums of the operator's Go API."""
    group, version = APIS[operator]
    schema = crd_schema(group, "TFJob", version)
    schema["$defs"] = {}
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    schema["properties"].update(apiVersion={"const": f"{group}/{version}"}, kind={"const": "TFJob"},
                                metadata=_type_schema("V1ObjectMeta", schema["$defs"]))
    spec = schema["properties"]["spec"]
    replica_specs = spec["properties"]["tfReplicaSpecs"]
    replica_specs["propertyNames"] = {"enum": REPLICA_TYPES}
    replica_specs["additionalProperties"]["properties"]["restartPolicy"]["enum"] = RESTART_POLICIES
    run_policy = spec["properties"]["runPolicy"] if operator == "kubeflow" else spec  # KubeDL keeps it inline
    run_policy["properties"]["cleanPodPolicy"]["enum"] = CLEAN_POD_POLICIES
    return schema


@pytest.fixture(scope="module")
def schemas():
    return {operator: tfjob_schema(operator) for operator in ("kubeflow", "kubedl")}


def settings(tmp_path, *overrides):
    config = load_config(None, ["training.backend=tfjob", f"output_root={tmp_path}", *overrides])
    return config.resolved_training()


def validate(schema, job):
    jsonschema.Draft202012Validator(schema).validate(job)


def test_kubeflow_job_for_four_workers_matches_the_crd(tmp_path, schemas):
    training = settings(tmp_path, "training.workers=4", "training.tfjob.image=registry.example/tfx-mlops:1")
    job = build_tfjob("trainer-abc", f"{tmp_path}/spec.json", 4, training.tfjob)
    validate(schemas["kubeflow"], job)
    assert job["apiVersion"] == "kubeflow.org/v1"
    worker = job["spec"]["tfReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 4 and worker["restartPolicy"] == "ExitCode"
    assert job["spec"]["runPolicy"] == {"cleanPodPolicy": "Running", "backoffLimit": 3, "activeDeadlineSeconds": 7200}
    pod = worker["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"] == "tensorflow", "the operator sets TF_CONFIG on the container named tensorflow"
    assert container["command"] == ["python", "-m", "components.distributed.worker", f"{tmp_path}/spec.json"]
    assert container["image"] == "registry.example/tfx-mlops:1"
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "2Gi"}
    assert container["volumeMounts"] == [{"name": "pipeline-root", "mountPath": str(tmp_path)}]
    assert pod["volumes"][0]["persistentVolumeClaim"] == {"claimName": "mlops-pipeline-root"}
    assert pod["serviceAccountName"] == "mlops-trainer"
    # What the restricted Pod Security Standard asks of a pod, as the image's own user.
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def test_kubedl_job_records_a_model_version(tmp_path, schemas):
    training = settings(tmp_path, "training.tfjob.operator=kubedl", "training.tfjob.model_version_name=taxi",
                        "training.tfjob.model_image_repo=registry.example/taxi-model",
                        "training.tfjob.model_nfs_server=10.0.0.5", "training.tfjob.model_nfs_path=/exports/models")
    job = build_tfjob("trainer-abc", "/x/spec.json", 2, training.tfjob)
    validate(schemas["kubedl"], job)
    assert job["apiVersion"] == "training.kubedl.io/v1alpha1"
    assert job["spec"]["cleanPodPolicy"] == "Running", "KubeDL keeps the run policy inline"
    assert job["spec"]["modelVersion"]["modelName"] == "taxi"
    assert job["spec"]["modelVersion"]["storage"]["nfs"]["mountPath"] == "/kubedl-model"
    with pytest.raises(jsonschema.ValidationError):
        validate(schemas["kubeflow"], job)


def _set(job, path, value):
    node = job
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


WORKER_POD = ("spec", "tfReplicaSpecs", "Worker", "template", "spec")


@pytest.mark.parametrize(
    "path, value",
    [
        (("spec", "runPolicy", "cleanPodPolicey"), "All"),  # misspelled key
        (("spec", "runPolicy", "cleanPodPolicy"), "OnCompletion"),  # not a policy
        (("spec", "tfReplicaSpecs", "Worker", "restartPolicy"), "OnFailed"),
        (("spec", "tfReplicaSpecs", "Worker", "replicas"), "2"),
        (("spec", "tfReplicaSpecs", "Workers"), {"replicas": 1, "template": {"spec": {"containers": []}}}),
        ((*WORKER_POD, "containers", 0, "imagePullPolice"), "Always"),
        ((*WORKER_POD, "containers", 0, "resources", "limit"), {"cpu": "1"}),
        ((*WORKER_POD, "serviceAccount_name"), "x"),
        ((*WORKER_POD, "securityContext", "runAsNonRot"), True),
        ((*WORKER_POD, "containers", 0, "securityContext", "allowPrivilegeEscalaton"), False),
        (("spec", "tfReplicaSpecs", "Worker", "template", "metadata", "generateName"), "x-"),
        (("spec", "replicaSpecs"), {}),
    ],
)
def test_a_broken_field_fails_validation(tmp_path, schemas, path, value):
    job = build_tfjob("trainer-abc", "/x/spec.json", 2, settings(tmp_path).tfjob)
    validate(schemas["kubeflow"], job)
    broken = copy.deepcopy(job)
    _set(broken, path, value)
    with pytest.raises(jsonschema.ValidationError):
        validate(schemas["kubeflow"], broken)


def test_a_container_without_its_required_name_fails(tmp_path, schemas):
    job = build_tfjob("trainer-abc", "/x/spec.json", 2, settings(tmp_path).tfjob)
    del job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"]
    with pytest.raises(jsonschema.ValidationError, match="'name' is a required property"):
        validate(schemas["kubeflow"], job)


class FakeCustomObjectsApi:
    """Plays the training operator: serves one status per read, in order, the last one for good."""

    def __init__(self, statuses, create_error=None):
        self.statuses = list(statuses)
        self.create_error = create_error
        self.created, self.deleted, self.reads = [], [], 0

    def create_namespaced_custom_object(self, group, version, namespace, plural, body):
        assert plural == "tfjobs"
        assert (f"{group}/{version}", namespace) == (body["apiVersion"], body["metadata"]["namespace"])
        if self.create_error:
            raise ApiException(status=self.create_error, reason="fake")
        self.created.append(copy.deepcopy(body))
        self.job = copy.deepcopy(body)
        return body

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        status = self.statuses[min(self.reads, len(self.statuses) - 1)]
        self.reads += 1
        return {**getattr(self, "job", {"metadata": {"name": name}}), **({"status": status} if status else {})}

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name, body=None):
        self.deleted.append((namespace, name, body.propagation_policy))


def condition(kind, message="", status="True"):
    return {"type": kind, "status": status, "reason": f"TFJob{kind}", "message": message,
            "lastUpdateTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}


def running(active, succeeded=0):
    return {"conditions": [condition("Created"), condition("Running")],
            "replicaStatuses": {"Worker": {"active": active, "succeeded": succeeded}}}


@pytest.fixture
def job(tmp_path, schemas):
    built = build_tfjob("trainer-abc", "/x/spec.json", 2, settings(tmp_path).tfjob)
    validate(schemas["kubeflow"], built)
    return built


def test_waits_for_success_reporting_replica_status(job, schemas):
    succeeded = {"conditions": [condition("Created"), condition("Running", status="False"), condition("Succeeded")],
                 "replicaStatuses": {"Worker": {"succeeded": 2}}}
    statuses = [None, {"conditions": [condition("Created")]}, running(2), running(2), running(1, 1), succeeded]
    for status in filter(None, statuses):
        validate(schemas["kubeflow"], {**job, "status": status})  # the fake speaks the CRD's status too
    api, lines, sleeps = FakeCustomObjectsApi(statuses), [], []
    finished = run_tfjob(api, job, 5.0, 600, lines.append, sleep=sleeps.append)
    assert api.created == [job]
    assert finished["status"] == succeeded
    assert lines == [
        "created TFJob mlops/trainer-abc with 2 workers",
        "TFJob mlops/trainer-abc: state pending",
        "TFJob mlops/trainer-abc: state Created",
        "TFJob mlops/trainer-abc: Worker: 2 active, 0 succeeded, 0 failed; state Running",
        "TFJob mlops/trainer-abc: Worker: 1 active, 1 succeeded, 0 failed; state Running",
        "TFJob mlops/trainer-abc: Worker: 0 active, 2 succeeded, 0 failed; state Succeeded",
    ]
    assert sleeps == [5.0] * 5 and not api.deleted


def test_a_failed_job_fails_with_its_conditions(job):
    failed = {"conditions": [condition("Created"), condition("Running", status="False"),
                             condition("Failed", "TFJob trainer-abc has failed because 1 Worker replica(s) failed.")],
              "replicaStatuses": {"Worker": {"active": 1, "failed": 1}}}
    api = FakeCustomObjectsApi([running(2), failed])
    with pytest.raises(TFJobFailedError) as error:
        run_tfjob(api, job, 1.0, 600, lambda line: None, sleep=lambda s: None)
    message = str(error.value)
    assert "TFJob mlops/trainer-abc failed: " in message
    assert "Failed=True (TFJobFailed: TFJob trainer-abc has failed because 1 Worker replica(s) failed.)" in message
    assert "kubectl -n mlops logs -l app.kubernetes.io/instance=trainer-abc" in message


def test_a_retried_trainer_reattaches_to_its_job(job):
    api = FakeCustomObjectsApi([running(2), {"conditions": [condition("Succeeded")]}], create_error=409)
    lines = []
    run_tfjob(api, job, 1.0, 600, lines.append, sleep=lambda s: None)
    assert lines[0] == "TFJob mlops/trainer-abc exists already (a retried Trainer); waiting for it"


@pytest.mark.parametrize("code, expected", [(404, "install the operator"), (403, "not allowed to create"),
                                            (500, "creating TFJob mlops/trainer-abc failed: 500")])
def test_creation_errors_say_what_to_do(job, code, expected):
    with pytest.raises(TFJobFailedError, match=expected):
        run_tfjob(FakeCustomObjectsApi([], create_error=code), job, 1.0, 600, lambda line: None)


def test_a_job_that_runs_too_long_is_deleted(job):
    api, now = FakeCustomObjectsApi([running(2)]), [0.0]

    def sleep(seconds):
        now[0] += seconds

    with pytest.raises(TFJobFailedError, match="did not finish within 30s and was deleted"):
        run_tfjob(api, job, 10.0, 30, lambda line: None, sleep=sleep, clock=lambda: now[0])
    assert api.deleted == [("mlops", "trainer-abc", "Foreground")]


def test_ctrl_c_deletes_the_job(job):
    api = FakeCustomObjectsApi([running(2)])

    def interrupted(seconds):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_tfjob(api, job, 1.0, 600, lambda line: None, sleep=interrupted)
    assert api.deleted == [("mlops", "trainer-abc", "Foreground")]


def test_the_executor_path_writes_the_spec_where_the_pods_read_it(tmp_path, schemas):
    """run_distributed_training with the TFJob backend: spec on the shared volume, one job, its command naming it."""
    training = settings(tmp_path, "training.workers=2")
    model_run = tmp_path / "pipelines" / "taxi" / "Trainer" / "model_run" / "7"
    spec = WorkerSpec(run_fn="components.model.run_fn", train_files=["t/*"], eval_files=["e/*"],
                      serving_model_dir=str(tmp_path / "model" / "Format-Serving"), model_run_dir=str(model_run))
    api, lines = FakeCustomObjectsApi([running(2), {"conditions": [condition("Succeeded")]}]), []
    training.tfjob.poll_seconds = 0.01
    where = run_distributed_training(spec, training, tfjob_name(str(model_run)), lambda i, line: lines.append(line),
                                     tfjob_api=api)
    (created,) = api.created
    validate(schemas["kubeflow"], created)
    spec_path = model_run / "workers" / "spec.json"
    assert created["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"][-1] == str(
        spec_path)
    assert WorkerSpec.load(str(spec_path)) == spec
    assert where == f"TFJob mlops/{created['metadata']['name']}"
    assert created["metadata"]["name"] == tfjob_name(str(model_run)), "the same name when TFX retries"


K8S_TRAINING = Path(__file__).parent.parent.parent / "k8s" / "training"
KINDS = {"Namespace": "V1Namespace", "ServiceAccount": "V1ServiceAccount", "Role": "V1Role",
         "RoleBinding": "V1RoleBinding", "PersistentVolumeClaim": "V1PersistentVolumeClaim",
         "PersistentVolume": "V1PersistentVolume"}


def manifests(folder: Path) -> list[dict]:
    """The objects a kustomization lists (resources that are folders are followed), as kubectl apply -k reads them."""
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    objects = []
    for resource in kustomization["resources"]:
        path = folder / resource
        assert path.exists(), f"{folder}/kustomization.yaml lists {resource}, which does not exist"
        objects += manifests(path) if path.is_dir() else [o for o in yaml.safe_load_all(path.read_text()) if o]
    return objects


@pytest.mark.parametrize("folder", ["", "overlays/kind"])
def test_the_once_only_manifests_match_the_kubernetes_models(folder):
    objects = manifests(K8S_TRAINING / folder)
    assert {o["kind"] for o in objects} >= {"Namespace", "ServiceAccount", "Role", "RoleBinding",
                                            "PersistentVolumeClaim"}
    for obj in objects:
        defs = {}
        ref = _type_schema(KINDS[obj["kind"]], defs)
        jsonschema.Draft202012Validator({**ref, "$defs": defs}).validate(obj)
    role = next(o for o in objects if o["kind"] == "Role")
    tfjob_rule = next(r for r in role["rules"] if "tfjobs" in r["resources"])
    assert {"create", "get", "delete"} <= set(tfjob_rule["verbs"]), "what run_tfjob calls"
    assert set(tfjob_rule["apiGroups"]) == {"kubeflow.org", "training.kubedl.io"}


def test_the_tfjob_template_is_what_the_code_builds(schemas):
    (template,) = manifests(K8S_TRAINING / "job")
    validate(schemas["kubeflow"], template)
    training = load_config(None, ["training.backend=tfjob", "output_root=/mlops/outputs"]).resolved_training()
    command = template["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"]
    built = build_tfjob(template["metadata"]["name"], command[-1], 2, training.tfjob)
    assert template["spec"] == built["spec"], "the template drifted from components/distributed/tfjob.py"
    assert template["metadata"]["labels"] == built["metadata"]["labels"]
