"""The cluster backends, through the official `kubernetes` client: `kubernetes` (k8s/serving: the tracks' models.config
ConfigMaps, Gateway API route weights, pods' model status read at each pod's IP (in the cluster) or through the API
server's pod proxy (outside it), the rollout state in a ConfigMap) and `kubedl` (k8s/kubedl: one KubeDL Inference per
model version behind the project's Gateway API routes). The pods' metrics come from Prometheus (rollout/prometheus.py).
Every update carries the resourceVersion it read; a 409 Conflict means someone changed the object meanwhile, so the
change is made again on a fresh read."""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from kubernetes import client
from kubernetes.client.rest import ApiException

from rollout.backends import Backend, BackendError, Endpoint, ServerView, check_published_version
from rollout.metrics import MetricsSource
from rollout.mirror import mirror_percent, set_mirror
from rollout.route_status import route_status
from rollout.state import (
    EMPTY,
    ControllerBusyError,
    Holding,
    StateConflictError,
    StateStore,
    busy_message,
)
from serving.repository.base import parse_model_server_config
from serving.repository.local import ModelRepository
from settings.config import RolloutKubeDLConfig, RolloutKubernetesConfig

CONFIG_KEY = "models.config"
GATEWAY = ("gateway.networking.k8s.io", "v1")
CONFLICT_RETRIES = 8


# A pod's model status answers at once when its server is up; a hung pod must not stall the controller's poll.
STATUS_READ_TIMEOUT_S = 5.0


def connect(kubeconfig: str = "") -> tuple[client.ApiClient, bool]:
    """(client, whether it is the in-cluster service account): the pod's own account when running in a pod and no
    kubeconfig is named, else a kubeconfig file."""
    from kubernetes import config

    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig), False
    try:
        config.load_incluster_config()
        return client.ApiClient(), True
    except config.ConfigException:
        return config.new_client_from_config(), False


def api_client(kubeconfig: str = "") -> client.ApiClient:
    """The in-cluster service account when running in a pod, else a kubeconfig file."""
    return connect(kubeconfig)[0]


def status_reads_for(setting: str, in_cluster: bool) -> str:
    """`auto` resolved: a controller in a pod reads the pods at their IPs, one outside through the API server."""
    if setting != "auto":
        return setting
    return "pod_ip" if in_cluster else "api_server_proxy"


def update_with_retries(read: Callable[[], Any], change: Callable[[Any], bool], write: Callable[[Any], Any],
                        what: str, fence: Callable[[], None] = lambda: None) -> None:
    """Read, change, write with the read resourceVersion; on 409 Conflict read again. `change` returns False when the
    object already is as wanted (then nothing is written). `fence` runs right before every write, retries included:
    it raises once this controller's Lease is lost or has run out, so a stalled controller writes nothing more."""
    for _ in range(CONFLICT_RETRIES):
        obj = read()
        if not change(obj):
            return
        fence()
        try:
            write(obj)
            return
        except ApiException as e:
            if e.status != 409:
                raise BackendError(f"updating {what} failed: {e.status} {e.reason}") from None
    raise BackendError(f"updating {what} kept conflicting with other writers ({CONFLICT_RETRIES} tries); try again.")


