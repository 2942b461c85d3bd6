"""The manifests as `kubectl kustomize` renders them, with the tools venv's kubectl (make setup builds it)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
KUBECTL = REPO / ".venv-tools" / "bin" / "kubectl"


def render(kustomization: str | Path) -> list[dict]:
    """Every object of a kustomization (a folder under the repository, or any path)."""
    if not KUBECTL.exists():
        pytest.fail(f"{KUBECTL} is missing: run `make setup` (it builds .venv-tools from requirements-tools.lock).")
    result = subprocess.run([str(KUBECTL), "kustomize", str(REPO / kustomization)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]
