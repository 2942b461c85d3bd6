"""Every URL and gRPC method that clients use reaches the servers through the gateway, by the Gateway API's own
matching rules (tests/k8s/gateway_api.py, v1.3.0), and nothing else of the servers does: the rendered routes of
k8s/serving/bootstrap, attached to the example Gateway of k8s/serving/gateway-envoy."""
from __future__ import annotations

import re
import shutil

import pytest
import yaml

from tests.k8s import gateway_api
from tests.k8s.gateway_api import HttpRequest
from tests.k8s.render import REPO, render

MODEL = "taxi"
SERVING_NAMESPACE = "mlops-serving"




# The routes of each path: which Services back them, on which REST and gRPC ports.
ROUTE_SOURCES = {
    "k8s/serving/bootstrap": ({"tfserving-stable", "tfserving-canary"}, 8501, 8500, SERVING_NAMESPACE),
    "k8s/kubedl/routes": ({"taxi-v1-serve"}, 8080, 9000, "mlops"),
}


@pytest.fixture(scope="module", params=sorted(ROUTE_SOURCES))
def routes(request) -> dict[str, list[dict]]:
    objects = render(REPO / request.param)
    found = {kind: [o for o in objects if o["kind"] == kind] for kind in ("HTTPRoute", "GRPCRoute")}
    backends, rest_port, grpc_port, namespace = ROUTE_SOURCES[request.param]
    return {**found, "backends": backends, "rest_port": rest_port, "grpc_port": grpc_port, "namespace": namespace}


def rest_requests() -> list[HttpRequest]:
    """What serving/clients/transports.py's RestClient sends (its own path builder), the REST verbs TF Serving has,
    and the report page's curl example."""
    from reports.run_page import rest_example
    from serving.clients import RestClient

    client = RestClient("http://gateway.example:80")
    requests = []
    for version, label in ((None, None), (2, None), (None, "canary"), (None, "stable")):
        base = client._model_path(MODEL, version, label)
        requests += [HttpRequest("POST", base + verb) for verb in (":predict", ":classify", ":regress")]
        requests += [HttpRequest("GET", base), HttpRequest("GET", base + "/metadata")]
    curl = rest_example(MODEL, 3, {"fare": 1.0}, url="http://gateway.example")
    requests.append(HttpRequest("POST", re.search(r"http://gateway\.example(\S+)", curl).group(1)))
    return requests


def readme_paths() -> list[str]:
    """Every /v1/models/... path the READMEs and the documentation site name, placeholders filled in."""
    fill = {"<m>": MODEL, "<model>": MODEL, "{m}": MODEL, "<v>": "2", "<version>": "2", "{v}": "2",
            "<track>": "canary", "<label>": "canary", "{l}": "canary"}
    paths = set()
    pages = [REPO / "README.md", REPO / "k8s/serving/README.md", REPO / "serving/README.md",
             *(REPO / "docs").rglob("*.md")]
    for page in pages:
        for found in re.findall(r"/v1/models/[^\s`'\")\]|]+", page.read_text()):
            for placeholder, value in fill.items():
                found = found.replace(placeholder, value)
            if found.split("/")[3].split(":")[0] == MODEL:
                paths.add(found.rstrip(".,;"))
    return sorted(paths)


def test_every_rest_call_of_the_client_and_the_readmes_reaches_both_tracks(routes):
    requests = rest_requests() + [HttpRequest("POST" if ":" in p else "GET", p) for p in readme_paths()]
    assert len(readme_paths()) >= 4, readme_paths()
    for request in requests:
        found = gateway_api.route_http(routes["HTTPRoute"], request)
        assert found is not None, f"{request.method} {request.path} gets the gateway's 404"
        route, rule = found
        assert set(gateway_api.weights(rule)) == routes["backends"], request
        assert len(rule["backendRefs"]) == 2 and all(ref["port"] == routes["rest_port"] for ref in rule["backendRefs"])