class ConfigMapStateStore(StateStore):
    """The rollout state as key `<model>.json` of a ConfigMap. The token is the document's own revision, so a
    rollout of another model (another key of the same ConfigMap) is no conflict; every write carries the ConfigMap's
    resourceVersion, and a 409 Conflict re-reads and checks the revision again. The controller's lock is a Lease."""

    def __init__(self, core: client.CoreV1Api, namespace: str, name: str, model: str,
                 coordination: client.CoordinationV1Api | None = None, lease_duration_s: float = 30.0) -> None:
        self.core, self.namespace, self.name, self.key = core, namespace, name, f"{model}.json"
        self.coordination = coordination
        self.lease_name = f"{name}-{model}".lower().replace("_", "-")
        self.lease_duration_s = lease_duration_s
        self.holding: Holding | None = None  # while a controller holds the Lease: every traffic write checks it

    def fence(self) -> None:
        """Raises StateConflictError when the Lease this store holds is lost or has run out."""
        if self.holding is not None:
            self.holding.check()

    def _read(self):
        try:
            return self.core.read_namespaced_config_map(self.name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise BackendError(f"reading ConfigMap {self.namespace}/{self.name} failed: {e.status} "
                               f"{e.reason}") from None

    def _document(self, config_map) -> dict[str, Any]:
        text = ((config_map.data or {}).get(self.key) if config_map is not None else None)
        return json.loads(text) if text else json.loads(json.dumps(EMPTY))

    def load(self) -> tuple[dict[str, Any], str]:
        document = self._document(self._read())
        return document, str(document.get("revision", 0))

    def save(self, document: dict[str, Any], token: str) -> str:
        revision = int(token) + 1
        text = json.dumps({**document, "revision": revision}, sort_keys=True)
        for _ in range(CONFLICT_RETRIES):
            config_map = self._read()
            stored = str(self._document(config_map).get("revision", 0))
            if stored != token:
                raise StateConflictError(f"the rollout state in ConfigMap {self.namespace}/{self.name} changed "
                                         f"(revision {stored}, expected {token}); another controller is running.")
            try:
                if config_map is None:
                    self.core.create_namespaced_config_map(self.namespace, client.V1ConfigMap(
                        metadata=client.V1ObjectMeta(name=self.name), data={self.key: text}))  # namespace: the URL's
                else:
                    config_map.data = {**(config_map.data or {}), self.key: text}
                    self.core.replace_namespaced_config_map(self.name, self.namespace, config_map)
                return str(revision)
            except ApiException as e:
                if e.status != 409:  # 409: AlreadyExists on create, Conflict on replace; read again
                    raise BackendError(f"writing ConfigMap {self.namespace}/{self.name} failed: {e.status} "
                                       f"{e.reason}") from None
        raise StateConflictError(f"writing ConfigMap {self.namespace}/{self.name} kept conflicting with other writers "
                                 f"({CONFLICT_RETRIES} tries); try again.")

    @contextlib.contextmanager
    def exclusive(self, wait_s: float = 0.0) -> Iterator[Holding]:
        if self.coordination is None:
            raise BackendError("the Kubernetes state store needs the coordination.k8s.io API for its Lease.")
        lease = Lease(self.coordination, self.namespace, self.lease_name, self.lease_duration_s)
        self.holding = lease.acquire(wait_s)
        try:
            yield self.holding
        finally:
            self.holding = None
            lease.release()


def _parse_time(value: Any) -> datetime.datetime | None:
    if value is None or isinstance(value, datetime.datetime):
        return value
    return datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))


class Busy(NamedTuple):
    """Who holds a Lease another controller asked for."""
    holder: str
    held_s: float  # since its acquireTime, by this process's clock (shown only)
    expires_in_s: float  # until this process may take it over, by its own observation
    stopped_renewing: bool  # its renewTime is older than its duration by this clock: a hint, never the verdict


