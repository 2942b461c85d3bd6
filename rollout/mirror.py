"""The shadow step's mirror on a route: Gateway API's RequestMirror filter (GEP-3171, `percent`: Standard for HTTPRoute
and GRPCRoute since v1.3; apis/v1/shared_types.go HTTPRequestMirrorFilter) on every rule, sending that share of the
rule's requests to a Service as well, whose answers the gateway discards. The kubernetes backends write it with the
routes' weights (rollout/kube.py) and the local stack's Envoy gets it through Envoy Gateway's translator
(rollout/envoy.py), which turns it into Envoy's request_mirror_policies (internal/xds/translator, v1.9.1)."""
from __future__ import annotations

from typing import Any

MIRROR = "RequestMirror"


def set_mirror(route: dict[str, Any], service: str, percent: int) -> bool:
    """Mirrors `percent` of every rule's requests to `service` (0: no mirror), at the port the rule's backendRef to
    that Service names; other filters are kept. Returns whether the route changed."""
    if not 0 <= percent <= 100:
        raise ValueError(f"a mirror's percent is between 0 and 100, got {percent}")
    changed = False
    for rule in route["spec"].get("rules", []):
        filters = rule.get("filters", [])
        kept = [f for f in filters if f.get("type") != MIRROR]
        if percent:
            ports = [ref.get("port") for ref in rule.get("backendRefs", []) if ref.get("name") == service]
            if not ports:
                raise ValueError(f"a rule of {route['kind']} {route['metadata']['name']} has no backendRef to "
                                 f"{service} to mirror to")
            backend = {"name": service, **({"port": ports[0]} if ports[0] is not None else {})}
            kept.append({"type": MIRROR, "requestMirror": {"backendRef": backend, "percent": percent}})
        if kept != filters:
            changed = True
            if kept:
                rule["filters"] = kept
            else:
                rule.pop("filters", None)
    return changed


def mirror_percent(route: dict[str, Any], service: str) -> int:
    """The share of the route's requests mirrored to `service`, the same on every rule (else ValueError)."""
    shares = set()
    for rule in route["spec"].get("rules", []):
        mirrors = [f["requestMirror"] for f in rule.get("filters", []) if f.get("type") == MIRROR
                   and f.get("requestMirror", {}).get("backendRef", {}).get("name") == service]
        shares.add(_percent(mirrors[0]) if mirrors else 0)
    if len(shares) > 1:
        raise ValueError(f"the rules of {route['kind']} {route['metadata']['name']} mirror different shares "
                         f"{sorted(shares)} to {service}")
    return shares.pop() if shares else 0


def _percent(mirror: dict[str, Any]) -> int:
    if "percent" in mirror:
        return int(mirror["percent"])
    if "fraction" in mirror:
        fraction = mirror["fraction"]
        return round(100 * int(fraction["numerator"]) / int(fraction.get("denominator", 100)))
    return 100  # neither: every request is mirrored (HTTPRequestMirrorFilter's default)
