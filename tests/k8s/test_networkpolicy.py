"""Who reaches the TF Serving pods of each overlay, computed from the rendered NetworkPolicies by the API's rules
(tests/k8s/networkpolicy.py): the gateway's proxies, the Prometheus scraper and the rollout controller, and no one
else; and the servers reach nothing (the object-storage overlay: its store over HTTPS, and DNS)."""
from __future__ import annotations

import pytest
import yaml

from tests.k8s.networkpolicy import Pod, admits
from tests.k8s.render import REPO, render

SERVING = "mlops-serving"
VALUES = yaml.safe_load((REPO / "k8s/serving/gateway/values.yaml").read_text())["data"]
# The labels Envoy Gateway v1.5.9 puts on its proxy pods (internal/infrastructure/kubernetes/proxy/resource.go
# EnvoyAppLabel, plus the owning Gateway's labels, internal/gatewayapi/translator.go).
ENVOY = {"app.kubernetes.io/name": "envoy", "app.kubernetes.io/component": "proxy",
         "app.kubernetes.io/managed-by": "envoy-gateway",
         "gateway.envoyproxy.io/owning-gateway-name": VALUES["name"],
         "gateway.envoyproxy.io/owning-gateway-namespace": VALUES["namespace"]}
# The Prometheus operator's labels on a Prometheus pod (pkg/prometheus/server/operator.go makeSelectorLabels,
# v0.86.1).
PROMETHEUS = {"app.kubernetes.io/name": "prometheus", "app.kubernetes.io/managed-by": "prometheus-operator",
              "app.kubernetes.io/instance": "k8s", "operator.prometheus.io/name": "k8s", "prometheus": "k8s"}
CONTROLLER = {"app.kubernetes.io/name": "rollout-controller"}

GATEWAY_PROXY = Pod(VALUES["proxyNamespace"], ENVOY)
SCRAPER = Pod(VALUES["monitoringNamespace"], PROMETHEUS)
ROLLOUT_CONTROLLER = Pod(SERVING, CONTROLLER)
OTHERS = {
    "the Envoy Gateway controller": Pod(VALUES["proxyNamespace"], {"control-plane": "envoy-gateway",
                                                                   "app.kubernetes.io/name": "gateway-helm"}),
    "an Envoy proxy of another namespace": Pod("default", ENVOY),
    "any pod of the Gateway's own namespace": Pod(VALUES["namespace"], {"app": "x"}),
    "Grafana beside Prometheus": Pod(VALUES["monitoringNamespace"], {"app.kubernetes.io/name": "grafana"}),
    "a Prometheus in another namespace": Pod("default", PROMETHEUS),
    "a controller-labelled pod elsewhere": Pod("default", CONTROLLER),
    "another server": Pod(SERVING, {"app.kubernetes.io/name": "tfserving", "app.kubernetes.io/track": "stable"}),
    "any pod of the serving namespace": Pod(SERVING, {"app": "debug"}),
    "the model loader": Pod(SERVING, {}),
    "a pod of kube-system": Pod("kube-system", {"k8s-app": "kube-dns"}),
}
EXPECTED = {(GATEWAY_PROXY, 8500), (GATEWAY_PROXY, 8501), (SCRAPER, 8501), (ROLLOUT_CONTROLLER, 8500),
            (ROLLOUT_CONTROLLER, 8501)}
PORTS = (8500, 8501, 9090, 80, 443)




def servers(objects: list[dict]) -> list[Pod]:
    return [Pod(o["metadata"]["namespace"], o["spec"]["template"]["metadata"]["labels"]) for o in objects
            if o["kind"] == "Deployment"]


@pytest.mark.parametrize("overlay", ["k8s/serving/base", "k8s/serving/overlays/dev", "k8s/serving/overlays/prod",
                                     "k8s/serving/overlays/object-storage"])
def test_only_the_gateway_proxies_the_scraper_and_the_controller_reach_the_servers(overlay):
    objects = render(overlay)
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    # The controller's own pod (a Job of k8s/serving/rollout-job) has a policy too: its egress must admit the same.
    policies += [o for o in render("k8s/serving/rollout-job") if o["kind"] == "NetworkPolicy"]
    candidates = [GATEWAY_PROXY, SCRAPER, ROLLOUT_CONTROLLER, *OTHERS.values()]
    assert len(servers(objects)) == 2
    for server in servers(objects):
        admitted = {(source, port) for source in candidates for port in PORTS if admits(policies, server, source, port)}
        assert admitted == EXPECTED, (overlay, server.labels, admitted ^ EXPECTED)
        assert not admits(policies, server, GATEWAY_PROXY, 8501, "UDP")


@pytest.mark.parametrize("overlay, opened", [
    ("k8s/serving/overlays/dev", set()), ("k8s/serving/overlays/prod", set()),
    ("k8s/serving/overlays/object-storage", {(443, "TCP"), (53, "UDP"), (53, "TCP")})])
def test_the_servers_open_no_connection_but_to_their_object_store(overlay, opened):
    objects = render(overlay)
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    anywhere = Pod("somewhere", {"app": "store"})
    for server in servers(objects):
        found = {(port, protocol) for port in (53, 80, 443, 8500, 8501) for protocol in ("TCP", "UDP")
                 if admits(policies, anywhere, server, port, protocol)}
        assert found == opened, overlay


def test_the_rule_semantics_follow_the_api():
    policy = {"metadata": {"namespace": "a"}, "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [
        {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "b"}},
                   "podSelector": {"matchLabels": {"x": "1"}}}], "ports": [{"port": 80}]},
        {"from": [{"podSelector": {"matchLabels": {"y": "1"}}}]}]}}
    target = Pod("a", {})
    assert admits([policy], target, Pod("b", {"x": "1"}), 80)            # namespace AND pod
    assert not admits([policy], target, Pod("b", {"x": "2"}), 80)
    assert not admits([policy], target, Pod("c", {"x": "1"}), 80)
    assert not admits([policy], target, Pod("b", {"x": "1"}), 81)        # the rule's ports
    assert admits([policy], target, Pod("a", {"y": "1"}), 12345)          # podSelector alone: own namespace, any port
    assert not admits([policy], target, Pod("b", {"y": "1"}), 12345)
    assert admits([policy], Pod("other", {}), Pod("z", {}), 1)             # a pod no policy selects admits all
    # Two separate peers are ORed: namespace b (any pod) or pods x=1 of the policy's namespace.
    either = {"metadata": {"namespace": "a"}, "spec": {"podSelector": {}, "ingress": [{"from": [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "b"}}},
        {"podSelector": {"matchLabels": {"x": "1"}}}]}]}}
    assert admits([either], target, Pod("b", {}), 1) and admits([either], target, Pod("a", {"x": "1"}), 1)
    assert not admits([either], target, Pod("c", {"x": "1"}), 1)
