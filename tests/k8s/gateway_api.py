"""Gateway API request matching, as the specification states it (kubernetes-sigs/gateway-api v1.3.0, the release
whose CRDs tests/fixtures/crds holds), for checking which backendRefs of which rule a request reaches, without a
gateway. Every function names the part of the specification it follows:

- apis/v1/httproute_types.go: `PathMatchType` (Exact: the whole path, case-sensitive; PathPrefix: element by element
  split by `/`, a trailing `/` ignored), `HTTPRouteMatch` (path, headers, query params and method all must match;
  a match without a path is PathPrefix `/`), `HTTPRouteRule.Matches` (the matches of a rule are ORed; a rule without
  matches matches every request; precedence across rules: Exact path, then the longest PathPrefix in characters, then
  a method match, then the most header matches, then the most query param matches; then the oldest Route, then
  `{namespace}/{name}` alphabetically, then the first rule of the Route);
- apis/v1/grpcroute_types.go: `GRPCMethodMatch` (Exact: service and method equal when given; an empty one matches
  any), `GRPCRouteRule.Matches` (ORed; none: every request; precedence by the characters of the matching service,
  then of the matching method, then header matches; then the oldest Route, then the name);
- apis/v1/gateway_types.go: `ParentReference` / `AllowedRoutes` (a Route attaches to a listener of the Gateway its
  parentRef names, by sectionName when given, when the listener admits the Route's namespace: `Same` by default,
  `All`, or `Selector` on the namespace's labels; and its kind: the kinds listed, else those of the protocol).

RegularExpression path matches are implementation-specific and not evaluated: a route using one fails here."""
from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit


def path_matches(match_type: str, value: str, path: str) -> bool:
    """httproute_types.go PathMatchType: Exact and PathPrefix."""
    path = urlsplit(path).path
    if match_type == "Exact":
        return path == value
    if match_type == "PathPrefix":
        want = [e for e in value.rstrip("/").split("/") if e]
        have = [e for e in path.rstrip("/").split("/") if e]
        return have[:len(want)] == want
    raise ValueError(f"path match type {match_type!r} is implementation-specific; use Exact or PathPrefix")


