"""The test control plane itself: missing binaries fail the tests with what to run (CI must not skip them), and the
one the session runs answers as the version tools/controlplane/go.mod pins, with every CRD Established."""
from __future__ import annotations

import json
import re

import pytest

from tests.k8s import controlplane


def test_missing_binaries_fail_with_what_to_run(tmp_path, monkeypatch):
    monkeypatch.setattr(controlplane, "BIN", tmp_path / "bin")
    plane = controlplane.ControlPlane(tmp_path)
    with pytest.raises(pytest.fail.Exception, match=r"run `make controlplane`"):
        plane.start()
    assert not plane.processes


def test_the_server_is_the_pinned_version_with_the_crds_established(control_plane):
    pinned = re.search(r"^\s*k8s.io/kubernetes (v\S+)$", (controlplane.REPO / "tools/controlplane/go.mod").read_text(),
                       re.M).group(1)
    version = json.loads(control_plane.kubectl("get", "--raw", "/version").stdout)
    assert version["gitVersion"] == pinned
    crds = json.loads(control_plane.kubectl("get", "crd", "-o", "json").stdout)["items"]
    names = {c["metadata"]["name"] for c in crds}
    assert {"httproutes.gateway.networking.k8s.io", "grpcroutes.gateway.networking.k8s.io",
            "gateways.gateway.networking.k8s.io", "gatewayclasses.gateway.networking.k8s.io",
            "podmonitors.monitoring.coreos.com", "tfjobs.kubeflow.org", "tfjobs.training.kubedl.io",
            "inferences.serving.kubedl.io", "modelversions.model.kubedl.io",
            "flinkdeployments.flink.apache.org"} <= names
    for crd in crds:
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conditions.get("Established") == "True", crd["metadata"]["name"]
    gateway = next(c for c in crds if c["metadata"]["name"] == "httproutes.gateway.networking.k8s.io")
    assert gateway["metadata"]["annotations"]["gateway.networking.k8s.io/bundle-version"] == "v1.3.0"
