"""RBAC as a real kube-apiserver's authorizer decides it (tests/k8s/controlplane.py), for each ServiceAccount the
manifests create: every API call its code makes is allowed (SubjectAccessReview, with the object names the code
uses), the account's rules as the authorizer lists them (SelfSubjectRulesReview, impersonating it) hold nothing
beyond those calls, and calls it must not make are refused, with the 403 the server answers an impersonated
request. The calls are read from the code: rollout/kube.py (tests/k8s/kube_calls.py) and
components/distributed/tfjob.py."""
from __future__ import annotations

import ast

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.k8s.kube_calls import LEASE, api_calls, named
from tests.k8s.render import REPO, render

# The kustomizations that create accounts, applied for real (their RBAC objects) before the reviews.
ACCOUNT_KUSTOMIZATIONS = ("k8s/serving/base", "k8s/kubedl", "k8s/training/base", "k8s/flink")
# An account no manifest grants anything: what the authorizer lists for it is what every account may do.
NOBODY = "system:serviceaccount:default:granted-nothing"
TFJOB = REPO / "components/distributed/tfjob.py"
TFJOB_GROUPS = ("kubeflow.org", "training.kubedl.io")


def service_account(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


@pytest.fixture(scope="module")
def accounts(cluster):
    """The ServiceAccounts, Roles and RoleBindings of the manifests, created; {(namespace, name): kustomization}."""
    found = {}
    for kustomization in ACCOUNT_KUSTOMIZATIONS:
        objects = [o for o in render(kustomization) if o["kind"] in ("ServiceAccount", "Role", "RoleBinding")]
        cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(objects))
        found |= {(o["metadata"]["namespace"], o["metadata"]["name"]): kustomization
                  for o in objects if o["kind"] == "ServiceAccount"}
    return found


def allowed(plane, user: str, namespace: str, group: str, resource: str, verb: str, name: str | None = None) -> bool:
    """The authorizer's answer for `user` (a ServiceAccount, with the groups the API server gives it)."""
    resource, _, subresource = resource.partition("/")
    attributes = client.V1ResourceAttributes(namespace=namespace, group=group, resource=resource, verb=verb,
                                             subresource=subresource or None, name=name)
    account_namespace = user.split(":")[2]
    review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
        user=user, groups=["system:serviceaccounts", f"system:serviceaccounts:{account_namespace}",
                           "system:authenticated"], resource_attributes=attributes))
    with plane.api_client() as api:
        return client.AuthorizationV1Api(api).create_subject_access_review(review).status.allowed


def rules(plane, user: str, namespace: str) -> set[tuple[str, str, str, str | None]]:
    """(group, resource, verb, name or None) the authorizer lists for `user` in `namespace`, impersonating it."""
    with plane.api_client() as api:
        api.set_default_header("Impersonate-User", user)
        review = client.AuthorizationV1Api(api).create_self_subject_rules_review(client.V1SelfSubjectRulesReview(
            spec=client.V1SelfSubjectRulesReviewSpec(namespace=namespace)))
    assert not review.status.incomplete, review.status.evaluation_error
    return {(group, resource, verb, name)
            for rule in review.status.resource_rules
            for group in rule.api_groups for resource in rule.resources for verb in rule.verbs
            for name in (rule.resource_names or [None])}


def impersonated_status(plane, user: str, call) -> int:
    """The HTTP status the API server answers `call(api_client)` made as `user` (200 when it succeeds)."""
    with plane.api_client() as api:
        api.set_default_header("Impersonate-User", user)
        try:
            call(api)
        except ApiException as error:
            return error.status
    return 200


def tfjob_calls() -> set[tuple[str, str, str]]:
    """(group, resource, verb) of the TFJob calls components/distributed/tfjob.py makes, read from its code."""
    verbs = {"create": "create", "get": "get", "delete": "delete", "list": "list", "patch": "patch",
             "replace": "update"}
    calls = {n.func.attr for n in ast.walk(ast.parse(TFJOB.read_text()))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr.endswith("_namespaced_custom_object")}
    assert calls, "tfjob.py makes no custom-object call?"
    return {(group, "tfjobs", verbs[c.split("_")[0]]) for c in calls for group in TFJOB_GROUPS}


def controller_cases():
    from settings.config import RolloutConfig

    for backend, class_name in (("kubernetes", "KubernetesBackend"), ("kubedl", "KubeDLBackend")):
        settings = getattr(RolloutConfig(), backend)
        yield pytest.param(settings.namespace, class_name, api_calls(class_name) | LEASE, named(settings, backend),
                           id=backend)


