"""The real control plane (tests/conftest.py's `control_plane`) with the namespaces the manifests under k8s/ use."""
from __future__ import annotations

import pytest
import yaml

from tests.k8s.render import REPO, render

KUSTOMIZATIONS = sorted(str(p.parent.relative_to(REPO)) for p in (REPO / "k8s").rglob("kustomization.yaml"))
# kind: Component: not applied alone, only through the kustomizations that include it.
COMPONENTS = {k for k in KUSTOMIZATIONS if yaml.safe_load((REPO / k / "kustomization.yaml").read_text())
              .get("kind") == "Component"}


@pytest.fixture(scope="session")
def cluster(control_plane):
    """The control plane with every namespace the manifests use (those they define as they define them, any other,
    one a user creates, labelled for the restricted Pod Security Standard) and kube-controller-manager running."""
    objects = [o for k in KUSTOMIZATIONS if k not in COMPONENTS for o in render(k)]
    defined = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Namespace"}
    control_plane.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(list(defined.values())))
    used = {o["metadata"]["namespace"] for o in objects if "namespace" in o["metadata"]}
    for name in sorted(used - set(defined)):
        control_plane.namespace(name)
    # Its serviceaccount controller gives each namespace the account `default`, which a pod without one runs as.
    control_plane.start_controller_manager()
    for name in sorted(used | set(defined)):
        control_plane.wait_for("serviceaccount", "default", name)
    return control_plane
