"""The rollout controller's Role grants exactly the API calls its backend makes: a missing verb fails here, not on the
cluster, and a needless one fails too. The calls are read from rollout/kube.py itself (every
`self.<api>.<verb>_namespaced_<kind>(...)` of the backend's class, its bases and the classes it builds), mapped to
RBAC (group, resource, verb) the way the API server's request info does it (k8s.io/apiserver
pkg/endpoints/request/requestinfo.go, v0.31.0: GET of an object is `get`, of a collection `list`, POST `create`, PUT
`update`, PATCH `patch`, DELETE `delete`; a `proxy` subresource of pods is `pods/proxy`)."""
from __future__ import annotations

import ast
import re

import pytest

from tests.k8s.render import REPO, render

KUBE = REPO / "rollout/kube.py"
VERBS = {"read": "get", "list": "list", "create": "create", "replace": "update", "patch": "patch", "delete": "delete",
         "get": "get"}
CORE_KINDS = {"config_map": ("", "configmaps"), "pod": ("", "pods"), "pod_proxy": ("", "pods/proxy"),
              "pod_proxy_with_path": ("", "pods/proxy"), "lease": ("coordination.k8s.io", "leases"),
              "service": ("", "services"), "event": ("", "events")}
CUSTOM_PLURALS = {"httproutes": "gateway.networking.k8s.io", "grpcroutes": "gateway.networking.k8s.io",
                  "inferences": "serving.kubedl.io", "modelversions": "model.kubedl.io", "tfjobs": "training.kubedl.io"}
CALL = re.compile(r"^(connect_get|read|list|create|replace|patch|delete|get)_namespaced_(\w+)$")
# The controller's Lease (issue 24): created, read, and updated to renew, take over or release it. Counted whether
# or not kube.py has it yet, so the Role is ready for it.
LEASE = {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")}


def _classes() -> dict[str, ast.ClassDef]:
    return {n.name: n for n in ast.parse(KUBE.read_text()).body if isinstance(n, ast.ClassDef)}


def _plurals(node: ast.AST, owner: ast.ClassDef) -> set[str]:
    """The custom-object plurals a function names: string literals and class tuples like INFERENCES it refers to
    (a function naming none, like a `_route(plural, name)` helper, counts as calling every plural of its class)."""
    found = {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in CUSTOM_PLURALS}
    constants = {}
    for statement in owner.body:
        if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Tuple):
            values = {e.value for e in statement.value.elts if isinstance(e, ast.Constant)}
            for target in statement.targets:
                if isinstance(target, ast.Name):
                    constants[target.id] = values & set(CUSTOM_PLURALS)
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and n.attr in constants:
            found |= constants[n.attr]
    return found


def api_calls(class_name: str) -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every Kubernetes API call the class makes, with its bases and the kube.py classes
    it constructs."""
    classes = _classes()
    seen, todo, calls = set(), [class_name], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in classes:
            continue
        seen.add(name)
        owner = classes[name]
        todo += [b.id for b in owner.bases if isinstance(b, ast.Name)]
        todo += [n.func.id for n in ast.walk(owner) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
        class_plurals = _plurals(owner, owner)
        for function in [n for n in ast.walk(owner) if isinstance(n, ast.FunctionDef)]:
            for node in ast.walk(function):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                match = CALL.match(node.func.attr)
                if not match:
                    continue
                verb, kind = VERBS.get(match.group(1), "get"), match.group(2)
                if kind == "custom_object":
                    plurals = _plurals(function, owner) or class_plurals
                    assert plurals, f"{name}.{function.name}: which custom resource does it call?"
                    calls |= {(CUSTOM_PLURALS[p], p, verb) for p in plurals}
                else:
                    assert kind in CORE_KINDS, f"{name}.{function.name}: {node.func.attr} is not mapped"
                    calls.add((*CORE_KINDS[kind], verb))
    return calls


def role(kustomization: str) -> tuple[dict, list[dict]]:
    objects = render(kustomization)
    [found] = [o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == "rollout-controller"]
    return found, objects


def granted(rules: list[dict]) -> dict[tuple[str, str, str], set[str] | None]:
    """(group, resource, verb) -> the resourceNames it is limited to (None: any name)."""
    out: dict[tuple[str, str, str], set[str] | None] = {}
    for rule in rules:
        names = set(rule["resourceNames"]) if rule.get("resourceNames") else None
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb), rule
                    previous = out.get((group, resource, verb), set())
                    out[(group, resource, verb)] = None if names is None or previous is None else previous | names
    return out


def named(settings, backend: str) -> dict[tuple[str, str], set[str]]:
    """The objects a backend reads and writes by name (create and list cannot be limited to names)."""
    if backend == "kubernetes":
        return {("", "configmaps"): {settings.stable_config_map, settings.canary_config_map,
                                     settings.state_config_map},
                ("gateway.networking.k8s.io", "httproutes"): {settings.http_route},
                ("gateway.networking.k8s.io", "grpcroutes"): {settings.grpc_route}}
    return {("", "configmaps"): {f"{settings.inference}-rollout"},
            ("gateway.networking.k8s.io", "httproutes"): {settings.http_route},
            ("gateway.networking.k8s.io", "grpcroutes"): {settings.grpc_route}}


@pytest.mark.parametrize("backend, class_name, kustomization", [
    ("kubernetes", "KubernetesBackend", "k8s/serving/base"),
    ("kubedl", "KubeDLBackend", "k8s/kubedl"),
])
def test_the_role_grants_what_the_backend_calls_and_nothing_more(backend, class_name, kustomization):
    from settings.config import RolloutConfig

    settings = getattr(RolloutConfig(), backend)
    needed = api_calls(class_name) | LEASE
    assert ("", "pods", "list") in needed and ("", "pods/proxy", "get") in needed
    found, objects = role(kustomization)
    rules = granted(found["rules"])
    assert set(rules) == needed, f"missing {needed - set(rules)}, needless {set(rules) - needed}"
    for (group, resource, verb), names in rules.items():
        if verb in ("create", "list"):
            assert names is None, f"{verb} {resource} cannot be limited to resourceNames"
        elif names is not None:
            assert named(settings, backend).get((group, resource), set()) <= names, (resource, verb, names)
    # The Role is bound to the account the controller runs as, in the namespace the backend works in.
    assert found["metadata"]["namespace"] == settings.namespace
    [binding] = [o for o in objects if o["kind"] == "RoleBinding" and o["roleRef"]["name"] == "rollout-controller"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rollout-controller",
                                    "namespace": settings.namespace}]


def test_the_rollout_job_runs_the_controller_as_that_account():
    objects = render("k8s/serving/rollout-job")
    [job] = [o for o in objects if o["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "rollout-controller" and pod["automountServiceAccountToken"] is True
    assert job["metadata"]["name"] == "rollout-v2"
    [container] = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    args = [a.replace("$(ROLLOUT_VERSION)", env["ROLLOUT_VERSION"]) for a in container["args"]]
    assert args[:4] == ["rollout", "start", "--version", "2"] and "rollout.backend=kubernetes" in args
    # Its pods carry the label the servers' NetworkPolicy admits.
    assert job["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == "rollout-controller"


def test_a_missing_or_needless_verb_is_found():
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
    assert set(granted(rules)) == {("", "pods", "list"), ("", "pods", "watch")}
    calls = api_calls("KubernetesBackend")
    assert ("", "configmaps", "update") in calls and ("gateway.networking.k8s.io", "httproutes", "update") in calls
    assert ("", "pods", "watch") not in calls
