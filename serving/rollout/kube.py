"""The cluster backends, through the official `kubernetes` client: `kubernetes` (k8s/serving: the tracks' models.config
ConfigMaps, Gateway API route weights, pods' model status and Prometheus metrics read through the API server's pod
proxy, the rollout state in a ConfigMap) and `kubedl` (k8s/kubedl: one KubeDL Inference per model version behind
the project's Gateway API routes). Every update carries the resourceVersion it read; a 409 Conflict means someone
changed the object meanwhile, so the change is made again on a fresh read."""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from serving.model_repository import parse_model_server_config
from serving.rollout.backends import Backend, BackendError, Endpoint, ServerView
from serving.rollout.metrics import ModelCounters, model_counters, parse_prometheus_text
from serving.rollout.state import EMPTY, StateConflictError, StateStore

CONFIG_KEY = "models.config"
GATEWAY = ("gateway.networking.k8s.io", "v1")
CONFLICT_RETRIES = 8


def api_client(kubeconfig: str = "") -> client.ApiClient:
    """The in-cluster service account when running in a pod, else a kubeconfig file."""
    from kubernetes import config

    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    try:
        config.load_incluster_config()
        return client.ApiClient()
    except config.ConfigException:
        return config.new_client_from_config()


def update_with_retries(read: Callable[[], Any], change: Callable[[Any], bool], write: Callable[[Any], Any],
                        what: str) -> None:
    """Read, change, write with the read resourceVersion; on 409 Conflict read again. `change` returns False when the
    object already is as wanted (then nothing is written)."""
    for _ in range(CONFLICT_RETRIES):
        obj = read()
        if not change(obj):
            return
        try:
            write(obj)
            return
        except ApiException as e:
            if e.status != 409:
                raise BackendError(f"updating {what} failed: {e.status} {e.reason}") from None
    raise BackendError(f"updating {what} kept conflicting with other writers ({CONFLICT_RETRIES} tries); try again.")


class ConfigMapStateStore(StateStore):
    """The rollout state as key `<model>.json` of a ConfigMap; the token is its resourceVersion."""

    def __init__(self, core: client.CoreV1Api, namespace: str, name: str, model: str) -> None:
        self.core, self.namespace, self.name, self.key = core, namespace, name, f"{model}.json"

    def _read(self):
        try:
            return self.core.read_namespaced_config_map(self.name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise BackendError(f"reading ConfigMap {self.namespace}/{self.name} failed: {e.status} "
                               f"{e.reason}") from None

    def load(self) -> tuple[dict[str, Any], str]:
        config_map = self._read()
        if config_map is None:
            return json.loads(json.dumps(EMPTY)), ""
        text = (config_map.data or {}).get(self.key)
        return (json.loads(text) if text else json.loads(json.dumps(EMPTY))), config_map.metadata.resource_version

    def save(self, document: dict[str, Any], token: str) -> str:
        text = json.dumps(document, sort_keys=True)
        try:
            if not token:
                created = self.core.create_namespaced_config_map(self.namespace, client.V1ConfigMap(
                    metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace), data={self.key: text}))
                return created.metadata.resource_version
            config_map = self._read()
            if config_map is None or config_map.metadata.resource_version != token:
                raise StateConflictError(f"the rollout state in ConfigMap {self.namespace}/{self.name} changed; "
                                         "another controller is running.")
            config_map.data = {**(config_map.data or {}), self.key: text}
            return self.core.replace_namespaced_config_map(self.name, self.namespace,
                                                           config_map).metadata.resource_version
        except ApiException as e:
            if e.status == 409:
                raise StateConflictError(f"the rollout state in ConfigMap {self.namespace}/{self.name} changed "
                                         "meanwhile (409 Conflict); another controller is running.") from None
            raise BackendError(f"writing ConfigMap {self.namespace}/{self.name} failed: {e.status} "
                               f"{e.reason}") from None


