"""The published CRD schemas kept in tests/fixtures/crds (extract.py wrote them from each project's CRD), made as
strict as the API server's strict field validation: an unknown field is an error wherever the CRD lists the fields."""
from __future__ import annotations

import json
from pathlib import Path

CRDS = Path(__file__).resolve().parents[1] / "fixtures" / "crds"
CRD_FILES = {
    ("gateway.networking.k8s.io", "HTTPRoute"): "httproute.gateway.networking.k8s.io.json",
    ("gateway.networking.k8s.io", "GRPCRoute"): "grpcroute.gateway.networking.k8s.io.json",
    ("gateway.networking.k8s.io", "Gateway"): "gateway.gateway.networking.k8s.io.json",
    ("gateway.networking.k8s.io", "GatewayClass"): "gatewayclass.gateway.networking.k8s.io.json",
    ("monitoring.coreos.com", "PodMonitor"): "podmonitor.monitoring.coreos.com.json",
    ("serving.kubedl.io", "Inference"): "inference.serving.kubedl.io.json",
    ("model.kubedl.io", "ModelVersion"): "modelversion.model.kubedl.io.json",
    ("kubeflow.org", "TFJob"): "tfjob.kubeflow.org.json",
    ("training.kubedl.io", "TFJob"): "tfjob.training.kubedl.io.json",
}


def strict(schema):
    """The CRD schema with unknown fields refused wherever the CRD lists the fields and does not preserve others."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema and not schema.get(
                "x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def crd_schema(group: str, kind: str, version: str) -> dict:
    """The strict openAPIV3Schema of `kind` in `group`/`version`; metadata is the API server's ObjectMeta, not part
    of a CRD's schema, so any object passes there."""
    crd = json.loads((CRDS / CRD_FILES[(group, kind)]).read_text())
    schema = strict(crd["versions"][version])
    schema["properties"]["metadata"] = {"type": "object"}
    return schema
