"""rollout/route_status.py: whether a route carries traffic, read from its status (issue 42 item 10), each rule just
inside and just outside. The statuses as Envoy Gateway writes them are read in tests/rollout/test_route_status_real.py
(the translator's own status on a real API server)."""
from __future__ import annotations

import copy

from rollout.route_status import route_status

GATEWAY_REF = {"name": "mlops-gateway", "namespace": "gateway-system", "sectionName": "http"}


def condition(kind: str, status: str = "True", generation: int = 3, reason: str = "") -> dict:
    return {"type": kind, "status": status, "observedGeneration": generation, "reason": reason or kind,
            "message": f"{kind} is {status}"}


def route(conditions: list[dict] | None, generation: int = 3, parent_ref: dict | None = None) -> dict:
    obj = {"metadata": {"name": "tfserving", "namespace": "mlops-serving", "generation": generation},
           "spec": {"parentRefs": [GATEWAY_REF]}}
    if conditions is not None:
        obj["status"] = {"parents": [{"parentRef": parent_ref or dict(GATEWAY_REF),
                                      "controllerName": "gateway.envoyproxy.io/gatewayclass-controller",
                                      "conditions": conditions}]}
    return obj


def test_a_route_whose_parent_accepted_it_and_resolved_its_backends_carries_traffic():
    assert route_status("HTTPRoute", route([condition("Accepted"), condition("ResolvedRefs")])) == ([], [])


def test_a_route_no_controller_took_does_not():
    for status in (None, []):
        obj = route(None) if status is None else {**route(None), "status": {"parents": status}}
        problems, stale = route_status("HTTPRoute", obj)
        assert problems == ["HTTPRoute mlops-serving/tfserving: no gateway controller took it (its status names no "
                            "parent)"] and stale == []


def test_each_required_condition_must_be_true_and_present():
    for failing in ("Accepted", "ResolvedRefs"):
        conditions = [condition(c, "False" if c == failing else "True", reason="NotAllowedByListeners")
                      for c in ("Accepted", "ResolvedRefs")]
        problems, _ = route_status("GRPCRoute", route(conditions))
        assert problems == [f"GRPCRoute mlops-serving/tfserving on gateway-system/mlops-gateway/http: {failing}=False "
                            f"(NotAllowedByListeners: {failing} is False)"]
        problems, _ = route_status("GRPCRoute", route([c for c in conditions if c["type"] != failing]))
        assert problems == [f"GRPCRoute mlops-serving/tfserving on gateway-system/mlops-gateway/http: no {failing} "
                            "condition"]
    # Other conditions (an implementation's own) do not decide.
    conditions = [condition("Accepted"), condition("ResolvedRefs"), condition("PartiallyInvalid", "False")]
    assert route_status("HTTPRoute", route(conditions)) == ([], [])


def test_a_status_for_another_parent_does_not_count():
    other = {**GATEWAY_REF, "sectionName": "https"}
    problems, _ = route_status("HTTPRoute", route([condition("Accepted"), condition("ResolvedRefs")], parent_ref=other))
    assert problems == ["HTTPRoute mlops-serving/tfserving on gateway-system/mlops-gateway/http: no status from that "
                        "parent's controller"]
    # A parentRef without a namespace is the route's own namespace, on both sides.
    local = route([condition("Accepted"), condition("ResolvedRefs")], parent_ref={"name": "gw"})
    local["spec"]["parentRefs"] = [{"name": "gw", "namespace": "mlops-serving"}]
    assert route_status("HTTPRoute", local) == ([], [])


def test_a_status_judged_on_an_older_generation_is_stale_not_refused():
    just_current = route([condition("Accepted", generation=4), condition("ResolvedRefs", generation=4)], generation=4)
    assert route_status("HTTPRoute", just_current) == ([], [])
    one_behind = route([condition("Accepted", generation=3), condition("ResolvedRefs", generation=4)], generation=4)
    problems, stale = route_status("HTTPRoute", one_behind)
    assert problems == [] and stale == ["HTTPRoute mlops-serving/tfserving on gateway-system/mlops-gateway/http: "
                                        "Accepted judged generation 3, the route is at 4"]
    # A refusal of an older generation is waited for too: the latest change may have fixed it.
    refused_before = route([condition("Accepted", "False", generation=3), condition("ResolvedRefs", generation=4)],
                           generation=4)
    assert route_status("HTTPRoute", refused_before)[0] == []
    # No generation on either side (a translator's output): nothing to compare.
    bare = copy.deepcopy(route([condition("Accepted"), condition("ResolvedRefs")]))
    del bare["metadata"]["generation"]
    assert route_status("HTTPRoute", bare) == ([], [])
