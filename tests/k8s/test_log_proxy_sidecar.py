"""The logging hop of every serving pod (`mlops log-proxy`, serving/server/log_proxy.py) as the rendered overlays run
it: a sidecar of the project's image that owns the ports the Services, the routes, the scraper and the rollout
controller use, forwards to TF Serving's own ports over localhost (which no NetworkPolicy admits anyone to), parses with
the real `mlops` command line, is probed, bounded and locked down like the server, and writes its logs to a size-limited
volume the configured rotation fits in.

How Kubernetes resolves a named port, followed here: a Service's targetPort by name and protocol over all of the
pod's containers (pkg/api/v1/pod/util.go FindPort, kubernetes/kubernetes 959795b); a probe's port by name within its
own container only (pkg/probe/util.go ResolveContainerPort and findPortByName, 4966917)."""
from __future__ import annotations

import pytest

from serving.server.monitoring import METRICS_PATH
from settings.config import RolloutKubernetesConfig, load_config
from tests.k8s.networkpolicy import Pod, admits
from tests.k8s.render import render
from tests.k8s.test_networkpolicy import CONTROLLER, ENVOY, PROMETHEUS, VALUES

OVERLAYS = ["k8s/serving/base", "k8s/serving/overlays/dev", "k8s/serving/overlays/prod",
            "k8s/serving/overlays/object-storage", "k8s/serving/overlays/request-logs"]
BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def of_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def containers(deployment: dict) -> dict[str, dict]:
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}


def proxy_arguments(container: dict):
    """The sidecar's args as `mlops` parses them (the image's entrypoint is `python -m pipeline.cli`)."""
    from pipeline.cli import build_parser

    assert "command" not in container, "the image's entrypoint runs mlops"
    return build_parser().parse_args(container["args"])


def tf_serving_flag(container: dict, flag: str) -> int:
    [value] = [a.split("=", 1)[1] for a in container["args"] if a.startswith(f"--{flag}=")]
    return int(value)


def find_port(pod: dict, port: dict) -> tuple[str, int]:
    """FindPort: a named targetPort is looked up by name and protocol in every container; (container, number)."""
    name, protocol = port["targetPort"], port.get("protocol", "TCP")
    for container in pod["containers"]:
        for entry in container.get("ports", []):
            if entry.get("name") == name and entry.get("protocol", "TCP") == protocol:
                return container["name"], entry["containerPort"]
    raise AssertionError(f"no container port named {name}")


def probe_port(container: dict, probe: dict) -> int:
    """ResolveContainerPort: a named probe port is one of the probed container's own ports."""
    handler = probe.get("httpGet") or probe.get("tcpSocket")
    port = handler["port"]
    if isinstance(port, int):
        return port
    [number] = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == port]
    return number


def quantity_bytes(quantity: str) -> int:
    for suffix, factor in BINARY.items():
        if quantity.endswith(suffix):
            return int(float(quantity[:-len(suffix)]) * factor)
    return int(quantity)


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request) -> tuple[str, list[dict]]:
    return request.param, render(request.param)


def test_every_server_pod_runs_the_log_proxy_in_front_of_tf_serving(overlay):
    name, objects = overlay
    deployments = of_kind(objects, "Deployment")
    assert set(deployments) == {"tfserving-stable", "tfserving-canary"}
    for deployment in deployments.values():
        found = containers(deployment)
        server, proxy = found["tfserving"], found["log-proxy"]
        assert proxy["image"].split(":")[0].endswith("tfx-mlops") and server["image"].startswith("tensorflow/serving")
        args = proxy_arguments(proxy)
        assert args.command == "log-proxy" and args.host == "0.0.0.0"
        # It forwards to TF Serving's own ports, on localhost.
        assert args.upstream_grpc == f"127.0.0.1:{tf_serving_flag(server, 'port')}"
        assert args.upstream_rest == f"127.0.0.1:{tf_serving_flag(server, 'rest_api_port')}"
        assert {p["name"]: p["containerPort"] for p in proxy["ports"]} == {"grpc": args.grpc_port,
                                                                              "http": args.rest_port}
        assert {p["containerPort"] for p in server["ports"]} == {tf_serving_flag(server, "port"),
                                                                  tf_serving_flag(server, "rest_api_port")}
        assert not {p["containerPort"] for p in server["ports"]} & {args.grpc_port, args.rest_port}, name


def test_the_services_target_the_proxy_and_keep_the_ports_clients_and_the_controller_use(overlay):
    name, objects = overlay
    deployments = of_kind(objects, "Deployment")
    settings = RolloutKubernetesConfig()
    for service_name, service in of_kind(objects, "Service").items():
        pod = deployments[service_name]["spec"]["template"]["spec"]
        targets = {port["port"]: find_port(pod, port) for port in service["spec"]["ports"]}
        assert targets == {8500: ("log-proxy", 8500), 8501: ("log-proxy", 8501)}, (name, service_name)
    for deployment in deployments.values():
        proxy = containers(deployment)["log-proxy"]
        http = next(p["containerPort"] for p in proxy["ports"] if p["name"] == "http")
        # The controller reads model status and labels through the pod proxy on rest_port; Prometheus scrapes there.
        assert settings.rest_port == http
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert (int(annotations["prometheus.io/port"]), annotations["prometheus.io/path"]) == (http, METRICS_PATH)
        assert settings.metrics_path == METRICS_PATH


