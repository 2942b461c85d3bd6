"""The rollout's routing check (issue 42 item 10) against the real API server (tests/k8s/controlplane.py) as
k8s/serving's rollout-controller account, with route status computed by Envoy Gateway's own translator (egctl, `make
envoy-gateway`). No Envoy Gateway controller runs here, so the test writes the status the translator computed through
the status subresource, as the controller's status updater would (gateway internal/provider/kubernetes/
status_updater.go). egctl's loader keeps no generation and leaves lastTransitionTime empty, so the test stamps both
as the controller does: each condition's observedGeneration is the generation it judged (SetRouteStatusCondition,
internal/gatewayapi/status/route.go) and lastTransitionTime the time of the write (MergeConditions, conditions.go)."""
from __future__ import annotations

import copy
import datetime

import pytest
import yaml

from rollout.backends import BackendError, Endpoint
from rollout.envoy import EGCTL, GatewayObjects, translator_answer
from rollout.kube import GATEWAY, KubernetesBackend
from settings.config import RolloutKubernetesConfig
from tests.k8s.render import render
from tests.rollout.conftest import MODEL

NAMESPACE = "route-status"
ACCOUNT = f"system:serviceaccount:{NAMESPACE}:rollout-controller"
PLURALS = {"HTTPRoute": "httproutes", "GRPCRoute": "grpcroutes"}
ANSWER_KEYS = {"HTTPRoute": "httpRoutes", "GRPCRoute": "grpcRoutes"}


@pytest.fixture(scope="module")
def routes(control_plane):
    """k8s/serving/bootstrap's routes and k8s/serving/base's rollout-controller account in their own namespace, the
    routes as `kubectl apply` creates them: without status."""
    if not EGCTL.exists():
        pytest.fail(f"{EGCTL} is missing: run `make envoy-gateway`.")
    control_plane.namespace(NAMESPACE)
    objects = [o for o in render("k8s/serving/base") if o["kind"] in ("ServiceAccount", "Role", "RoleBinding")]
    objects += GatewayObjects.from_repository().routes
    for o in objects:
        o["metadata"]["namespace"] = NAMESPACE
        for subject in o.get("subjects", []):
            subject["namespace"] = NAMESPACE
    control_plane.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(objects))


def backend_as_the_account(control_plane) -> KubernetesBackend:
    api = control_plane.api_client()
    api.set_default_header("Impersonate-User", ACCOUNT)
    endpoints = {"stable": [Endpoint("", "")], "canary": [Endpoint("", "")]}
    return KubernetesBackend(RolloutKubernetesConfig(namespace=NAMESPACE), MODEL, endpoints, 2, api=api)


def write_translated_status(control_plane, tmp_path) -> None:
    """Envoy Gateway's status for the routes as the API server holds them now (their generation included), each
    route placed in mlops-serving, the namespace the Gateway's listeners admit."""
    from kubernetes import client

    with control_plane.api_client() as admin:
        custom = client.CustomObjectsApi(admin)
        stored = {kind: custom.get_namespaced_custom_object(*GATEWAY, NAMESPACE, plural, name)
                  for kind, plural, name in (("HTTPRoute", "httproutes", "tfserving"),
                                             ("GRPCRoute", "grpcroutes", "tfserving-grpc"))}
        objects = GatewayObjects.from_repository()
        translated = []
        for route in stored.values():
            route = copy.deepcopy(route)
            route["metadata"] = {"name": route["metadata"]["name"], "namespace": "mlops-serving"}
            route.pop("status", None)
            translated.append(route)
        answer = translator_answer(GatewayObjects(objects.gateway, translated, objects.services), tmp_path)
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        for kind, route in stored.items():
            [computed] = [r for r in answer[ANSWER_KEYS[kind]] if r["metadata"]["name"] == route["metadata"]["name"]]
            for parent in computed["status"]["parents"]:
                for condition in parent["conditions"]:
                    condition.update(lastTransitionTime=now, observedGeneration=route["metadata"]["generation"])
            custom.patch_namespaced_custom_object_status(*GATEWAY, NAMESPACE, PLURALS[kind],
                                                         route["metadata"]["name"], {"status": computed["status"]})


def test_routes_no_controller_took_refuse_the_rollout(control_plane, routes):
    with pytest.raises(BackendError, match="no gateway controller took it"):
        backend_as_the_account(control_plane).check_routing()


def test_routes_the_gateway_accepted_pass(control_plane, routes, tmp_path):
    write_translated_status(control_plane, tmp_path)
    backend_as_the_account(control_plane).check_routing()


def test_a_weight_the_controller_has_not_processed_yet_is_waited_for(control_plane, routes, tmp_path):
    """The backend's own write bumps the route's generation; the status still judges the one before."""
    write_translated_status(control_plane, tmp_path)
    backend = backend_as_the_account(control_plane)
    backend.set_canary_weight(10)
    with pytest.raises(BackendError, match="has not processed the routes' latest change within 2s") as refused:
        backend.check_routing()
    assert "Accepted judged generation 1, the route is at 2" in str(refused.value)
    write_translated_status(control_plane, tmp_path)
    backend.check_routing()


def test_a_route_naming_a_listener_the_gateway_lacks_is_refused_with_the_translators_reason(
        control_plane, routes, tmp_path):
    from kubernetes import client

    with control_plane.api_client() as admin:
        custom = client.CustomObjectsApi(admin)
        route = custom.get_namespaced_custom_object(*GATEWAY, NAMESPACE, "grpcroutes", "tfserving-grpc")
        route["spec"]["parentRefs"][0]["sectionName"] = "grpcs"
        custom.replace_namespaced_custom_object(*GATEWAY, NAMESPACE, "grpcroutes", "tfserving-grpc", route)
    write_translated_status(control_plane, tmp_path)
    with pytest.raises(BackendError, match=r"GRPCRoute route-status/tfserving-grpc on gateway-system/mlops-gateway/"
                                           r"grpcs: Accepted=False \(NoMatchingParent: ") as refused:
        backend_as_the_account(control_plane).check_routing()
    assert "HTTPRoute" not in str(refused.value)