def test_the_verbs_need_exact_matches_because_pathprefix_compares_whole_elements():
    # The specification's own example (PathMatchType, httproute_types.go): /abc, /abc/, /abc/def match /abc; /abcd
    # does not; and so neither does /v1/models/taxi:predict match the prefix /v1/models/taxi.
    for path in ("/abc", "/abc/", "/abc/def"):
        assert gateway_api.path_matches("PathPrefix", "/abc", path)
    assert not gateway_api.path_matches("PathPrefix", "/abc", "/abcd")
    assert not gateway_api.path_matches("PathPrefix", "/v1/models/taxi", "/v1/models/taxi:predict")
    assert gateway_api.path_matches("PathPrefix", "/v1/models/taxi", "/v1/models/taxi/versions/2:predict")
    assert not gateway_api.path_matches("Exact", "/abc", "/abc/")
    # The route before this fix: one PathPrefix rule. The README's own request found nothing.
    old = [{"kind": "HTTPRoute", "metadata": {"name": "old", "namespace": "x"}, "spec": {"rules": [
        {"matches": [{"path": {"type": "PathPrefix", "value": "/v1/models/taxi"}}], "backendRefs": []}]}}]
    assert gateway_api.route_http(old, HttpRequest("POST", "/v1/models/taxi:predict")) is None


def test_precedence_exact_then_longest_prefix_then_method_then_first_rule():
    def route(name, *rules, created=""):
        return {"kind": "HTTPRoute", "metadata": {"name": name, "namespace": "x", "creationTimestamp": created},
                "spec": {"rules": [{"matches": m, "backendRefs": [{"name": b}]} for m, b in rules]}}

    prefix = [{"path": {"type": "PathPrefix", "value": "/v1"}}]
    longer = [{"path": {"type": "PathPrefix", "value": "/v1/models"}}]
    exact = [{"path": {"type": "Exact", "value": "/v1/models/taxi"}}]
    post = [{"path": {"type": "PathPrefix", "value": "/v1/models"}, "method": "POST"}]
    routes = [route("a", (prefix, "short"), (longer, "long")), route("b", (exact, "exact"), (post, "post"))]

    def backend(method, path, candidates=routes):
        found = gateway_api.route_http(candidates, HttpRequest(method, path))
        return found and found[1]["backendRefs"][0]["name"]

    assert backend("GET", "/v1/models/taxi") == "exact"
    assert backend("POST", "/v1/models/taxi/metadata") == "post"
    assert backend("GET", "/v1/models/taxi/metadata") == "long"
    assert backend("GET", "/v1/other") == "short"
    assert backend("GET", "/v2") is None
    # Ties: the older route, then the name, then the first rule.
    twins = [route("z", (prefix, "z-old"), created="2026-01-01T00:00:00Z"),
             route("y", (prefix, "y-new"), (prefix, "y-second"), created="2026-02-01T00:00:00Z")]
    assert backend("GET", "/v1", twins) == "z-old"
    assert backend("GET", "/v1", [route("y", (prefix, "y-first"), (prefix, "y-second")), route("z", (prefix, "z"))]
                   ) == "y-first"


def test_nothing_else_of_the_servers_is_reachable_through_the_gateway(routes):
    for method, path in (("GET", "/monitoring/prometheus/metrics"), ("POST", "/v1/models/taxi2:predict"),
                         ("GET", "/v1/models/taxicab/metadata"), ("GET", "/v1/models"), ("GET", "/"),
                         ("POST", "/v1/models/iris:predict"), ("POST", "/v1/models/taxi:predict/x")):
        assert gateway_api.route_http(routes["HTTPRoute"], HttpRequest(method, path)) is None, path


class _RecordingChannel:
    """Stands for a grpc.Channel: records the method paths (`/package.Service/Method`) a stub is built with."""

    def __init__(self) -> None:
        self.paths: dict[str, str] = {}

    def unary_unary(self, path, *args, **kwargs):
        self.paths[path.rsplit("/", 1)[1]] = path
        return path

    unary_stream = stream_unary = stream_stream = unary_unary


def stub_paths() -> dict[str, dict[str, str]]:
    """The wire paths of every method of TF Serving's two services, as the official stubs send them."""
    from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

    out = {}
    for attribute, stub in (("_prediction", prediction_service_pb2_grpc.PredictionServiceStub),
                            ("_models", model_service_pb2_grpc.ModelServiceStub)):
        channel = _RecordingChannel()
        stub(channel)
        out[attribute] = channel.paths
    return out