@pytest.mark.parametrize("namespace, class_name, calls, names", controller_cases())
def test_the_rollout_controller_may_make_its_calls_and_no_other(control_plane, accounts, namespace, class_name,
                                                                calls, names):
    assert (namespace, "rollout-controller") in accounts
    user = service_account(namespace, "rollout-controller")
    needed = set()
    for group, resource, verb in sorted(calls):
        targets = sorted(names.get((group, resource), ())) if verb not in ("create", "list") else []
        for name in targets or [None]:
            assert allowed(control_plane, user, namespace, group, resource, verb, name), \
                f"{class_name}: {verb} {resource} {name or ''} in {namespace} is refused"
            needed.add((group, resource, verb, name))
    granted = rules(control_plane, user, namespace) - rules(control_plane, NOBODY, namespace)
    unnamed = {(g, r, v) for g, r, v, n in needed if n is None}
    needless = {rule for rule in granted if rule not in needed and rule[:3] not in unnamed}
    assert not needless, f"the Role grants what {class_name} never calls: {sorted(needless, key=str)}"
    # A sample of what it must not do: another object, another namespace, secrets, pods' exec or proxy (in the
    # cluster it reads pods at their IPs), a delete.
    stable_config = sorted(names[("", "configmaps")])[0]
    for group, resource, verb, name, where in [
            ("", "configmaps", "get", "kube-root-ca.crt", namespace),
            ("", "configmaps", "update", stable_config, "default"),
            ("", "configmaps", "delete", stable_config, namespace),
            ("", "configmaps", "list", None, namespace),
            ("", "secrets", "get", None, namespace), ("", "secrets", "list", None, namespace),
            ("", "pods", "create", None, namespace), ("", "pods/exec", "create", None, namespace),
            ("", "pods/proxy", "get", None, namespace),
            ("apps", "deployments", "patch", None, namespace),
            ("gateway.networking.k8s.io", "httproutes", "update", "another-route", namespace),
            ("gateway.networking.k8s.io", "httproutes", "delete", sorted(names[(
                "gateway.networking.k8s.io", "httproutes")])[0], namespace),
            ("coordination.k8s.io", "leases", "delete", None, namespace),
            ("rbac.authorization.k8s.io", "roles", "update", "rollout-controller", namespace)]:
        assert not allowed(control_plane, user, where, group, resource, verb, name), (verb, resource, name, where)
    # The server itself answers 403 to the account's forbidden request, and lets through an allowed one (its
    # object is absent here: 404).
    assert impersonated_status(control_plane, user, lambda api: client.CoreV1Api(api).list_namespaced_secret(
        namespace)) == 403
    assert impersonated_status(control_plane, user, lambda api: client.CoreV1Api(api).read_namespaced_config_map(
        stable_config, namespace)) == 404


def test_the_pipeline_may_run_tfjobs_and_the_workers_call_nothing(control_plane, accounts):
    pipeline = service_account("mlops", "mlops-pipeline")
    assert ("mlops", "mlops-pipeline") in accounts and ("mlops", "mlops-trainer") in accounts
    for group, resource, verb in sorted(tfjob_calls()):
        assert allowed(control_plane, pipeline, "mlops", group, resource, verb, None if verb == "create" else "job"), \
            f"tfjob.py: {verb} {group}/{resource} is refused"
    for group, resource, verb, where in [("kubeflow.org", "tfjobs", "create", "default"),
                                         ("kubeflow.org", "tfjobs", "update", "mlops"),
                                         ("", "secrets", "get", "mlops"), ("", "pods", "create", "mlops"),
                                         ("", "pods/exec", "create", "mlops")]:
        assert not allowed(control_plane, pipeline, where, group, resource, verb), (verb, resource, where)
    assert rules(control_plane, service_account("mlops", "mlops-trainer"), "mlops") == \
        rules(control_plane, NOBODY, "mlops")


def test_the_flink_pods_get_no_rights(control_plane, accounts):
    """k8s/flink's JobManager, TaskManagers and job server (standalone mode: Flink creates no pods) run as an account
    granted nothing beyond what any authenticated user may do, and mount no token."""
    assert accounts[("mlops", "flink")] == "k8s/flink"
    flink = service_account("mlops", "flink")
    assert rules(control_plane, flink, "mlops") == rules(control_plane, NOBODY, "mlops")
    assert not allowed(control_plane, flink, "mlops", "", "pods", "create")
    assert not allowed(control_plane, flink, "mlops", "", "configmaps", "get")
    [account] = [o for o in render("k8s/flink") if o["kind"] == "ServiceAccount"]
    assert account["automountServiceAccountToken"] is False


def test_the_servers_and_the_monitor_get_no_rights(control_plane, accounts):
    """The serving pods' account and the monitor CronJob's (the namespace's default: it mounts no token) are granted
    nothing beyond what any authenticated user may do."""
    [cronjob] = [o for o in render("k8s/serving/monitor") if o["kind"] == "CronJob"]
    monitor_pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert monitor_pod["automountServiceAccountToken"] is False
    monitor_account = monitor_pod.get("serviceAccountName", "default")
    for name in ("tfserving", monitor_account):
        user = service_account("mlops-serving", name)
        assert rules(control_plane, user, "mlops-serving") == rules(control_plane, NOBODY, "mlops-serving")
        assert not allowed(control_plane, user, "mlops-serving", "", "configmaps", "get", "tfserving-rollout")
        assert impersonated_status(control_plane, user, lambda api: client.CoreV1Api(api).list_namespaced_pod(
            "mlops-serving")) == 403
