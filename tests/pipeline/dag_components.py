"""Small TFX components for pipeline/local/dag_runner.py's tests: each records where and when it ran. They live in a
module of their own because a stage worker process imports them by name."""
# No `from __future__ import annotations`: TFX reads these annotations as types.

import json
import os
import time

from tfx.dsl.component.experimental.annotations import InputArtifact, OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component
from tfx.types.standard_artifacts import Examples

from components.gates.anomalies import Anomaly, DataValidationError


def _record(log_dir: str, name: str, started: float) -> None:
    with open(os.path.join(log_dir, f"{name}.json"), "w") as f:
        json.dump({"pid": os.getpid(), "start": started, "end": time.time()}, f)


@component
def Source(log_dir: Parameter[str], data: OutputArtifact[Examples]) -> None:  # noqa: N802  (TFX's style)
    started = time.time()
    os.makedirs(data.uri, exist_ok=True)
    _record(log_dir, "Source", started)


@component
def Step(log_dir: Parameter[str], name: Parameter[str], seconds: Parameter[float], fail: Parameter[str],
         upstream: InputArtifact[Examples], data: OutputArtifact[Examples]) -> None:  # noqa: N802
    """Sleeps `seconds`, then fails as `fail` says ('' no, 'gate': DataValidationError, 'crash': ValueError)."""
    started = time.time()
    time.sleep(seconds)
    _record(log_dir, name, started)
    if fail == "gate":
        raise DataValidationError([Anomaly("train", name, "the data failed validation")], data.uri)
    if fail == "crash":
        raise ValueError(f"{name}: crashed")
    os.makedirs(data.uri, exist_ok=True)