def _selector_matches(selector: dict | None, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector (matchLabels and matchExpressions) against labels; an empty selector matches all."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


@dataclass(frozen=True)
class HttpRequest:
    method: str
    path: str
    headers: tuple[tuple[str, str], ...] = ()


def http_match_key(match: dict, request: HttpRequest) -> tuple | None:
    """The precedence key of an HTTPRouteMatch that matches `request` (larger wins), else None."""
    path = match.get("path") or {"type": "PathPrefix", "value": "/"}
    if not path_matches(path.get("type", "PathPrefix"), path["value"], request.path):
        return None
    if match.get("method") and match["method"] != request.method:
        return None
    headers = {k.lower(): v for k, v in request.headers}
    for header in match.get("headers") or []:
        if header.get("type", "Exact") != "Exact" or headers.get(header["name"].lower()) != header["value"]:
            return None
    query = dict(part.split("=", 1) for part in urlsplit(request.path).query.split("&") if "=" in part)
    for param in match.get("queryParams") or []:
        if param.get("type", "Exact") != "Exact" or query.get(param["name"]) != param["value"]:
            return None
    exact = path.get("type") == "Exact"
    return (exact, 0 if exact else len(path["value"]), bool(match.get("method")), len(match.get("headers") or []),
            len(match.get("queryParams") or []))


def grpc_match_key(match: dict, service: str, method: str) -> tuple | None:
    """The precedence key of a GRPCRouteMatch that matches `service`/`method` (larger wins), else None."""
    method_match = match.get("method") or {}
    if method_match.get("type", "Exact") != "Exact":
        raise ValueError("RegularExpression gRPC method matches are implementation-specific")
    if method_match.get("service") and method_match["service"] != service:
        return None
    if method_match.get("method") and method_match["method"] != method:
        return None
    if match.get("headers"):
        return None  # the requests checked here carry no headers a route could select
    return (len(method_match.get("service") or ""), len(method_match.get("method") or ""), 0)


def _route_order(route: dict) -> tuple:
    """Ties across Routes: the oldest (creationTimestamp; unset sorts first), then `{namespace}/{name}`."""
    meta = route["metadata"]
    return (meta.get("creationTimestamp") or "", f"{meta.get('namespace', '')}/{meta['name']}")


def _select(routes: list[dict], key_of) -> tuple[dict, dict] | None:
    best = None
    for route in sorted(routes, key=_route_order):
        for rule in route["spec"].get("rules") or []:
            keys = [key_of(m) for m in rule.get("matches") or [{}]]
            keys = [k for k in keys if k is not None]
            if not keys:
                continue
            # Larger key wins; earlier route and earlier rule win ties (strict comparison keeps the first).
            if best is None or max(keys) > best[0]:
                best = (max(keys), route, rule)
    return (best[1], best[2]) if best else None


def route_http(routes: list[dict], request: HttpRequest) -> tuple[dict, dict] | None:
    """The (route, rule) an HTTP request reaches among HTTPRoutes attached to one listener; None: the gateway's 404."""
    return _select(routes, lambda match: http_match_key(match, request))


def route_grpc(routes: list[dict], service: str, method: str) -> tuple[dict, dict] | None:
    """The (route, rule) a gRPC call `/service/method` reaches among GRPCRoutes attached to one listener; None: the
    gateway answers UNIMPLEMENTED (or 404)."""
    return _select(routes, lambda match: grpc_match_key(match, service, method))


PROTOCOL_KINDS = {"HTTP": {"HTTPRoute", "GRPCRoute"}, "HTTPS": {"HTTPRoute", "GRPCRoute"}, "TLS": {"TLSRoute"},
                  "TCP": {"TCPRoute"}, "UDP": {"UDPRoute"}}


def attached_listeners(route: dict, gateways: list[dict], namespace_labels: dict[str, dict[str, str]]) -> list[str]:
    """The `gateway-namespace/gateway/listener` names the route attaches to (gateway_types.go AllowedRoutes,
    ParentReference). `namespace_labels`: each namespace's labels (kubernetes.io/metadata.name included)."""
    route_namespace = route["metadata"]["namespace"]
    attached = []
    for ref in route["spec"].get("parentRefs") or []:
        for gateway in gateways:
            meta = gateway["metadata"]
            if ref.get("kind", "Gateway") != "Gateway" or ref["name"] != meta["name"] or \
                    ref.get("namespace", route_namespace) != meta["namespace"]:
                continue
            for listener in gateway["spec"]["listeners"]:
                if ref.get("sectionName") and ref["sectionName"] != listener["name"]:
                    continue
                if ref.get("port") and ref["port"] != listener["port"]:
                    continue
                allowed = listener.get("allowedRoutes") or {}
                namespaces = allowed.get("namespaces") or {"from": "Same"}
                source = namespaces.get("from", "Same")
                if source == "Same" and route_namespace != meta["namespace"]:
                    continue
                if source == "Selector" and not _selector_matches(namespaces.get("selector"),
                                                                  namespace_labels.get(route_namespace, {})):
                    continue
                kinds = {k["kind"] for k in allowed.get("kinds") or []} or PROTOCOL_KINDS.get(listener["protocol"],
                                                                                               set())
                if route["kind"] in kinds:
                    attached.append(f"{meta['namespace']}/{meta['name']}/{listener['name']}")
    return attached


def weights(rule: dict) -> dict[str, int]:
    """backendRefs' weights (a backendRef without one weighs 1: HTTPBackendRef/BackendRef, +kubebuilder:default=1)."""
    return {ref["name"]: ref.get("weight", 1) for ref in rule.get("backendRefs") or []}
