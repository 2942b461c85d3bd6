"""Training as a Kubernetes TFJob: N Worker replicas of the project's image running the same worker entry point.

Kubeflow's training operator serves `kubeflow.org/v1` TFJobs and KubeDL `training.kubedl.io/v1alpha1` ones; both
set TF_CONFIG in every pod (on the container named `tensorflow`), restart failed pods by the replica's restart
policy, and report `status.conditions` and `status.replicaStatuses`. The pods mount the volume holding the pipeline
root where the Trainer sees it, so the artifact paths in the worker spec mean the same inside them.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kubernetes import client

from settings.config import TFJobConfig
from settings.errors import UserError

# operator -> (API group, version)
APIS = {"kubeflow": ("kubeflow.org", "v1"), "kubedl": ("training.kubedl.io", "v1alpha1")}
PLURAL = "tfjobs"
# Both operators inject TF_CONFIG into, and open the port on, the container with this name.
CONTAINER_NAME = "tensorflow"
PORT_NAME = "tfjob-port"
PORT = 2222
VOLUME_NAME = "pipeline-root"
KUBEDL_MODEL_MOUNT = "/kubedl-model"
FINISHED = ("Succeeded", "Failed")
# The project image's user (Dockerfile USER): pods run as it; fsGroup makes the pipeline-root volume writable for it
# where the volume supports ownership management. With the container settings below the pod meets the restricted Pod
# Security Standard.
IMAGE_USER_ID = 10001


class TFJobFailedError(UserError, RuntimeError):
    """The TFJob failed, could not be created, or did not finish in time; the message says what to do."""

    exit_code = 1
    prefix = "training failed"


def _quantities(settings: TFJobConfig) -> dict[str, str]:
    return {"cpu": settings.cpu, "memory": settings.memory}


def worker_pod_template(spec_path: str, settings: TFJobConfig, labels: dict[str, str]) -> dict[str, Any]:
    """The pod each Worker replica runs, built with the Kubernetes client's models and serialized as the API wants."""
    container = client.V1Container(
        name=CONTAINER_NAME,
        image=settings.image,
        image_pull_policy=settings.image_pull_policy,
        command=["python", "-m", "components.distributed.worker", spec_path],
        ports=[client.V1ContainerPort(name=PORT_NAME, container_port=PORT)],
        resources=client.V1ResourceRequirements(requests=_quantities(settings), limits=_quantities(settings)),
        volume_mounts=[client.V1VolumeMount(name=VOLUME_NAME, mount_path=settings.mount_path)],
        security_context=client.V1SecurityContext(
            allow_privilege_escalation=False, capabilities=client.V1Capabilities(drop=["ALL"])),
    )
    pod = client.V1PodTemplateSpec(
        # Istio's sidecar would keep a finished worker's pod running; both operators' docs ask to turn it off.
        metadata=client.V1ObjectMeta(labels=labels, annotations={"sidecar.istio.io/inject": "false"}),
        spec=client.V1PodSpec(
            containers=[container],
            service_account_name=settings.service_account,
            security_context=client.V1PodSecurityContext(
                run_as_non_root=True, run_as_user=IMAGE_USER_ID, run_as_group=IMAGE_USER_ID, fs_group=IMAGE_USER_ID,
                seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault")),
            volumes=[client.V1Volume(
                name=VOLUME_NAME,
                persistent_volume_claim=client.V1PersistentVolumeClaimVolumeSource(claim_name=settings.pvc),
            )],
        ),
    )
    return client.ApiClient().sanitize_for_serialization(pod)


def build_tfjob(name: str, spec_path: str, workers: int, settings: TFJobConfig) -> dict[str, Any]:
    """The TFJob object for `workers` Worker replicas running `python -m components.distributed.worker spec_path`.

    `settings` is the `training.tfjob` section of the config (with mount_path resolved).
    """
    group, version = APIS[settings.operator]
    # The instance label selects this job's pods under either operator: kubectl logs -l app.kubernetes.io/instance=.
    labels = {"app.kubernetes.io/part-of": "tfx-mlops", "app.kubernetes.io/component": "trainer",
              "app.kubernetes.io/instance": name}
    run_policy = {
        "cleanPodPolicy": settings.clean_pod_policy,
        "backoffLimit": settings.backoff_limit,
        "activeDeadlineSeconds": settings.active_deadline_seconds,
    }
    spec: dict[str, Any] = {
        "tfReplicaSpecs": {
            "Worker": {
                "replicas": workers,
                "restartPolicy": settings.restart_policy,
                "template": worker_pod_template(spec_path, settings, labels),
            }
        }
    }
    if settings.operator == "kubeflow":
        spec["runPolicy"] = run_policy
    else:
        # KubeDL keeps the run policy fields inline in the spec.
        spec.update(run_policy)
        if settings.model_version_name:
            spec["modelVersion"] = {
                "modelName": settings.model_version_name,
                "imageRepo": settings.model_image_repo,
                # KubeDL mounts this NFS export at KUBEDL_MODEL_MOUNT; the chief copies its SavedModel there.
                "storage": {"nfs": {"server": settings.model_nfs_server, "path": settings.model_nfs_path,
                                    "mountPath": KUBEDL_MODEL_MOUNT}},
            }
    return {
        "apiVersion": f"{group}/{version}",
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": settings.namespace, "labels": labels},
        "spec": spec,
    }


def custom_objects_api(kubeconfig: str = "") -> client.CustomObjectsApi:
    """The API client: the in-cluster service account when running in a pod, else a kubeconfig file."""
    from kubernetes import config

    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig)
    else:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
    return client.CustomObjectsApi()


