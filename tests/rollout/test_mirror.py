"""The shadow step's RequestMirror filter on the project's routes (rollout/mirror.py), as the kubernetes backends write
it and the local stack's Envoy gets it: every rule mirrors to the canary Service at the port its backendRef names,
other filters stay, 0 removes it, and the share is read back from `percent` or `fraction` as Gateway API v1.3
defines them. Envoy Gateway's translator accepting the result is tests/rollout/test_envoy_router.py's subject."""
from __future__ import annotations

import copy

import pytest
import yaml

from rollout.mirror import mirror_percent, set_mirror
from tests.rollout.conftest import REPO_ROOT

ROUTES = list(yaml.safe_load_all((REPO_ROOT / "k8s/serving/bootstrap/routes.yaml").read_text()))
CANARY = "tfserving-canary"


@pytest.mark.parametrize("route", ROUTES, ids=[r["kind"] for r in ROUTES])
def test_every_rule_mirrors_to_the_canary_at_its_backend_port_and_zero_removes_it(route):
    route = copy.deepcopy(route)
    assert mirror_percent(route, CANARY) == 0
    assert set_mirror(route, CANARY, 25) is True
    port = {"HTTPRoute": 8501, "GRPCRoute": 8500}[route["kind"]]
    for rule in route["spec"]["rules"]:
        assert rule["filters"] == [{"type": "RequestMirror",
                                    "requestMirror": {"backendRef": {"name": CANARY, "port": port}, "percent": 25}}]
    assert mirror_percent(route, CANARY) == 25 and mirror_percent(route, "tfserving-stable") == 0
    assert set_mirror(route, CANARY, 25) is False, "nothing to write when it already mirrors that share"
    assert set_mirror(route, CANARY, 100) is True and mirror_percent(route, CANARY) == 100
    assert set_mirror(route, CANARY, 0) is True
    assert all("filters" not in rule for rule in route["spec"]["rules"]) and mirror_percent(route, CANARY) == 0
    assert set_mirror(route, CANARY, 0) is False


def test_other_filters_are_kept_and_a_missing_backend_or_share_out_of_range_is_refused():
    route = copy.deepcopy(ROUTES[0])
    header = {"type": "RequestHeaderModifier", "requestHeaderModifier": {"add": [{"name": "x", "value": "1"}]}}
    route["spec"]["rules"][0]["filters"] = [header]
    set_mirror(route, CANARY, 1)
    assert route["spec"]["rules"][0]["filters"][0] == header and len(route["spec"]["rules"][0]["filters"]) == 2
    set_mirror(route, CANARY, 0)
    assert route["spec"]["rules"][0]["filters"] == [header]
    with pytest.raises(ValueError, match="has no backendRef to tfserving-other to mirror to"):
        set_mirror(route, "tfserving-other", 10)
    for percent in (-1, 101):
        with pytest.raises(ValueError, match="between 0 and 100"):
            set_mirror(route, CANARY, percent)


@pytest.mark.parametrize("mirror, percent", [
    ({"percent": 7}, 7), ({"fraction": {"numerator": 1, "denominator": 3}}, 33),
    ({"fraction": {"numerator": 5}}, 5), ({}, 100)])
def test_the_share_is_read_from_percent_or_fraction_and_a_bare_filter_mirrors_everything(mirror, percent):
    route = copy.deepcopy(ROUTES[0])
    route["spec"]["rules"][0]["filters"] = [{"type": "RequestMirror",
                                             "requestMirror": {"backendRef": {"name": CANARY}, **mirror}}]
    assert mirror_percent(route, CANARY) == percent


def test_rules_that_mirror_different_shares_are_refused():
    route = copy.deepcopy(ROUTES[0])
    route["spec"]["rules"].append(copy.deepcopy(route["spec"]["rules"][0]))
    set_mirror(route, CANARY, 10)
    route["spec"]["rules"][1]["filters"][0]["requestMirror"]["percent"] = 20
    with pytest.raises(ValueError, match=r"mirror different shares \[10, 20\]"):
        mirror_percent(route, CANARY)
