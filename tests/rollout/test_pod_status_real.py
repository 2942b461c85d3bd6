"""Each pod's model status read at the pod's IP, as the in-cluster rollout Job reads it (issue 42 item 1: never through
the API server's pod proxy, which a NetworkPolicy-enforcing cluster does not admit), against the real API server
(tests/k8s/controlplane.py), as k8s/serving's rollout-controller account, with real `mlops serve` processes standing
for the pods. No kubelet runs here, so the test writes each pod's status as the kubelet's status manager would
(kubernetes v1.34 pkg/kubelet/status/status_manager.go, syncPod: phase Running, podIP, the Ready condition): each pod
is a loopback address (127.0.0.2, 127.0.0.3) where a server listens on the one REST port."""
from __future__ import annotations

import socket

import pytest
import yaml
from kubernetes import client

from rollout.backends import Endpoint
from rollout.kube import KubernetesBackend, status_reads_for
from serving.repository.local import ModelRepository
from settings.config import RolloutKubernetesConfig
from tests.k8s.render import render
from tests.rollout.conftest import MODEL, ServeProcess

NAMESPACE = "status-reads"
ACCOUNT = f"system:serviceaccount:{NAMESPACE}:rollout-controller"
SELECTOR = "status-reads/track=stable"
PODS = {"tfserving-a": "127.0.0.2", "tfserving-b": "127.0.0.3"}


def port_free_on_every_address(addresses: list[str]) -> int:
    for _ in range(50):
        with socket.socket() as first:
            first.bind((addresses[0], 0))
            port = first.getsockname()[1]
            try:
                for address in addresses[1:]:
                    with socket.socket() as other:
                        other.bind((address, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no port is free on all of {addresses}")


def restricted_pod(name: str) -> dict:
    """A pod the namespace's Pod Security `restricted` admits (it never runs: there is no kubelet)."""
    context = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
               "runAsUser": 10001, "seccompProfile": {"type": "RuntimeDefault"}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"status-reads/track": "stable"}},
            "spec": {"serviceAccountName": "tfserving", "automountServiceAccountToken": False,
                     "containers": [{"name": "tfserving", "image": "tensorflow/serving:2.16.1",
                                     "securityContext": context}]}}


@pytest.fixture(scope="module")
def pods(control_plane, tiny_versions, tmp_path_factory):
    """k8s/serving/base's rollout-controller account in its own namespace; two Ready pods, each a server on its own
    loopback address serving version 1 labelled stable; a third pod Ready at an address where nothing listens."""
    root = tmp_path_factory.mktemp("status_reads")
    repository = ModelRepository(root / "serving")
    repository.add_version(MODEL, tiny_versions[1], version=1)
    ModelRepository.for_track(root / "serving", "stable").serve(MODEL, [1], {"stable": 1})
    port = port_free_on_every_address([*PODS.values(), "127.0.0.4"])
    servers = [ServeProcess(root / "serving" / "models.config", root / f"{name}.log", host=address, rest_port=port)
               for name, address in PODS.items()]
    try:
        control_plane.namespace(NAMESPACE)
        accounts = [{**o, "metadata": {**o["metadata"], "namespace": NAMESPACE}}
                    for o in render("k8s/serving/base") if o["kind"] in ("ServiceAccount", "Role", "RoleBinding")]
        for o in accounts:
            for subject in o.get("subjects", []):
                subject["namespace"] = NAMESPACE
        control_plane.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(accounts))
        with control_plane.api_client() as admin:
            core = client.CoreV1Api(admin)
            for name, address in [*PODS.items(), ("tfserving-down", "127.0.0.4")]:
                core.create_namespaced_pod(NAMESPACE, restricted_pod(name))
                core.patch_namespaced_pod_status(name, NAMESPACE, {"status": {
                    "phase": "Running", "podIP": address, "podIPs": [{"ip": address}],
                    "conditions": [{"type": "Ready", "status": "True"}]}})
        for server in servers:
            server.wait_ready()
        yield port
    finally:
        for server in servers:
            server.stop()


def backend_as_the_account(control_plane, port: int, status_reads: str) -> KubernetesBackend:
    api = control_plane.api_client()
    api.set_default_header("Impersonate-User", ACCOUNT)
    settings = RolloutKubernetesConfig(namespace=NAMESPACE, stable_selector=SELECTOR, rest_port=port,
                                       status_reads=status_reads)
    endpoints = {"stable": [Endpoint("", "")], "canary": [Endpoint("", "")]}
    return KubernetesBackend(settings, MODEL, endpoints, 5, api=api)


def test_the_in_cluster_account_reads_each_pods_status_at_its_ip(control_plane, pods):
    backend = backend_as_the_account(control_plane, pods, "pod_ip")
    views = {v.server: v for v in backend.version_views(MODEL, "stable", 1)}
    assert {name: views[name].state for name in PODS} == {"tfserving-a": "AVAILABLE", "tfserving-b": "AVAILABLE"}
    assert views["tfserving-down"].state == "UNREACHABLE"
    assert "127.0.0.4" in views["tfserving-down"].error and "refused" in views["tfserving-down"].error.lower()
    assert backend.label_views(MODEL, "stable", "stable") == [1, 1, None]


def test_the_in_cluster_account_may_not_use_the_pod_proxy(control_plane, pods):
    """What the backend did before: the same reads through the API server's pod proxy. The account's Role no longer
    grants pods/proxy (a NetworkPolicy-enforcing cluster would not admit the control plane's connection anyway), so
    the server refuses every read and no pod counts as AVAILABLE."""
    backend = backend_as_the_account(control_plane, pods, "api_server_proxy")
    views = backend.version_views(MODEL, "stable", 1)
    assert [v.state for v in views] == ["UNREACHABLE"] * 3
    assert all(v.error.startswith("403") for v in views), [v.error for v in views]


@pytest.mark.parametrize("setting, in_cluster, expected", [
    ("auto", True, "pod_ip"), ("auto", False, "api_server_proxy"),
    ("pod_ip", False, "pod_ip"), ("api_server_proxy", True, "api_server_proxy")])
def test_auto_reads_at_pod_ips_only_inside_the_cluster(setting, in_cluster, expected):
    assert status_reads_for(setting, in_cluster) == expected