class _PodsMixin:
    core: client.CoreV1Api
    namespace: str
    rest_port: int
    metrics_path: str

    def _pods(self, selector: str) -> list[str]:
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=selector).items
        return sorted(p.metadata.name for p in pods if p.status and p.status.phase == "Running")

    def _proxy_get(self, pod: str, path: str) -> tuple[int, str]:
        """GET on the pod's REST port through the API server's pod proxy: (status, body)."""
        try:
            response = self.core.connect_get_namespaced_pod_proxy_with_path(
                f"{pod}:{self.rest_port}", self.namespace, path.lstrip("/"), _preload_content=False)
            return response.status, response.data.decode()
        except ApiException as e:
            return e.status, e.body.decode() if isinstance(e.body, bytes) else str(e.body or e.reason)

    def _views(self, selector: str, model: str, version: int | None) -> list[ServerView]:
        views = []
        path = f"v1/models/{model}" + (f"/versions/{version}" if version is not None else "")
        for pod in self._pods(selector):
            status, body = self._proxy_get(pod, path)
            if status == 404:
                views.append(ServerView(pod, "NOT_FOUND"))
                continue
            try:
                rows = json.loads(body)["model_version_status"]
            except (ValueError, KeyError, TypeError):
                views.append(ServerView(pod, "UNREACHABLE", f"{status}: {body[:200]}"))
                continue
            row = next((r for r in rows if version is None or int(r["version"]) == version), rows[0])
            views.append(ServerView(pod, row.get("state", "UNKNOWN"), row.get("status", {}).get("error_message", "")))
        return views

    def _label_views(self, selector: str, model: str, label: str) -> list[int | None]:
        # The metadata of a label, not its status: TF Serving's GetModelStatus ignores a label and answers every
        # version of the model (model_servers/get_model_status_impl.cc, 2.16.1), while metadata resolves the label
        # through ServerCore::GetServableHandle, which answers only for an AVAILABLE version, and names it.
        versions: list[int | None] = []
        for pod in self._pods(selector):
            status, body = self._proxy_get(pod, f"v1/models/{model}/labels/{label}/metadata")
            try:
                versions.append(int(json.loads(body)["model_spec"]["version"]) if status == 200 else None)
            except (ValueError, KeyError, TypeError):
                versions.append(None)
        return versions

    def _scrape(self, selector: str, model: str) -> list[ModelCounters] | None:
        counters = []
        for pod in self._pods(selector):
            status, body = self._proxy_get(pod, self.metrics_path)
            if status != 200:
                return None
            counters.append(model_counters(parse_prometheus_text(body), model))
        return counters or None


