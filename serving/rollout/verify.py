"""The checks before each traffic step: golden requests (eval rows) answered by the candidate over REST and gRPC must
agree with the stable version, and the candidate's error rate and p99 latency over a window must stay in bounds."""
from __future__ import annotations

import csv
import glob
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.rollout.backends import Backend
from serving.rollout.metrics import window_figures


class GoldenDataError(ValueError):
    """No golden rows could be read; the message names the path to fix."""


def _csv_rows(path: Path, count: int) -> list[dict[str, Any]]:
    files = sorted(path.glob("*.csv")) if path.is_dir() else [path]
    rows: list[dict[str, Any]] = []
    for file in files:
        with file.open(newline="") as f:
            for row in csv.DictReader(f):
                rows.append(row)
                if len(rows) == count:
                    return rows
    return rows


def _eval_split_rows(pipeline_root: str, count: int) -> list[dict[str, Any]]:
    import tensorflow as tf

    splits = sorted(glob.glob(os.path.join(pipeline_root, "CsvExampleGen", "examples", "*", "Split-eval")),
                    key=lambda p: int(p.split(os.sep)[-2]))
    if not splits:
        return []
    files = sorted(glob.glob(os.path.join(splits[-1], "*.gz")))
    rows = []
    for record in tf.data.TFRecordDataset(files, compression_type="GZIP").take(count):
        example = tf.train.Example.FromString(record.numpy())
        row: dict[str, Any] = {}
        for name, feature in example.features.feature.items():
            values = getattr(feature, feature.WhichOneof("kind") or "bytes_list").value
            value = values[0] if values else ""
            row[name] = value.decode() if isinstance(value, bytes) else value
        rows.append(row)
    return rows


def load_golden_rows(golden_data: str, pipeline_root: str, count: int) -> list[dict[str, Any]]:
    """`count` eval rows: from `golden_data` (a CSV file or a folder of them) or the pipeline's newest eval split."""
    if golden_data:
        path = Path(golden_data)
        if not path.exists():
            raise GoldenDataError(f"rollout.golden_data {path} does not exist; point it at a CSV file or folder of "
                                  "eval rows, or leave it empty to use the pipeline's eval split.")
        rows = _csv_rows(path, count)
    else:
        rows = _eval_split_rows(pipeline_root, count)
    if not rows:
        raise GoldenDataError(f"no golden rows found in {golden_data or pipeline_root + ' (eval split)'}; run the "
                              "pipeline first or set rollout.golden_data to a CSV of eval rows.")
    return rows


@dataclass(frozen=True)
class Limits:
    max_abs_diff: float
    max_error_rate: float
    max_p99_ms: float
    window_seconds: float
    requests_per_second: float
    timeout_s: float


