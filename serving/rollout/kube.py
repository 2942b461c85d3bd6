"""The cluster backends, through the official `kubernetes` client: `kubernetes` (k8s/serving: the tracks' models.config
ConfigMaps, Gateway API route weights, pods' model status read through the API server's pod proxy, the rollout state
in a ConfigMap) and `kubedl` (k8s/kubedl: the Inference predictors' modelVersion and trafficWeight). The pods' metrics
come from Prometheus (serving/rollout/prometheus.py). Every update carries the resourceVersion it read; a 409 Conflict
means someone changed the object meanwhile, so the change is made again on a fresh read."""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from serving.model_repository import parse_model_server_config
from serving.rollout.backends import Backend, BackendError, Endpoint, ServerView
from serving.rollout.metrics import MetricsSource
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


class KubernetesBackend(_PodsMixin, Backend):
    """k8s/serving: two Deployments (tracks) reading their models.config ConfigMaps, behind weighted routes."""

    name = "kubernetes"

    def __init__(self, settings, model: str, endpoints: dict[str, list[Endpoint]], timeout_s: float,
                 api: client.ApiClient | None = None, metrics: MetricsSource | None = None) -> None:
        api = api or api_client(settings.kubeconfig)
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.settings = settings
        self.namespace = settings.namespace
        self.rest_port = settings.rest_port
        self.timeout_s = timeout_s
        # The pods' TF Serving metrics come from Prometheus (rollout.prometheus), never through the API server's pod
        # proxy, which the NetworkPolicy of k8s/serving blocks on a multi-node cluster.
        super().__init__(ConfigMapStateStore(self.core, self.namespace, settings.state_config_map, model), endpoints,
                         metrics)

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
    """k8s/kubedl: an Inference whose `stable` and `canary` predictors each serve one ModelVersion; weights are the
    predictors' trafficWeight.

    How KubeDL serves a predictor (kubedl-io/kubedl, controllers/serving): one Deployment and one Service per
    (predictor, ModelVersion), named `<inference>-<predictor>-<modelVersion>`, whose pods carry the labels
    kubedl.io/inference-name, kubedl.io/predictor-name and kubedl.io/model-version. Pointing a predictor at another
    ModelVersion creates a new Deployment and leaves the old one running, so the pods of a version are found by all
    three labels, and the golden requests go to that version's Service (endpoint templates with {model_version})."""

    name = "kubedl"
    supports_labels = False
    GROUP = ("serving.kubedl.io", "v1alpha1", "inferences")
    MODEL_VERSIONS = ("model.kubedl.io", "v1alpha1", "modelversions")

    def __init__(self, settings, model: str, endpoints: dict[str, list[Endpoint]], timeout_s: float,
                 api: client.ApiClient | None = None, metrics: MetricsSource | None = None) -> None:
        api = api or api_client(settings.kubeconfig)
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.settings = settings
        self.namespace = settings.namespace
        self.rest_port = settings.rest_port
        self.timeout_s = timeout_s
        super().__init__(ConfigMapStateStore(self.core, self.namespace, f"{settings.inference}-rollout", model),
                         endpoints, metrics)

    def _inference(self) -> dict[str, Any]:
        group, version, plural = self.GROUP
        try:
            return self.custom.get_namespaced_custom_object(group, version, self.namespace, plural,
                                                            self.settings.inference)
        except ApiException as e:
            raise BackendError(f"cannot read Inference {self.namespace}/{self.settings.inference} ({e.status} "
                               f"{e.reason}); install KubeDL and apply k8s/kubedl.") from None

    def _predictor_name(self, track: str) -> str:
        return {"stable": self.settings.stable_predictor, "canary": self.settings.canary_predictor}[track]

    def _model_version(self, version: int) -> str:
        return self.settings.model_version_name.format(version=version)

    def _version_of(self, model_version: str) -> int | None:
        prefix, _, suffix = self.settings.model_version_name.partition("{version}")
        middle = model_version[len(prefix):len(model_version) - len(suffix) if suffix else None]
        return int(middle) if model_version.startswith(prefix) and middle.isdigit() else None

    def _update(self, change: Callable[[dict[str, Any]], bool]) -> None:
        group, version, plural = self.GROUP
        update_with_retries(
            self._inference, change,
            lambda obj: self.custom.replace_namespaced_custom_object(group, version, self.namespace, plural,
                                                                     self.settings.inference, obj),
            f"Inference {self.namespace}/{self.settings.inference}")

    def _predictor(self, inference: dict[str, Any], track: str) -> dict[str, Any]:
        name = self._predictor_name(track)
        for predictor in inference["spec"]["predictors"]:
            if predictor["name"] == name:
                return predictor
        raise BackendError(f"Inference {self.settings.inference} has no predictor {name!r}; see k8s/kubedl.")

    def _serving(self, track: str) -> str:
        """The ModelVersion the track's predictor names."""
        return self._predictor(self._inference(), track).get("modelVersion", "")

    def _placeholders(self, track: str, model_version: str) -> dict[str, str]:
        return {"namespace": self.namespace, "inference": self.settings.inference,
                "predictor": self._predictor_name(track), "model_version": model_version}

    def endpoints(self, track: str) -> list[Endpoint]:
        values = self._placeholders(track, self._serving(track))
        return [Endpoint(e.rest.format(**values), e.grpc.format(**values)) for e in self._endpoints[track]]

    def track_config(self, model: str, track: str) -> tuple[list[int], dict[str, int]]:
        served = self._version_of(self._serving(track))
        return ([served], {track: served}) if served is not None else ([], {})

    def loaded_versions(self, versions: list[int]) -> list[int]:
        return [max(versions)]

    def set_track(self, model: str, track: str, versions: list[int], labels: dict[str, int]) -> None:
        wanted = self._model_version(max(versions))

        def change(inference: dict[str, Any]) -> bool:
            predictor = self._predictor(inference, track)
            if predictor.get("modelVersion") == wanted:
                return False
            predictor["modelVersion"] = wanted
            return True

        self._update(change)

    def _selector(self, track: str, model_version: str) -> str:
        return self.settings.predictor_selector.format(**self._placeholders(track, model_version))

    def version_views(self, model: str, track: str, version: int) -> list[ServerView]:
        wanted = self._model_version(version)
        views = self._views(self._selector(track, wanted), model, None)
        if self._serving(track) != wanted:
            return [ServerView(v.server, "NOT_FOUND") for v in views]
        return views

    def label_views(self, model: str, track: str, label: str) -> list[int | None]:
        raise NotImplementedError("KubeDL predictors have no labels")

    def set_canary_weight(self, percent: int) -> None:
        weights = {self.settings.stable_predictor: 100 - percent, self.settings.canary_predictor: percent}

        def change(inference: dict[str, Any]) -> bool:
            changed = False
            for predictor in inference["spec"]["predictors"]:
                if predictor["name"] in weights and predictor.get("trafficWeight") != weights[predictor["name"]]:
                    predictor["trafficWeight"] = weights[predictor["name"]]
                    changed = True
            return changed

        self._update(change)

    def canary_weight(self) -> int:
        return int(self._predictor(self._inference(), "canary").get("trafficWeight", 0))

    def check_version(self, model: str, version: int) -> None:
        """The candidate's ModelVersion must exist and its image must not have failed to build (KubeDL holds a
        predictor back until the image is built)."""
        name = self._model_version(version)
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