class KubernetesBackend(_PodsMixin, Backend):
    """k8s/serving: two Deployments (tracks) reading their models.config ConfigMaps, behind weighted routes."""

    name = "kubernetes"

    def __init__(self, settings, model: str, endpoints: dict[str, list[Endpoint]], timeout_s: float,
                 api: client.ApiClient | None = None) -> None:
        api = api or api_client(settings.kubeconfig)
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.settings = settings
        self.namespace = settings.namespace
        self.rest_port = settings.rest_port
        self.metrics_path = settings.metrics_path
        self.timeout_s = timeout_s
        super().__init__(ConfigMapStateStore(self.core, self.namespace, settings.state_config_map, model), endpoints)

    def _config_map_name(self, track: str) -> str:
        return {"stable": self.settings.stable_config_map, "canary": self.settings.canary_config_map}[track]

    def _selector(self, track: str) -> str:
        return {"stable": self.settings.stable_selector, "canary": self.settings.canary_selector}[track]

    def _read_config_map(self, track: str):
        name = self._config_map_name(track)
        try:
            return self.core.read_namespaced_config_map(name, self.namespace)
        except ApiException as e:
            raise BackendError(f"cannot read ConfigMap {self.namespace}/{name} ({e.status} {e.reason}); apply "
                               "k8s/serving first (k8s/serving/README.md).") from None

    def track_config(self, model: str, track: str) -> tuple[list[int], dict[str, int]]:
        text = (self._read_config_map(track).data or {}).get(CONFIG_KEY, "")
        config = parse_model_server_config(text, f"ConfigMap {self._config_map_name(track)}")
        for model_config in config.model_config_list.config:
            if model_config.name == model:
                return sorted(model_config.model_version_policy.specific.versions), dict(model_config.version_labels)
        return [], {}

    def set_track(self, model: str, track: str, versions: list[int], labels: dict[str, int]) -> None:
        from google.protobuf import text_format

        def change(config_map) -> bool:
            text = (config_map.data or {}).get(CONFIG_KEY, "")
            config = parse_model_server_config(text, f"ConfigMap {config_map.metadata.name}")
            wanted = _with_model(config, model, versions, labels, self.settings.served_base_dir)
            new_text = text_format.MessageToString(wanted)
            if new_text == text:
                return False
            config_map.data = {**(config_map.data or {}), CONFIG_KEY: new_text}
            return True

        name = self._config_map_name(track)
        update_with_retries(lambda: self._read_config_map(track), change,
                            lambda cm: self.core.replace_namespaced_config_map(name, self.namespace, cm),
                            f"ConfigMap {self.namespace}/{name}")

    def version_views(self, model: str, track: str, version: int) -> list[ServerView]:
        return self._views(self._selector(track), model, version)

    def label_views(self, model: str, track: str, label: str) -> list[int | None]:
        return self._label_views(self._selector(track), model, label)

    def _route(self, plural: str, name: str) -> dict[str, Any]:
        try:
            return self.custom.get_namespaced_custom_object(*GATEWAY, self.namespace, plural, name)
        except ApiException as e:
            raise BackendError(f"cannot read {plural} {self.namespace}/{name} ({e.status} {e.reason}); install the "
                               "Gateway API CRDs and apply k8s/serving.") from None

    def set_canary_weight(self, percent: int) -> None:
        weights = {self.settings.stable_service: 100 - percent, self.settings.canary_service: percent}

        def change(route: dict[str, Any]) -> bool:
            changed = False
            for rule in route["spec"]["rules"]:
                for ref in rule.get("backendRefs", []):
                    if ref["name"] in weights and ref.get("weight") != weights[ref["name"]]:
                        ref["weight"] = weights[ref["name"]]
                        changed = True
            return changed

        for plural, name in (("httproutes", self.settings.http_route), ("grpcroutes", self.settings.grpc_route)):
            update_with_retries(
                lambda plural=plural, name=name: self._route(plural, name), change,
                lambda route, plural=plural, name=name: self.custom.replace_namespaced_custom_object(
                    *GATEWAY, self.namespace, plural, name, route),
                f"{plural} {self.namespace}/{name}")

    def canary_weight(self) -> int:
        route = self._route("httproutes", self.settings.http_route)
        for rule in route["spec"]["rules"]:
            for ref in rule.get("backendRefs", []):
                if ref["name"] == self.settings.canary_service:
                    return int(ref.get("weight", 1))
        return 0

    def check_version(self, model: str, version: int) -> None:
        # The repository is a volume of the pods, not of this process: a missing or broken version shows as a failed
        # load on the canary servers, and the rollout is rolled back.
        return None


def _with_model(config, model: str, versions: list[int], labels: dict[str, int], served_base_dir: str):
    """A copy of `config` with `model` serving `versions` with `labels` (other models kept), paths as the pods see
    them."""
    from tensorflow_serving.config import model_server_config_pb2

    if any(v not in versions for v in labels.values()):
        raise BackendError(f"labels {labels} must point at served versions {versions}.")
    wanted = model_server_config_pb2.ModelServerConfig()
    wanted.CopyFrom(config)
    entry = next((c for c in wanted.model_config_list.config if c.name == model), None)
    if entry is None:
        entry = wanted.model_config_list.config.add(name=model)
    entry.base_path = f"{served_base_dir.rstrip('/')}/{model}"
    entry.model_platform = "tensorflow"
    entry.model_version_policy.Clear()
    entry.model_version_policy.specific.versions.extend(sorted(versions))
    entry.version_labels.clear()
    entry.version_labels.update(labels)
    return wanted


