"""What the manifests say about the accounts that call the API, beyond what the authorizer decides (that is
tests/k8s/test_rbac_authorizer.py, against a real kube-apiserver): the rollout Job runs the controller as its
account, and the calls read from rollout/kube.py are the ones the backends make."""
from __future__ import annotations

from tests.k8s.kube_calls import api_calls
from tests.k8s.render import render


def test_the_rollout_job_runs_the_controller_as_that_account():
    objects = render("k8s/serving/rollout-job")
    [job] = [o for o in objects if o["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "rollout-controller" and pod["automountServiceAccountToken"] is True
    assert job["metadata"]["name"] == "rollout-v2"
    [container] = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    args = [a.replace("$(ROLLOUT_VERSION)", env["ROLLOUT_VERSION"]) for a in container["args"]]
    assert args[:4] == ["rollout", "start", "--version", "2"] and "rollout.backend=kubernetes" in args
    # Its pods carry the label the servers' NetworkPolicy admits.
    assert job["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == "rollout-controller"


def test_the_calls_read_from_the_code_are_the_ones_it_makes():
    calls = api_calls("KubernetesBackend")
    assert ("", "configmaps", "update") in calls and ("gateway.networking.k8s.io", "httproutes", "update") in calls
    assert ("", "pods", "list") in calls and ("", "pods/proxy", "get") not in calls
    assert ("", "pods/proxy", "get") in api_calls("KubernetesBackend", in_cluster=False)
    assert ("", "pods", "watch") not in calls
    kubedl = api_calls("KubeDLBackend")
    assert ("serving.kubedl.io", "inferences", "create") in kubedl
