"""The Kubernetes API calls the rollout backends make, read from rollout/kube.py itself (every
`self.<api>.<verb>_namespaced_<kind>(...)` of a backend's class, its bases and the classes it builds), mapped to
RBAC (group, resource, verb) the way the API server's request info does it (k8s.io/apiserver
pkg/endpoints/request/requestinfo.go, v0.31.0: GET of an object is `get`, of a collection `list`, POST `create`, PUT
`update`, PATCH `patch`, DELETE `delete`; a `proxy` subresource of pods is `pods/proxy`)."""
from __future__ import annotations

import ast
import re

from tests.k8s.render import REPO

KUBE = REPO / "rollout/kube.py"
VERBS = {"read": "get", "list": "list", "create": "create", "replace": "update", "patch": "patch", "delete": "delete",
         "get": "get"}
CORE_KINDS = {"config_map": ("", "configmaps"), "pod": ("", "pods"), "pod_proxy": ("", "pods/proxy"),
              "pod_proxy_with_path": ("", "pods/proxy"), "lease": ("coordination.k8s.io", "leases"),
              "service": ("", "services"), "event": ("", "events")}
CUSTOM_PLURALS = {"httproutes": "gateway.networking.k8s.io", "grpcroutes": "gateway.networking.k8s.io",
                  "inferences": "serving.kubedl.io", "modelversions": "model.kubedl.io", "tfjobs": "training.kubedl.io"}
CALL = re.compile(r"^(connect_get|read|list|create|replace|patch|delete|get)_namespaced_(\w+)$")
# Methods only a controller outside the cluster runs, with its user's own credentials, never a manifest's account:
# the pod proxy (rollout.<backend>.status_reads resolves `auto` to it only without an in-cluster config).
OUTSIDE_CLUSTER_ONLY = {"_proxy_get"}
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


def api_calls(class_name: str, in_cluster: bool = True) -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every Kubernetes API call the class makes, with its bases and the kube.py classes
    it constructs; in the cluster, without OUTSIDE_CLUSTER_ONLY's."""
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
        for function in [n for n in ast.walk(owner) if isinstance(n, ast.FunctionDef)
                         and not (in_cluster and n.name in OUTSIDE_CLUSTER_ONLY)]:
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