class KubeDLBackend(_PodsMixin, Backend):
    """k8s/kubedl: one KubeDL Inference per model version, `<inference>-v<version>` with the one predictor
    `<predictor>`, and the traffic split by the project's own Gateway API routes in front of KubeDL's predictor
    Services: backendRefs[0] of each route is the stable track, backendRefs[1] the canary.

    Why not KubeDL's own canary (kubedl-io/kubedl b93a2b4, controllers/serving): its InferenceReconciler.syncPredictor
    creates a predictor's Deployment only when none exists (inference_controller.go), so a changed `modelVersion` is
    never applied; createNewPredictorDeploy and createServiceForPredictor name them `<inference>-<predictor>`
    (predictor.go, utils.go genPredictorName), not by ModelVersion; and syncTrafficDistribution writes a VirtualService
    with one destination per HTTP route, so `trafficWeight` splits nothing. An Inference that never changes, one per
    version, is what its controller does serve. Its Service listens on 8080 (REST) and 9000 (gRPC)
    (apis/serving/v1alpha1/defaults.go).

    A version's ModelVersion is the one `rollout.kubedl.tfjob` recorded (the TFJob's status.modelVersionName: KubeDL
    names a trained one `mv-<job>-<uid[:5]>`, controllers/model/utils.go GetJobModelVersionName), else
    `rollout.kubedl.model_version_name` (registered by hand, k8s/kubedl/modelversion.yaml)."""

    name = "kubedl"
    supports_labels = False
    INFERENCES = ("serving.kubedl.io", "v1alpha1", "inferences")
    MODEL_VERSIONS = ("model.kubedl.io", "v1alpha1", "modelversions")
    TFJOBS = ("training.kubedl.io", "v1alpha1", "tfjobs")
    TRACK_INDEX = {"stable": 0, "canary": 1}
    REST_PORT, GRPC_PORT = 8080, 9000

    def __init__(self, settings, model: str, endpoints: dict[str, list[Endpoint]], timeout_s: float,
                 api: client.ApiClient | None = None) -> None:
        api = api or api_client(settings.kubeconfig)
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.settings = settings
        self.model = model
        self.namespace = settings.namespace
        self.rest_port = settings.rest_port
        self.metrics_path = settings.metrics_path
        self.timeout_s = timeout_s
        super().__init__(ConfigMapStateStore(self.core, self.namespace, f"{settings.inference}-rollout", model),
                         endpoints)

    def _inference_name(self, version: int) -> str:
        return f"{self.settings.inference}-v{version}"

    def _service_name(self, version: int) -> str:
        return f"{self._inference_name(version)}-{self.settings.predictor}"

    def _version_of_service(self, service: str) -> int | None:
        prefix, suffix = f"{self.settings.inference}-v", f"-{self.settings.predictor}"
        middle = service[len(prefix):-len(suffix)] if service.startswith(prefix) and service.endswith(suffix) else ""
        return int(middle) if middle.isdigit() else None

    def _route(self, plural: str, name: str) -> dict[str, Any]:
        try:
            return self.custom.get_namespaced_custom_object(*GATEWAY, self.namespace, plural, name)
        except ApiException as e:
            raise BackendError(f"cannot read {plural} {self.namespace}/{name} ({e.status} {e.reason}); install the "
                               "Gateway API CRDs and create k8s/kubedl's routes.") from None

    @staticmethod
    def _refs(route: dict[str, Any], what: str) -> list[dict[str, Any]]:
        refs = route["spec"]["rules"][0].get("backendRefs", [])
        if len(route["spec"]["rules"]) != 1 or len(refs) != 2:
            raise BackendError(f"{what} must have one rule with two backendRefs (stable, then canary); see "
                               "k8s/kubedl/routes.yaml.")
        return refs

    def _update_routes(self, change: Callable[[list[dict[str, Any]], int], bool]) -> None:
        for plural, name, port in (("httproutes", self.settings.http_route, self.REST_PORT),
                                   ("grpcroutes", self.settings.grpc_route, self.GRPC_PORT)):
            update_with_retries(
                lambda plural=plural, name=name: self._route(plural, name),
                lambda route, plural=plural, name=name, port=port: change(self._refs(route, f"{plural} {name}"), port),
                lambda route, plural=plural, name=name: self.custom.replace_namespaced_custom_object(
                    *GATEWAY, self.namespace, plural, name, route),
                f"{plural} {self.namespace}/{name}")

    def _served(self, track: str) -> int | None:
        """The version whose predictor Service the track's backendRef names."""
        refs = self._refs(self._route("httproutes", self.settings.http_route), self.settings.http_route)
        return self._version_of_service(refs[self.TRACK_INDEX[track]]["name"])

    def _placeholders(self, version: int | None) -> dict[str, str]:
        inference = self._inference_name(version) if version is not None else self.settings.inference
        return {"namespace": self.namespace, "inference": inference, "predictor": self.settings.predictor,
                "version": str(version)}

    def endpoints(self, track: str) -> list[Endpoint]:
        values = self._placeholders(self._served(track))
        return [Endpoint(e.rest.format(**values), e.grpc.format(**values)) for e in self._endpoints[track]]

    def track_config(self, model: str, track: str) -> tuple[list[int], dict[str, int]]:
        served = self._served(track)
        return ([served], {track: served}) if served is not None else ([], {})

    def loaded_versions(self, versions: list[int]) -> list[int]:
        return [max(versions)]

    def model_version(self, version: int) -> str:
        """The ModelVersion of repository version `version`: the TFJob's record, else the name template."""
        if not self.settings.tfjob:
            return self.settings.model_version_name.format(version=version)
        group, api_version, plural = self.TFJOBS
        name = self.settings.tfjob.format(version=version)
        try:
            job = self.custom.get_namespaced_custom_object(group, api_version, self.namespace, plural, name)
        except ApiException as e:
            raise BackendError(f"cannot read TFJob {self.namespace}/{name} ({e.status} {e.reason}): "
                               "rollout.kubedl.tfjob names the job that trained this version.") from None
        recorded = (job.get("status") or {}).get("modelVersionName", "")
        if not recorded:
            raise BackendError(f"TFJob {self.namespace}/{name} has recorded no ModelVersion (status.modelVersionName); "
                               "it needs spec.modelVersion and must have succeeded.")
        return recorded

    def _inference_for(self, version: int) -> dict[str, Any]:
        """A new Inference serving `version`: the template's predictor (k8s/kubedl/inference.yaml, the Inference of
        version 1 as applied) with this version's ModelVersion and model path."""
        group, api_version, plural = self.INFERENCES
        template_name = self._inference_name(self._served("stable") or 1)
        try:
            template = self.custom.get_namespaced_custom_object(group, api_version, self.namespace, plural,
                                                                template_name)
        except ApiException as e:
            raise BackendError(f"cannot read Inference {self.namespace}/{template_name} ({e.status} {e.reason}); "
                               "apply k8s/kubedl.") from None
        [predictor] = [p for p in template["spec"]["predictors"] if p["name"] == self.settings.predictor]
        predictor = json.loads(json.dumps(predictor))
        predictor["modelVersion"] = self.model_version(version)
        # KubeDL sets MODEL_BASE_PATH to the parent of modelPath (framework/tfserving.go SetSpec); the predictor's
        # command serves --model_base_path=$(MODEL_BASE_PATH), so the model is version `version` there.
        predictor["modelPath"] = f"{predictor['modelPath'].rstrip('/').rsplit('/', 1)[0]}/{version}"
        predictor.pop("trafficWeight", None)
        return {"apiVersion": f"{group}/{api_version}", "kind": "Inference",
                "metadata": {"name": self._inference_name(version), "namespace": self.namespace,
                             "labels": {**(template["metadata"].get("labels") or {}),
                                        "app.kubernetes.io/version": str(version)}},
                "spec": {**template["spec"], "predictors": [predictor]}}

    def _ensure_inference(self, version: int) -> None:
        group, api_version, plural = self.INFERENCES
        name = self._inference_name(version)
        try:
            self.custom.get_namespaced_custom_object(group, api_version, self.namespace, plural, name)
            return
        except ApiException as e:
            if e.status != 404:
                raise BackendError(f"reading Inference {self.namespace}/{name} failed: {e.status} {e.reason}") from None
        try:
            self.custom.create_namespaced_custom_object(group, api_version, self.namespace, plural,
                                                        self._inference_for(version))
        except ApiException as e:
            if e.status != 409:  # created meanwhile (a controller killed after its create): the same object
                raise BackendError(f"creating Inference {self.namespace}/{name} failed: {e.status} "
                                   f"{e.reason}") from None

    def set_track(self, model: str, track: str, versions: list[int], labels: dict[str, int]) -> None:
        version = max(versions)
        self._ensure_inference(version)
        wanted, index = self._service_name(version), self.TRACK_INDEX[track]

        def change(refs: list[dict[str, Any]], port: int) -> bool:
            if (refs[index]["name"], refs[index].get("port")) == (wanted, port):
                return False
            refs[index]["name"], refs[index]["port"] = wanted, port
            return True

        self._update_routes(change)

    def version_views(self, model: str, track: str, version: int) -> list[ServerView]:
        selector = self.settings.predictor_selector.format(**self._placeholders(version))
        views = self._views(selector, model, version)
        if self._served(track) != version:
            return [ServerView(v.server, "NOT_FOUND") for v in views]
        return views

    def label_views(self, model: str, track: str, label: str) -> list[int | None]:
        raise NotImplementedError("KubeDL predictors have no labels")

    def set_canary_weight(self, percent: int) -> None:
        weights = [100 - percent, percent]

        def change(refs: list[dict[str, Any]], port: int) -> bool:
            if [ref.get("weight", 1) for ref in refs] == weights:
                return False
            for ref, weight in zip(refs, weights, strict=True):
                ref["weight"] = weight
            return True

        self._update_routes(change)

    def canary_weight(self) -> int:
        refs = self._refs(self._route("httproutes", self.settings.http_route), self.settings.http_route)
        return int(refs[1].get("weight", 1))

    def check_version(self, model: str, version: int) -> None:
        """The candidate's ModelVersion must exist and its image must not have failed to build (KubeDL holds a
        predictor back until the image is built)."""
        name = self.model_version(version)
        group, api_version, plural = self.MODEL_VERSIONS
        try:
            model_version = self.custom.get_namespaced_custom_object(group, api_version, self.namespace, plural, name)
        except ApiException as e:
            if e.status == 404:
                raise BackendError(f"there is no ModelVersion {self.namespace}/{name} for version {version}; train it "
                                   "with KubeDL or register it (k8s/kubedl/modelversion.yaml).") from None
            raise BackendError(f"reading ModelVersion {self.namespace}/{name} failed: {e.status} {e.reason}") from None
        phase = (model_version.get("status") or {}).get("imageBuildPhase", "")
        if phase == "ImageBuildFailed":
            message = (model_version.get("status") or {}).get("message", "")
            raise BackendError(f"the image of ModelVersion {self.namespace}/{name} failed to build ({message}); "
                               "fix the build and register the version again.")
