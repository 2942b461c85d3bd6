"""The logging hop on KubeDL (k8s/kubedl/inference.yaml): the predictor's pods run `mlops log-proxy` in front of TF
Serving as k8s/serving/base's do, checked as tests/k8s/test_log_proxy_sidecar.py checks those, on the Deployment and
Service KubeDL makes of the predictor.

What KubeDL does with a predictor's template, followed here (kubedl-io/kubedl b93a2b4, v0.5.0 + 12 commits, these
files unchanged since the v0.5.0 tag): apis/serving/v1alpha1/defaults.go setDefaults_predictor gives the container
named `predictor`, else the first, a port predictor-http-port 8080 when it has none; controllers/serving/predictor.go
createNewPredictorDeploy copies the template whole, every container kept, adding the model loader's emptyDir mount at
modelPath and KUBEDL_MODEL_PATH to each (framework/tfserving.go tfServingSetter.SetSpec adds MODEL_BASE_PATH and
MODEL_NAME to each too); createServiceForPredictor's ports 8080 and 9000 target the number of the first container
port named predictor-http-port and predictor-grpc-port, in container order (getContainerPort)."""
from __future__ import annotations

import copy
import posixpath

from settings.config import RolloutKubeDLConfig, load_config
from tests.k8s.networkpolicy import Pod, admits
from tests.k8s.render import render
from tests.k8s.test_log_proxy_sidecar import probe_port, proxy_arguments, quantity_bytes, tf_serving_flag

HTTP_PORT_NAME, GRPC_PORT_NAME = "predictor-http-port", "predictor-grpc-port"
# apis/serving/v1alpha1/defaults.go: the Service's ports, and a port's number when no container names it.
SERVICE_HTTP_PORT, SERVICE_GRPC_PORT = 8080, 9000
LOADER_VOLUME = "kubedl-model-loader"


def inference() -> dict:
    [found] = [o for o in render("k8s/kubedl") if o["kind"] == "Inference"]
    return found


def predictor() -> dict:
    [found] = inference()["spec"]["predictors"]
    return found


def set_defaults_predictor(spec: dict) -> dict:
    """defaults.go setDefaults_predictor."""
    spec = copy.deepcopy(spec)
    containers = spec["template"]["spec"]["containers"]
    index = next((i for i, c in enumerate(containers) if c["name"] == "predictor"), 0)
    if not [p for p in containers[index].get("ports", []) if p.get("name") == HTTP_PORT_NAME]:
        containers[index].setdefault("ports", []).append({"name": HTTP_PORT_NAME, "containerPort": SERVICE_HTTP_PORT})
    return spec


def get_container_port(spec: dict, name: str, default: int) -> int:
    """predictor.go getContainerPort: the first container port of that name, in container order."""
    for container in spec["template"]["spec"]["containers"]:
        for port in container.get("ports", []):
            if port.get("name") == name:
                return port["containerPort"]
    return default


def predictor_pod(spec: dict) -> dict:
    """The pod spec of the Deployment createNewPredictorDeploy makes (the model mount and env on every container)."""
    pod = copy.deepcopy(spec["template"]["spec"])
    pod["volumes"].append({"name": LOADER_VOLUME, "emptyDir": {}})
    for container in pod["containers"]:
        container.setdefault("volumeMounts", []).append({"name": LOADER_VOLUME, "mountPath": spec["modelPath"]})
        container.setdefault("env", []).extend([{"name": "KUBEDL_MODEL_PATH", "value": spec["modelPath"]},
                                                {"name": "MODEL_BASE_PATH",
                                                 "value": posixpath.dirname(spec["modelPath"])}])
    return pod


def containers() -> dict[str, dict]:
    return {c["name"]: c for c in predictor_pod(set_defaults_predictor(predictor()))["containers"]}


def owner(pod: dict, number: int) -> str:
    [name] = [c["name"] for c in pod["containers"] for p in c.get("ports", []) if p["containerPort"] == number]
    return name


def test_kubedls_service_targets_the_proxy_and_tf_serving_listens_only_on_localhost_ports():
    spec = set_defaults_predictor(predictor())
    pod = predictor_pod(spec)
    targets = {SERVICE_HTTP_PORT: get_container_port(spec, HTTP_PORT_NAME, SERVICE_HTTP_PORT),
               SERVICE_GRPC_PORT: get_container_port(spec, GRPC_PORT_NAME, SERVICE_GRPC_PORT)}
    assert {port: (owner(pod, number), number) for port, number in targets.items()} == {
        SERVICE_HTTP_PORT: ("log-proxy", 8501), SERVICE_GRPC_PORT: ("log-proxy", 8500)}
    # The defaulting added nothing: the proxy, first, already names predictor-http-port.
    assert spec == predictor()
    found = containers()
    assert [c["name"] for c in pod["containers"]] == ["log-proxy", "tensorflow"]
    server, proxy = found["tensorflow"], found["log-proxy"]
    assert proxy["image"].split(":")[0].endswith("tfx-mlops") and server["image"].startswith("tensorflow/serving")
    args = proxy_arguments(proxy)
    assert args.command == "log-proxy" and args.host == "0.0.0.0"
    assert args.upstream_grpc == f"127.0.0.1:{tf_serving_flag(server, 'port')}"
    assert args.upstream_rest == f"127.0.0.1:{tf_serving_flag(server, 'rest_api_port')}"
    assert {p["name"]: p["containerPort"] for p in proxy["ports"]} == {GRPC_PORT_NAME: args.grpc_port,
                                                                          HTTP_PORT_NAME: args.rest_port}
    assert {p["containerPort"] for p in server["ports"]} == {tf_serving_flag(server, "port"),
                                                              tf_serving_flag(server, "rest_api_port")}
    assert not {p["containerPort"] for p in server["ports"]} & {args.grpc_port, args.rest_port}
    # The controller reads each pod's model status through the pod proxy on rest_port: the proxy's.
    assert RolloutKubeDLConfig().rest_port == args.rest_port