def _max_diff(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> float:
    """The largest difference between two answers' numbers (probabilities, or values) over every row."""
    from serving.client import numeric_values

    return max((abs(x - y) for row_a, row_b in zip(a, b, strict=True)
                for x, y in zip(numeric_values(row_a), numeric_values(row_b), strict=True)), default=0.0)


class Verifier:
    def __init__(self, backend: Backend, model: str, rows: list[dict[str, Any]], limits: Limits,
                 log: Callable[[str], None] = print, sleep: Callable[[float], None] = time.sleep) -> None:
        self.backend = backend
        self.model = model
        self.rows = rows
        self.limits = limits
        self.log = log
        self.sleep = sleep

    def _address(self, version: int) -> dict[str, Any]:
        # A KubeDL predictor serves one version under its own numbering: ask it for its model, unversioned.
        return {"version": version} if self.backend.supports_labels else {}

    def golden(self, stable: int, candidate: int) -> dict[str, Any]:
        """Candidate vs stable on every golden row, over REST and over gRPC, on every canary server."""
        from serving.client import GrpcClient, RestClient, ServingError

        stable_endpoint = self.backend.endpoints("stable")[0]
        opts = {"timeout": self.limits.timeout_s, "drop_unknown_features": True}
        figures: dict[str, Any] = {"rows": len(self.rows), "rest_max_abs_diff": 0.0, "grpc_max_abs_diff": 0.0,
                                   "rest_grpc_max_abs_diff": 0.0}
        try:
            with RestClient(stable_endpoint.rest) as rest:
                reference = rest.predict_outputs(self.rows, self.model, **self._address(stable), **opts)
            for endpoint in self.backend.endpoints("canary"):
                with RestClient(endpoint.rest) as rest, GrpcClient(endpoint.grpc) as grpc:
                    by_rest = rest.predict_outputs(self.rows, self.model, **self._address(candidate), **opts)
                    by_grpc = grpc.predict_outputs(self.rows, self.model, **self._address(candidate), **opts)
                figures["rest_max_abs_diff"] = max(figures["rest_max_abs_diff"], _max_diff(reference, by_rest))
                figures["grpc_max_abs_diff"] = max(figures["grpc_max_abs_diff"], _max_diff(reference, by_grpc))
                figures["rest_grpc_max_abs_diff"] = max(figures["rest_grpc_max_abs_diff"], _max_diff(by_rest, by_grpc))
        except (ServingError, OSError) as e:
            figures["error"] = f"golden requests failed: {e}"
            return figures
        worst = max(figures["rest_max_abs_diff"], figures["grpc_max_abs_diff"])
        if worst > self.limits.max_abs_diff:
            figures["error"] = (f"candidate {candidate} disagrees with stable {stable} on the golden rows: max |diff| "
                                f"{worst:.6f} > rollout.max_abs_diff {self.limits.max_abs_diff}")
        return figures

    def window(self, candidate: int) -> dict[str, Any]:
        """The candidate watched for window_seconds while the verifier sends it golden rows (REST and gRPC in turn);
        the figures come from the canary servers' metrics where the backend has them, else from these requests."""
        from serving.client import GrpcClient, RestClient, ServingError

        metrics = self.backend.metrics
        before = metrics.snapshot(self.model) if metrics is not None else None
        endpoints = self.backend.endpoints("canary")
        clients = [c for e in endpoints for c in (RestClient(e.rest, retries=0), GrpcClient(e.grpc, retries=0))]
        latencies: list[float] = []
        errors = 0
        interval = 1.0 / self.limits.requests_per_second
        deadline = time.monotonic() + self.limits.window_seconds
        sent = 0
        try:
            while sent == 0 or time.monotonic() < deadline:
                client = clients[sent % len(clients)]
                row = self.rows[sent % len(self.rows)]
                started = time.monotonic()
                try:
                    client.predict_outputs(row, self.model, timeout=self.limits.timeout_s,
                                           drop_unknown_features=True, **self._address(candidate))
                    latencies.append((time.monotonic() - started) * 1000.0)
                except (ServingError, OSError):
                    errors += 1
                sent += 1
                self.sleep(max(0.0, interval - (time.monotonic() - started)))
        finally:
            for client in clients:
                client.close()
        after = metrics.snapshot(self.model, fresh_after=time.time()) if metrics is not None else None
        if before is not None and after is not None:
            figures = {"source": metrics.name, **window_figures(before.counters.get("canary", {}).values(),
                                                                after.counters.get("canary", {}).values())}
        else:
            latencies.sort()
            p99 = latencies[min(len(latencies) - 1, math.ceil(0.99 * len(latencies)) - 1)] if latencies else math.inf
            figures = {"source": "verifier", "requests": sent, "errors": errors, "error_rate": errors / sent,
                       "p99_ms": round(p99, 3)}
        figures["seconds"] = self.limits.window_seconds
        if figures["requests"] == 0:
            figures["error"] = "the window counted no request to the candidate"
        elif figures["error_rate"] > self.limits.max_error_rate:
            figures["error"] = (f"error rate {figures['error_rate']:.4f} > rollout.max_error_rate "
                                f"{self.limits.max_error_rate}")
        elif figures["p99_ms"] > self.limits.max_p99_ms:
            figures["error"] = f"p99 latency {figures['p99_ms']:.1f} ms > rollout.max_p99_ms {self.limits.max_p99_ms}"
        return figures