def grpc_methods_the_client_calls() -> set[tuple[str, str]]:
    """The stub methods serving/clients/transports.py's GrpcClient calls (`self._prediction.Predict`...), as
    (service, method)."""
    import ast

    paths = stub_paths()
    called = set()
    for node in ast.walk(ast.parse((REPO / "serving/clients/transports.py").read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr in paths:
            service, method = paths[node.value.attr][node.attr].lstrip("/").split("/")
            called.add((service, method))
    return called


def test_every_grpc_method_clients_call_is_routed_and_the_admin_one_is_not(routes):
    called = grpc_methods_the_client_calls()
    assert called == {("tensorflow.serving.PredictionService", "Predict"),
                      ("tensorflow.serving.PredictionService", "GetModelMetadata"),
                      ("tensorflow.serving.ModelService", "GetModelStatus")}
    prediction = {tuple(p.lstrip("/").split("/")) for p in stub_paths()["_prediction"].values()}
    assert len(prediction) == 5  # Classify, Regress, Predict, MultiInference, GetModelMetadata
    for service, method in called | prediction:
        found = gateway_api.route_grpc(routes["GRPCRoute"], service, method)
        assert found is not None, f"/{service}/{method} is not routed"
        assert set(gateway_api.weights(found[1])) == routes["backends"]
        assert all(ref["port"] == routes["grpc_port"] for ref in found[1]["backendRefs"])
    assert stub_paths()["_models"]["HandleReloadConfigRequest"]
    assert gateway_api.route_grpc(routes["GRPCRoute"], "tensorflow.serving.ModelService",
                                  "HandleReloadConfigRequest") is None
    assert gateway_api.route_grpc(routes["GRPCRoute"], "grpc.reflection.v1alpha.ServerReflection",
                                  "ServerReflectionInfo") is None
    # Core support only: every match names a service and a method (grpcroute_types.go GRPCMethodMatch).
    for rule in routes["GRPCRoute"][0]["spec"]["rules"]:
        assert all(m["method"].get("service") and m["method"].get("method") for m in rule["matches"])


def test_the_routes_attach_to_the_example_gateway_and_only_from_the_serving_namespace(routes):
    gateway_objects = render(REPO / "k8s/serving/gateway-envoy")
    gateways = [o for o in gateway_objects if o["kind"] == "Gateway"]
    labels = {routes["namespace"]: {"kubernetes.io/metadata.name": routes["namespace"]}}
    http, grpc = routes["HTTPRoute"][0], routes["GRPCRoute"][0]
    assert gateway_api.attached_listeners(http, gateways, labels) == ["gateway-system/mlops-gateway/http"]
    assert gateway_api.attached_listeners(grpc, gateways, labels) == ["gateway-system/mlops-gateway/grpc"]
    # Without allowedRoutes a listener admits only its Gateway's own namespace: the routes would not attach.
    bare = yaml.safe_load(yaml.safe_dump(gateways))
    for listener in bare[0]["spec"]["listeners"]:
        listener.pop("allowedRoutes")
    assert gateway_api.attached_listeners(http, bare, labels) == []
    # A route of another namespace does not attach either.
    other = {**http, "metadata": {**http["metadata"], "namespace": "elsewhere"}}
    assert gateway_api.attached_listeners(other, gateways, {"elsewhere": {"kubernetes.io/metadata.name": "x"}}) == []


def test_the_gateway_names_are_one_kustomize_variable(tmp_path):
    """k8s/serving/gateway/values.yaml sets the Gateway's name and namespace in the routes and the example Gateway,
    and the proxies' namespace in the NetworkPolicy."""
    copy = tmp_path / "serving"
    shutil.copytree(REPO / "k8s/serving", copy)
    values = copy / "gateway/values.yaml"
    values.write_text(values.read_text().replace("name: mlops-gateway", "name: edge")
                      .replace("namespace: gateway-system", "namespace: ingress")
                      .replace("proxyNamespace: envoy-gateway-system", "proxyNamespace: proxies"))
    for route in [o for o in render(copy / "bootstrap") if o["kind"].endswith("Route")]:
        assert [(r["name"], r["namespace"]) for r in route["spec"]["parentRefs"]] == [("edge", "ingress")]
    [gateway] = [o for o in render(copy / "gateway-envoy") if o["kind"] == "Gateway"]
    assert (gateway["metadata"]["name"], gateway["metadata"]["namespace"]) == ("edge", "ingress")
    [policy] = [o for o in render(copy / "base") if o["kind"] == "NetworkPolicy"]
    assert policy["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "proxies"}
