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


def test_each_pods_failed_predictions_are_read_at_its_ip(control_plane, pods):
    """What a failed window reads to name its causes (rollout/causes.py): the failures each pod's server kept, read at
    the pod's IP as the account. (The API server's pod proxy refuses loopback pod IPs, "address not allowed"; the
    proxied read is tests/rollout/test_kubernetes_rollout.py's, through the fake API server.)"""
    import json
    import time
    import urllib.error
    import urllib.request

    since = time.time()
    request = urllib.request.Request(f"http://{PODS['tfserving-b']}:{pods}/v1/models/{MODEL}/versions/1:predict",
                                     json.dumps({"instances": [{"fare": 2.5}]}).encode(), method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400
    at_ips, unread = backend_as_the_account(control_plane, pods, "pod_ip").failures(MODEL, "stable", 1, since)
    assert [(f["version"], f["rows"], f["traffic"]) for f in at_ips] == [(1, [{"fare": 2.5}], "users")]
    assert len(unread) == 1 and unread[0].startswith("tfserving-down: no answer GET http://127.0.0.4:")
    assert backend_as_the_account(control_plane, pods, "pod_ip").failures(MODEL, "stable", 1, time.time() + 60)[0] \
        == [], "older than the window: left out"


def non_loopback_address() -> str | None:
    """This machine's address on its default route (connecting a UDP socket sends nothing), or None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


def test_the_pod_proxy_of_a_real_api_server_carries_the_failures_path(control_plane, tiny_versions, tmp_path):
    """Read as a controller outside the cluster reads it: through the API server's pod proxy, as an administrator.
    The API server refuses to proxy to loopback pod IPs ("address not allowed"), so this pod is a server on the
    machine's own address."""
    import json
    import time
    import urllib.error
    import urllib.request

    address = non_loopback_address()
    if address is None:
        pytest.skip("this machine has no address but loopback, and the API server proxies to no loopback pod IP")
    ModelRepository(tmp_path / "serving").add_version(MODEL, tiny_versions[1], version=1)
    ModelRepository.for_track(tmp_path / "serving", "stable").serve(MODEL, [1], {"stable": 1})
    server = ServeProcess(tmp_path / "serving" / "models.config", tmp_path / "serve.log", host=address)
    try:
        server.wait_ready()
        port = int(server.rest.rsplit(":", 1)[1])
        namespace = "failure-reads"
        control_plane.namespace(namespace)
        with control_plane.api_client() as admin:
            core = client.CoreV1Api(admin)
            core.create_namespaced_service_account(namespace, {"metadata": {"name": "tfserving"}})
            core.create_namespaced_pod(namespace, {**restricted_pod("tfserving-host"), "metadata": {
                "name": "tfserving-host", "namespace": namespace, "labels": {"status-reads/track": "stable"}}})
            core.patch_namespaced_pod_status("tfserving-host", namespace, {"status": {
                "phase": "Running", "podIP": address, "podIPs": [{"ip": address}],
                "conditions": [{"type": "Ready", "status": "True"}]}})
        since = time.time()
        request = urllib.request.Request(f"http://{address}:{port}/v1/models/{MODEL}:predict",
                                         json.dumps({"inputs": {"fare": [2.5, 3.5]}}).encode(), method="POST")
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(request, timeout=10)
        settings = RolloutKubernetesConfig(namespace=namespace, stable_selector=SELECTOR, rest_port=port,
                                           status_reads="api_server_proxy")
        backend = KubernetesBackend(settings, MODEL, {"stable": [Endpoint("", "")], "canary": [Endpoint("", "")]},
                                    5, api=control_plane.api_client())
        failures, unread = backend.failures(MODEL, "stable", 1, since)
    finally:
        server.stop()
    assert unread == []
    assert [(f["version"], f["rows"], f["row_count"]) for f in failures] == [(1, [{"fare": 2.5}, {"fare": 3.5}], 2)]