class Lease:
    """A coordination.k8s.io/v1 Lease held by one controller, as client-go's leader election holds one
    (k8s.io/client-go v0.34, tools/leaderelection/leaderelection.go: tryAcquireOrRenew, renew, and
    resourcelock/leaselock.go). Created when missing. Held by another, it is taken over only once its record has
    stayed unchanged for `leaseDurationSeconds` as this process's own monotonic clock measures it (client-go's
    observedTime: no two machines' clocks are compared; the holder's renewTime is only shown). Renewed every retry
    period (2/15 of the duration, client-go's 2 s of 15 s); a holding not renewed within the renew deadline (2/3 of
    the duration, client-go's 10 s of 15 s) is lost, so it ends before another controller may take the Lease over.
    Released by emptying holderIdentity, which any controller may take at once."""

    def __init__(self, api: client.CoordinationV1Api, namespace: str, name: str, duration_s: float,
                 clock: Callable[[], datetime.datetime] | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.api, self.namespace, self.name = api, namespace, name
        self.duration_s = max(1, round(duration_s))
        self.renew_deadline_s = self.duration_s * 2 / 3
        self.retry_period_s = self.duration_s * 2 / 15
        self.identity = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.clock = clock or (lambda: datetime.datetime.now(datetime.timezone.utc))
        self.monotonic = monotonic
        self.holding = Holding(monotonic)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._held: Any = None
        # client-go's observedRecord and observedTime: the other holder's record and when this process saw it change.
        self._observed: tuple | None = None
        self._observed_at = 0.0

    def _spec(self, acquire_time: datetime.datetime, transitions: int) -> client.V1LeaseSpec:
        return client.V1LeaseSpec(holder_identity=self.identity, lease_duration_seconds=self.duration_s,
                                  acquire_time=acquire_time, renew_time=self.clock(), lease_transitions=transitions)

    def _observe(self, spec: client.V1LeaseSpec) -> float:
        """Seconds for which the Lease's record has stayed as it is now, by this process's clock."""
        record = (spec.holder_identity, str(spec.renew_time), str(spec.acquire_time), spec.lease_transitions,
                  spec.lease_duration_seconds)
        if record != self._observed:
            self._observed, self._observed_at = record, self.monotonic()
        return self.monotonic() - self._observed_at

    def _try_acquire(self) -> Busy | None:
        """One attempt: None once this controller holds the Lease, else who holds it."""
        started = self.monotonic()
        now = self.clock()
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise BackendError(f"reading Lease {self.namespace}/{self.name} failed: {e.status} "
                                   f"{e.reason}") from None
            body = client.V1Lease(metadata=client.V1ObjectMeta(name=self.name), spec=self._spec(now, 0))
            try:
                self._held = self.api.create_namespaced_lease(self.namespace, body)
            except ApiException as e:
                if e.status == 409:  # created by another controller meanwhile
                    return Busy("another controller", 0.0, float(self.duration_s), False)
                raise BackendError(f"creating Lease {self.namespace}/{self.name} failed: {e.status} "
                                   f"{e.reason}") from None
            self.holding.valid_until = started + self.renew_deadline_s
            return None
        spec = lease.spec
        unchanged_s = self._observe(spec)
        duration = spec.lease_duration_seconds or self.duration_s
        held_by_other = bool(spec.holder_identity) and spec.holder_identity != self.identity
        if held_by_other and unchanged_s < duration:
            renewed = _parse_time(spec.renew_time)
            acquired = _parse_time(spec.acquire_time) or renewed
            renewed_ago = (now - renewed).total_seconds() if renewed else 0.0
            return Busy(f"{spec.holder_identity}, renewed {renewed_ago:.0f}s ago by its clock",
                        (now - acquired).total_seconds() if acquired else 0.0, duration - unchanged_s,
                        renewed_ago > duration)
        lease.spec = self._spec(now, (spec.lease_transitions or 0) + (1 if held_by_other else 0))
        try:
            self._held = self.api.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException as e:
            if e.status == 409:
                return Busy("another controller", 0.0, float(duration), False)
            raise BackendError(f"taking Lease {self.namespace}/{self.name} failed: {e.status} {e.reason}") from None
        self.holding.valid_until = started + self.renew_deadline_s
        return None

    def acquire(self, wait_s: float) -> Holding:
        """Waits up to `wait_s` for the Lease; longer when its holder stopped renewing (a crashed controller), since
        only watching its record stay unchanged for a whole duration tells that it expired."""
        deadline = self.monotonic() + wait_s
        while (busy := self._try_acquire()) is not None:
            if busy.stopped_renewing:
                deadline = max(deadline, self.monotonic() + busy.expires_in_s + self.retry_period_s)
            if self.monotonic() >= deadline:
                raise ControllerBusyError(busy_message(f"Lease {self.namespace}/{self.name}: {busy.holder}",
                                                       busy.held_s, wait_s))
            time.sleep(min(self.retry_period_s, max(0.05, deadline - self.monotonic())))
        self._thread = threading.Thread(target=self._renew_loop, daemon=True)  # never keeps the process alive
        self._thread.start()
        return self.holding

    def renew(self) -> bool:
        """One renewal: True when it renewed; marks the holding lost when another controller holds the Lease now."""
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as e:
            raise BackendError(f"reading Lease {self.namespace}/{self.name} failed: {e.status} {e.reason}") from None
        if lease.spec.holder_identity != self.identity:
            self.holding.lost = f"Lease {self.namespace}/{self.name} is held by {lease.spec.holder_identity} now"
            return False
        lease.spec.renew_time = self.clock()
        try:
            self._held = self.api.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException as e:
            if e.status == 409:
                self.holding.lost = f"Lease {self.namespace}/{self.name} was changed by another controller"
                return False
            raise BackendError(f"renewing Lease {self.namespace}/{self.name} failed: {e.status} {e.reason}") from None
        return True

    def _renew_loop(self) -> None:
        error = ""
        while not self._stop.wait(self.retry_period_s) and not self.holding.lost:
            started = self.monotonic()
            try:
                if self.renew():
                    self.holding.valid_until = started + self.renew_deadline_s
            except (BackendError, OSError) as e:
                error = f" ({e})"
            if not self.holding.lost and self.monotonic() > (self.holding.valid_until or 0.0):
                self.holding.lost = (f"Lease {self.namespace}/{self.name} was not renewed within its renew deadline "
                                     f"of {self.renew_deadline_s:.0f}s{error}")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.holding.lost:
            return
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
            if lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = ""
                lease.spec.lease_duration_seconds = 1
                lease.spec.renew_time = self.clock()
                self.api.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException:
            pass  # the Lease then expires after its duration by itself


def _pod_ip_get(pod: client.V1Pod, port: int, path: str) -> tuple[int, str]:
    """GET on the pod's port at its IP, as the Service's traffic reaches it: what k8s/serving's NetworkPolicy admits
    from the rollout controller's pods, with no API server in between."""
    ip = pod.status.pod_ip if pod.status else None
    if not ip:
        return 0, "the pod has no IP yet"
    url = f"http://{f'[{ip}]' if ':' in ip else ip}:{port}/{path.lstrip('/')}"
    try:
        with urllib.request.urlopen(url, timeout=STATUS_READ_TIMEOUT_S) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as e:
        return 0, f"GET {url}: {getattr(e, 'reason', e)}"


class _PodsMixin:
    core: client.CoreV1Api
    namespace: str
    rest_port: int
    # "pod_ip" or "api_server_proxy" (status_reads_for): how each pod's model status is read.
    status_reads: str

    def _pods(self, selector: str) -> list[client.V1Pod]:
        """The Ready pods that are not terminating: the ones a Service sends traffic to (EndpointSlice readiness,
        kubernetes v1.30 pkg/controller/endpointslice/reconciler.go, podutil.IsPodReady and DeletionTimestamp)."""
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=selector).items
        return sorted((p for p in pods if p.status and p.status.phase == "Running"
                       and p.metadata.deletion_timestamp is None
                       and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])),
                      key=lambda p: p.metadata.name)

    def _status_get(self, pod: client.V1Pod, path: str) -> tuple[int, str]:
        """GET on the pod's REST port: (status, body), status 0 when nothing answered."""
        if self.status_reads == "pod_ip":
            return _pod_ip_get(pod, self.rest_port, path)
        return self._proxy_get(pod.metadata.name, path)

    def _proxy_get(self, pod: str, path: str) -> tuple[int, str]:
        """Through the API server's pod proxy, for a controller outside the cluster. The connection then comes from
        the control plane, which a NetworkPolicy may not admit (docs/tutorials/kubernetes.md), and the account needs
        `pods/proxy`, which the in-cluster Roles do not grant."""
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
            status, body = self._status_get(pod, path)
            if status == 404:
                views.append(ServerView(pod.metadata.name, "NOT_FOUND"))
                continue
            try:
                rows = json.loads(body)["model_version_status"]
            except (ValueError, KeyError, TypeError):
                views.append(ServerView(pod.metadata.name, "UNREACHABLE", f"{status}: {body[:200]}"))
                continue
            row = next((r for r in rows if version is None or int(r["version"]) == version), rows[0])
            views.append(ServerView(pod.metadata.name, row.get("state", "UNKNOWN"),
                                    row.get("status", {}).get("error_message", "")))
        return views

    def _label_views(self, selector: str, model: str, label: str) -> list[int | None]:
        # The metadata of a label, not its status: TF Serving's GetModelStatus ignores a label and answers every
        # version of the model (model_servers/get_model_status_impl.cc, 2.16.1), while metadata resolves the label
        # through ServerCore::GetServableHandle, which answers only for an AVAILABLE version, and names it.
        versions: list[int | None] = []
        for pod in self._pods(selector):
            status, body = self._status_get(pod, f"v1/models/{model}/labels/{label}/metadata")
            try:
                versions.append(int(json.loads(body)["model_spec"]["version"]) if status == 200 else None)
            except (ValueError, KeyError, TypeError):
                versions.append(None)
        return versions