def test_the_podmonitor_scrapes_the_proxys_port():
    [monitor] = of_kind(render("k8s/serving/monitoring"), "PodMonitor").values()
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("http", METRICS_PATH)
    for deployment in of_kind(render("k8s/serving/base"), "Deployment").values():
        names = {p["name"]: c for c, container in containers(deployment).items() for p in container["ports"]}
        assert names["http"] == "log-proxy"


def test_no_one_reaches_tf_serving_but_through_the_proxy(overlay):
    name, objects = overlay
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    sources = [Pod(VALUES["proxyNamespace"], ENVOY), Pod(VALUES["monitoringNamespace"], PROMETHEUS),
               Pod("mlops-serving", CONTROLLER), Pod("mlops-serving", {"app": "debug"})]
    for deployment in of_kind(objects, "Deployment").values():
        server = Pod(deployment["metadata"]["namespace"], deployment["spec"]["template"]["metadata"]["labels"])
        own = [p["containerPort"] for p in containers(deployment)["tfserving"]["ports"]]
        assert not [(s, port) for s in sources for port in own if admits(policies, server, s, port)], name
        proxy_ports = [p["containerPort"] for p in containers(deployment)["log-proxy"]["ports"]]
        assert all(admits(policies, server, sources[0], port) for port in proxy_ports), name


def test_both_containers_are_probed_on_their_own_ports_and_ready_only_when_the_label_is_available(overlay):
    name, objects = overlay
    for deployment_name, deployment in of_kind(objects, "Deployment").items():
        track = deployment_name.removeprefix("tfserving-")
        found = containers(deployment)
        for container in (found["tfserving"], found["log-proxy"]):
            own = {p["containerPort"] for p in container["ports"]}
            for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
                assert probe_port(container, container[kind]) in own, (name, container["name"], kind)
        proxy = found["log-proxy"]
        # Through the proxy, to TF Serving: the pod is ready only when a request on the client path reaches an
        # AVAILABLE version of the track's label.
        assert proxy["readinessProbe"]["httpGet"]["path"] == f"/v1/models/taxi/labels/{track}/metadata"
        assert proxy["startupProbe"]["periodSeconds"] * proxy["startupProbe"]["failureThreshold"] >= 60


def test_the_proxy_is_bounded_and_locked_down_like_the_server(overlay):
    name, objects = overlay
    for deployment in of_kind(objects, "Deployment").values():
        proxy = containers(deployment)["log-proxy"]
        resources = proxy["resources"]
        assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}, name
        assert quantity_bytes(resources["requests"]["memory"]) <= quantity_bytes(resources["limits"]["memory"])
        context = proxy["securityContext"]
        assert context == containers(deployment)["tfserving"]["securityContext"], name
        assert context["readOnlyRootFilesystem"] and context["runAsNonRoot"] and context["capabilities"]["drop"] == [
            "ALL"]
        # A read-only root: the proxy writes only to its volumes.
        mounts = {m["mountPath"] for m in proxy["volumeMounts"]}
        assert "/tmp" in mounts and {e["name"]: e["value"] for e in proxy["env"]}["HOME"] == "/tmp"


def test_the_logs_fit_their_volume_and_rotation_bounds_them(overlay):
    name, objects = overlay
    for deployment in of_kind(objects, "Deployment").values():
        proxy = containers(deployment)["log-proxy"]
        args = proxy_arguments(proxy)
        config = load_config(args.config, args.overrides)
        request_log = config.serving.request_log
        assert request_log.enabled and 0 < request_log.sampling_rate <= 1
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        [mount] = [m for m in proxy["volumeMounts"] if config.request_log_dir.startswith(m["mountPath"] + "/")]
        volume = volumes[mount["name"]]
        if "persistentVolumeClaim" in volume:
            # overlays/request-logs: one claim for every pod's files (tests/k8s/test_request_logs_overlay.py sizes it).
            [claim] = [c for c in objects if c["kind"] == "PersistentVolumeClaim"
                       and c["metadata"]["name"] == volume["persistentVolumeClaim"]["claimName"]]
            limit = quantity_bytes(claim["spec"]["resources"]["requests"]["storage"])
        else:
            # An emptyDir by default: a pod whose emptyDir passes its sizeLimit is evicted, so the files must fit.
            limit = quantity_bytes(volume["emptyDir"]["sizeLimit"])
        assert request_log.max_files * request_log.max_file_bytes <= limit, name
        assert not mount.get("readOnly")
        assert not [m for m in containers(deployment)["tfserving"]["volumeMounts"] if m["name"] == mount["name"]]


def test_the_dev_overlay_runs_the_proxy_image_kind_loaded_and_the_base_pulls_it():
    for overlay, policy in (("k8s/serving/overlays/dev", "IfNotPresent"), ("k8s/serving/base", "Always"),
                            ("k8s/serving/overlays/prod", "Always")):
        for deployment in of_kind(render(overlay), "Deployment").values():
            assert containers(deployment)["log-proxy"]["imagePullPolicy"] == policy, overlay