def test_the_proxy_is_probed_on_its_own_ports_and_ready_only_when_a_version_is_available():
    proxy = containers()["log-proxy"]
    own = {p["containerPort"] for p in proxy["ports"]}
    for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert probe_port(proxy, proxy[kind]) in own, kind
    # A predictor serves one version and has no labels: the model's metadata answers only for an AVAILABLE one.
    assert proxy["readinessProbe"]["httpGet"]["path"] == "/v1/models/taxi/metadata"
    assert proxy["startupProbe"]["periodSeconds"] * proxy["startupProbe"]["failureThreshold"] >= 60


def test_the_proxy_is_bounded_and_locked_down_like_the_server():
    pod = predictor_pod(predictor())
    found = {c["name"]: c for c in pod["containers"]}
    proxy, server = found["log-proxy"], found["tensorflow"]
    resources = proxy["resources"]
    assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}
    assert quantity_bytes(resources["requests"]["memory"]) <= quantity_bytes(resources["limits"]["memory"])
    assert proxy["securityContext"] == server["securityContext"]
    # The pod's context, with the container's over it, as the kubelet applies them.
    effective = {**pod["securityContext"], **proxy["securityContext"]}
    assert effective["runAsNonRoot"] and effective["runAsUser"] >= 10000 and effective["readOnlyRootFilesystem"]
    assert effective["allowPrivilegeEscalation"] is False and effective["capabilities"]["drop"] == ["ALL"]
    assert effective["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["automountServiceAccountToken"] is False
    mounts = [m["mountPath"] for m in proxy["volumeMounts"]]
    # KubeDL's model mount lands in the proxy too, apart from where it writes.
    assert len(mounts) == len(set(mounts)) and "/tmp" in mounts
    assert {e["name"]: e["value"] for e in proxy["env"]}["HOME"] == "/tmp"


def test_the_logs_fit_their_volume_and_rotation_bounds_them():
    pod = predictor_pod(predictor())
    found = {c["name"]: c for c in pod["containers"]}
    proxy = found["log-proxy"]
    args = proxy_arguments(proxy)
    config = load_config(args.config, args.overrides)
    request_log = config.serving.request_log
    assert request_log.enabled and 0 < request_log.sampling_rate <= 1
    volumes = {v["name"]: v for v in pod["volumes"]}
    [mount] = [m for m in proxy["volumeMounts"] if config.request_log_dir.startswith(m["mountPath"] + "/")]
    limit = quantity_bytes(volumes[mount["name"]]["emptyDir"]["sizeLimit"])
    assert request_log.max_files * request_log.max_file_bytes <= limit
    assert not mount.get("readOnly")
    assert not [m for m in found["tensorflow"]["volumeMounts"] if m["name"] == mount["name"]]


def test_the_predictors_admit_anyone_to_the_proxy_and_no_one_to_tf_servings_own_ports():
    """k8s/kubedl/networkpolicy.yaml selects the pods by the label KubeDL gives them (controllers/serving/labels.go
    insertLabelsForPredictor): every source reaches the proxy's ports, none TF Serving's, and a TFJob worker of the
    same namespace is not selected."""
    policies = [o for o in render("k8s/kubedl") + render("k8s/training") if o["kind"] == "NetworkPolicy"]
    labels = {"kubedl.io/inference-name": inference()["metadata"]["name"],
              "kubedl.io/predictor-name": predictor()["name"], "kubedl.io/model-version": predictor()["modelVersion"]}
    server = Pod(inference()["metadata"]["namespace"], labels)
    own = [p["containerPort"] for p in containers()["tensorflow"]["ports"]]
    proxy = [p["containerPort"] for p in containers()["log-proxy"]["ports"]]
    sources = [Pod("envoy-gateway-system", {"app.kubernetes.io/name": "envoy"}), Pod("mlops", {"app": "debug"}),
               Pod("monitoring", {"app.kubernetes.io/name": "prometheus"})]
    assert not [(s, port) for s in sources for port in own if admits(policies, server, s, port)]
    assert all(admits(policies, server, s, port) for s in sources for port in proxy)
    worker = Pod("mlops", {"training.kubedl.io/job-name": "taxi", "training.kubedl.io/replica-type": "worker"})
    assert admits(policies, worker, Pod("mlops", {"app": "debug"}), 2222), "TFJob workers keep their own ports"
