"""Whether a Gateway API route carries traffic, read from the status its Gateway's controller wrote (Gateway API v1.3
apis/v1/shared_types.go RouteStatus: one RouteParentStatus per parentRef the controller handles, with the conditions
Accepted and ResolvedRefs, each stamped with the route generation it judged). A route no controller took, one that a
listener refuses, or one whose backends do not resolve sends no user traffic where its weights say, whatever they
say; the rollout refuses to start on it instead of judging windows that cannot mean anything."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

# The conditions a route's parent entry must hold (True) for the route to carry traffic on that parent.
REQUIRED = ("Accepted", "ResolvedRefs")


class RouteStatus(NamedTuple):
    # What keeps the route from carrying traffic, one phrase each; empty when it does.
    problems: list[str]
    # Parents whose conditions judged an older generation of the route (its latest change not processed yet).
    stale: list[str]


def _parent(ref: Mapping[str, Any], route_namespace: str) -> tuple[str, str, str]:
    return ref.get("namespace") or route_namespace, ref["name"], ref.get("sectionName", "")


def route_status(kind: str, route: Mapping[str, Any]) -> RouteStatus:
    """The route's own status against its spec: each parentRef needs an entry whose required conditions are True."""
    metadata = route["metadata"]
    namespace = metadata.get("namespace") or "default"
    name = f"{kind} {namespace}/{metadata['name']}"
    generation = metadata.get("generation")
    entries = (route.get("status") or {}).get("parents") or []
    if not entries:
        return RouteStatus([f"{name}: no gateway controller took it (its status names no parent)"], [])
    problems: list[str] = []
    stale: list[str] = []
    for ref in route.get("spec", {}).get("parentRefs", []):
        parent = _parent(ref, namespace)
        where = f"{name} on {parent[0]}/{parent[1]}" + (f"/{parent[2]}" if parent[2] else "")
        found = [e for e in entries if _parent(e.get("parentRef", {}), namespace) == parent]
        if not found:
            problems.append(f"{where}: no status from that parent's controller")
            continue
        conditions = {c["type"]: c for e in found for c in e.get("conditions", [])}
        for wanted in REQUIRED:
            condition = conditions.get(wanted)
            if condition is None:
                problems.append(f"{where}: no {wanted} condition")
            elif generation is not None and condition.get("observedGeneration", generation) < generation:
                stale.append(f"{where}: {wanted} judged generation {condition['observedGeneration']}, the route is at "
                             f"{generation}")
            elif condition["status"] != "True":
                problems.append(f"{where}: {wanted}={condition['status']} ({condition.get('reason', '')}: "
                                f"{condition.get('message', '')})")
    return RouteStatus(problems, stale)
