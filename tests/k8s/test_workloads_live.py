"""The base's Deployments and the rollout Job applied for real, in a copy of their namespace: the real
kube-controller-manager makes their ReplicaSets and Pods, and the API server admits each Pod under the restricted Pod
Security Standard the namespace enforces (a Pod it refuses leaves a FailedCreate event and no Pod). No kubelet runs,
so the Pods stay Pending."""
from __future__ import annotations

import json
import time

import yaml

from tests.k8s.render import render

NAMESPACE = "mlops-serving-live"
TIMEOUT_S = 120


def moved(objects: list[dict], namespace: str) -> list[dict]:
    """The objects with their namespace renamed (the Namespace object itself too, labels kept)."""
    out = []
    for obj in objects:
        if obj["kind"] == "Namespace":
            obj["metadata"]["name"] = namespace
        elif "namespace" in obj["metadata"]:
            obj["metadata"]["namespace"] = namespace
        for subject in obj.get("subjects", []):
            subject["namespace"] = namespace
        out.append(obj)
    return out


def test_the_servers_and_the_rollout_jobs_pods_are_admitted(cluster):
    objects = moved(render("k8s/serving/base") + render("k8s/serving/rollout-job"), NAMESPACE)
    namespace = [o for o in objects if o["kind"] == "Namespace"]
    assert namespace[0]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(namespace))
    cluster.wait_for("serviceaccount", "default", NAMESPACE)
    rest = [o for o in objects if o["kind"] != "Namespace"]
    cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(rest))
    owners = {(o["kind"], o["metadata"]["name"]) for o in rest if o["kind"] in ("Deployment", "Job")}
    assert len(owners) == 3, owners
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        pods = json.loads(cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json").stdout)["items"]
        made = {_owner(p) for p in pods}
        if owners <= made:
            break
        if time.monotonic() > deadline:
            events = cluster.kubectl("get", "events", "-n", NAMESPACE, "--field-selector=reason=FailedCreate",
                                     "-o", "custom-columns=OBJECT:.involvedObject.name,MESSAGE:.message").stdout
            raise AssertionError(f"no pod of {sorted(owners - made)} after {TIMEOUT_S} s; FailedCreate:\n{events}")
        time.sleep(1)
    for pod in pods:
        spec = pod["spec"]
        # Admission's defaults: the token stays unmounted where the manifests say so; the controller's Job has one.
        mounted = any(v["name"].startswith("kube-api-access") for v in spec.get("volumes", []))
        assert mounted == (spec.get("serviceAccountName") == "rollout-controller"), pod["metadata"]["name"]


def _owner(pod: dict) -> tuple[str, str]:
    """The Deployment or Job a pod belongs to (a ReplicaSet's name is its Deployment's plus a hash)."""
    [reference] = pod["metadata"]["ownerReferences"]
    if reference["kind"] == "ReplicaSet":
        return "Deployment", reference["name"].rsplit("-", 1)[0]
    return reference["kind"], reference["name"]