def replica_summary(status: dict[str, Any]) -> str:
    """One line: each replica type's active/succeeded/failed pods and the job's latest condition."""
    parts = []
    for kind, counts in sorted((status.get("replicaStatuses") or {}).items()):
        parts.append(f"{kind}: {counts.get('active', 0)} active, {counts.get('succeeded', 0)} succeeded, "
                     f"{counts.get('failed', 0)} failed")
    conditions = status.get("conditions") or []
    parts.append(f"state {conditions[-1]['type']}" if conditions else "state pending")
    return "; ".join(parts)


def finished_condition(status: dict[str, Any]) -> dict[str, Any] | None:
    """The Succeeded or Failed condition that is true, if the job has finished."""
    for condition in reversed(status.get("conditions") or []):
        if condition.get("type") in FINISHED and condition.get("status") == "True":
            return condition
    return None


def _describe_conditions(status: dict[str, Any]) -> str:
    return "; ".join(
        f"{c.get('type')}={c.get('status')} ({c.get('reason', '')}: {c.get('message', '')})"
        for c in status.get("conditions") or []
    ) or "no conditions reported"


def run_tfjob(
    api: client.CustomObjectsApi,
    job: dict[str, Any],
    poll_seconds: float,
    timeout_seconds: float,
    report: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Creates `job` (or re-attaches to it when a retried Trainer finds it), waits for Succeeded or Failed, reports
    replica status whenever it changes, and returns the finished object. Raises TFJobFailedError.

    A job that is interrupted (Ctrl-C, timeout) is deleted, so that no worker pod is left running.
    """
    from kubernetes.client.rest import ApiException

    group, version = job["apiVersion"].split("/")
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    where = f"TFJob {namespace}/{name}"
    try:
        api.create_namespaced_custom_object(group, version, namespace, PLURAL, job)
        report(f"created {where} with {job['spec']['tfReplicaSpecs']['Worker']['replicas']} workers")
    except ApiException as error:
        if error.status == 409:
            report(f"{where} exists already (a retried Trainer); waiting for it")
        elif error.status == 404:
            raise TFJobFailedError(f"the cluster serves no {PLURAL}.{group}/{version} in namespace {namespace}; "
                                   "install the operator and apply k8s/training (docs/tutorials/kubeflow.md)."
                                   ) from None
        elif error.status == 403:
            raise TFJobFailedError(f"not allowed to create {PLURAL}.{group} in namespace {namespace}; apply "
                                   "k8s/training (its Role lets the mlops-trainer account do it).") from None
        else:
            raise TFJobFailedError(f"creating {where} failed: {error.status} {error.reason}.") from None

    deadline = clock() + timeout_seconds
    last = None
    try:
        while True:
            current = api.get_namespaced_custom_object(group, version, namespace, PLURAL, name)
            status = current.get("status") or {}
            line = replica_summary(status)
            if line != last:
                report(f"{where}: {line}")
                last = line
            done = finished_condition(status)
            if done is not None and done["type"] == "Succeeded":
                return current
            if done is not None:
                raise TFJobFailedError(f"{where} failed: {_describe_conditions(status)}. Read the workers' logs with "
                                       f"kubectl -n {namespace} logs -l app.kubernetes.io/instance={name}.")
            if clock() > deadline:
                raise TimeoutError
            sleep(poll_seconds)
    except TimeoutError:
        _delete(api, group, version, namespace, name, report)
        raise TFJobFailedError(f"{where} did not finish within {timeout_seconds:.0f}s and was deleted; raise "
                               "training.tfjob.active_deadline_seconds or lower training.train_steps.") from None
    except KeyboardInterrupt:
        _delete(api, group, version, namespace, name, report)
        raise


def _delete(api: client.CustomObjectsApi, group: str, version: str, namespace: str, name: str,
            report: Callable[[str], None]) -> None:
    api.delete_namespaced_custom_object(group, version, namespace, PLURAL, name,
                                        body=client.V1DeleteOptions(propagation_policy="Foreground"))
    report(f"deleted TFJob {namespace}/{name} and its pods")