class _RoutesMixin:
    """The route reads both cluster backends share: two routes (REST, gRPC) in the backend's namespace."""
    custom: client.CustomObjectsApi
    namespace: str
    timeout_s: float
    settings: Any  # the backend's settings: their http_route and grpc_route name the routes
    ROUTES_HINT: str

    def _route(self, plural: str, name: str) -> dict[str, Any]:
        try:
            return self.custom.get_namespaced_custom_object(*GATEWAY, self.namespace, plural, name)
        except ApiException as e:
            raise BackendError(f"cannot read {plural} {self.namespace}/{name} ({e.status} {e.reason}); install the "
                               f"Gateway API CRDs and {self.ROUTES_HINT}.") from None

    def _route_names(self) -> list[tuple[str, str, str]]:
        return [("httproutes", "HTTPRoute", self.settings.http_route),
                ("grpcroutes", "GRPCRoute", self.settings.grpc_route)]

    def check_routing(self) -> None:
        """Each route's status as its Gateway's controller wrote it (rollout/route_status.py); a status that judged
        an older generation of the route (a weight written a moment ago) is waited for, up to the load timeout."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            problems, stale = [], []
            for plural, kind, name in self._route_names():
                status = route_status(kind, self._route(plural, name))
                problems += status.problems
                stale += status.stale
            if problems:
                raise BackendError("the routes do not carry traffic: " + "; ".join(problems) + ". Fix the route or "
                                   "its Gateway (`kubectl describe` the route shows its status) and start again.")
            if not stale:
                return
            if time.monotonic() > deadline:
                raise BackendError(f"the Gateway's controller has not processed the routes' latest change within "
                                   f"{self.timeout_s:.0f}s: " + "; ".join(stale) + ". Check that it runs.")
            time.sleep(1.0)


class KubernetesBackend(_RoutesMixin, _PodsMixin, Backend):
    """k8s/serving: two Deployments (tracks) reading their models.config ConfigMaps, behind weighted routes."""

    name = "kubernetes"
    ROUTES_HINT = "apply k8s/serving"

    def __init__(self, settings: RolloutKubernetesConfig, model: str, endpoints: dict[str, list[Endpoint]],
                 timeout_s: float,
                 api: client.ApiClient | None = None, lease_duration_s: float = 30.0,
                 metrics: MetricsSource | None = None, repository_dir: str = "") -> None:
        in_cluster = False
        if api is None:
            api, in_cluster = connect(settings.kubeconfig)
        self.status_reads = status_reads_for(settings.status_reads, in_cluster)
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.settings = settings
        self.namespace = settings.namespace
        self.rest_port = settings.rest_port
        self.timeout_s = timeout_s
        self.repository_dir = repository_dir
        store = ConfigMapStateStore(self.core, self.namespace, settings.state_config_map, model,
                                    client.CoordinationV1Api(api), lease_duration_s)
        # The pods' TF Serving metrics come from Prometheus (rollout.prometheus), never through the API server's pod
        # proxy, which the NetworkPolicy of k8s/serving blocks on a multi-node cluster.
        super().__init__(store, endpoints, metrics)

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
                               "k8s/serving first (docs/tutorials/kubernetes.md).") from None

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
                            f"ConfigMap {self.namespace}/{name}", self.store.fence)

    def version_views(self, model: str, track: str, version: int) -> list[ServerView]:
        return self._views(self._selector(track), model, version)

    def label_views(self, model: str, track: str, label: str) -> list[int | None]:
        return self._label_views(self._selector(track), model, label)

    def server_gets(self, track: str, version: int, path: str) -> list[tuple[str, int, str]]:
        return [(pod.metadata.name, *self._status_get(pod, path)) for pod in self._pods(self._selector(track))]

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

        self._update_both_routes(change)

    def _update_both_routes(self, change: Callable[[dict[str, Any]], bool]) -> None:
        """`change` applied to the HTTPRoute and the GRPCRoute, each written only when it changed, retried on 409."""
        for plural, name in (("httproutes", self.settings.http_route), ("grpcroutes", self.settings.grpc_route)):
            update_with_retries(
                lambda plural=plural, name=name: self._route(plural, name), change,
                lambda route, plural=plural, name=name: self.custom.replace_namespaced_custom_object(
                    *GATEWAY, self.namespace, plural, name, route),
                f"{plural} {self.namespace}/{name}", self.store.fence)

    def canary_weight(self) -> int:
        route = self._route("httproutes", self.settings.http_route)
        for rule in route["spec"]["rules"]:
            for ref in rule.get("backendRefs", []):
                if ref["name"] == self.settings.canary_service:
                    return int(ref.get("weight", 1))
        return 0

    def can_mirror(self) -> bool:
        return True

    def set_shadow_percent(self, percent: int) -> None:
        """Both routes' RequestMirror filter (rollout/mirror.py) to the canary Service at `percent` (0: removed)."""
        def change(route: dict[str, Any]) -> bool:
            try:
                return set_mirror(route, self.settings.canary_service, percent)
            except ValueError as e:
                raise BackendError(f"{e}; the routes must name the canary Service (k8s/serving/bootstrap).") from None

        self._update_both_routes(change)

    def shadow_percent(self) -> int:
        try:
            return mirror_percent(self._route("httproutes", self.settings.http_route), self.settings.canary_service)
        except ValueError as e:
            raise BackendError(f"{e}; run `mlops rollout start` again to set one share.") from None

    def publication(self, model: str, version: int) -> dict[str, Any]:
        return ModelRepository(self.repository_dir).publication(model, version)

    def check_version(self, model: str, version: int) -> None:
        """The repository the pods serve, as this process sees it (the rollout Job mounts the same claim read-only at
        output_root/serving; from a laptop, the folder copied into it): published, and matching its checksums."""
        if not os.path.isdir(os.path.join(self.repository_dir, model)):
            raise BackendError(f"the model repository {os.path.join(self.repository_dir, model)} is not here, so "
                               f"version {version} cannot be checked against its checksums before it serves: run the "
                               "rollout where the repository is mounted (k8s/serving/rollout-job) or set output_root "
                               "to the folder the cluster's copy came from.")
        check_published_version(self.repository_dir, model, version)


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


class KubeDLBackend(_RoutesMixin, _PodsMixin, Backend):
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
    ROUTES_HINT = "create k8s/kubedl's routes"
    INFERENCES = ("serving.kubedl.io", "v1alpha1", "inferences")
    MODEL_VERSIONS = ("model.kubedl.io", "v1alpha1", "modelversions")
    TFJOBS = ("training.kubedl.io", "v1alpha1", "tfjobs")
    TRACK_INDEX = {"stable": 0, "canary": 1}
    REST_PORT, GRPC_PORT = 8080, 9000

    def __init__(self, settings: RolloutKubeDLConfig, model: str, endpoints: dict[str, list[Endpoint]],
                 timeout_s: float,
                 api: client.ApiClient | None = None, lease_duration_s: float = 30.0,
                 metrics: MetricsSource | None = None) -> None:
        in_cluster = False
        if api is None:
            api, in_cluster = connect(settings.kubeconfig)
        self.status_reads = status_reads_for(settings.status_reads, in_cluster)
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.settings = settings
        self.model = model
        self.namespace = settings.namespace
        self.rest_port = settings.rest_port
        self.timeout_s = timeout_s
        store = ConfigMapStateStore(self.core, self.namespace, f"{settings.inference}-rollout", model,
                                    client.CoordinationV1Api(api), lease_duration_s)
        super().__init__(store, endpoints, metrics)

    def _inference_name(self, version: int) -> str:
        return f"{self.settings.inference}-v{version}"

    def _service_name(self, version: int) -> str:
        return f"{self._inference_name(version)}-{self.settings.predictor}"

    def _version_of_service(self, service: str) -> int | None:
        prefix, suffix = f"{self.settings.inference}-v", f"-{self.settings.predictor}"
        middle = service[len(prefix):-len(suffix)] if service.startswith(prefix) and service.endswith(suffix) else ""
        return int(middle) if middle.isdigit() else None

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
                f"{plural} {self.namespace}/{name}", self.store.fence)

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
            self.store.fence()
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

    def server_gets(self, track: str, version: int, path: str) -> list[tuple[str, int, str]]:
        selector = self.settings.predictor_selector.format(**self._placeholders(version))
        return [(pod.metadata.name, *self._status_get(pod, path)) for pod in self._pods(selector)]

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
