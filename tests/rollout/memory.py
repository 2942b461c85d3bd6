"""A backend held in memory for the controller's tests (milliseconds, no server): two tracks whose servers follow
their config at once, as `mlops serve` does after its next poll, a canary weight, and a log of every write. A hook
called after each write or state commit can stop the controller right there (`Stop`), as a SIGKILL would; scripted
verifiers, clients and metrics feed the gate."""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from rollout.backends import Backend, BackendError, Endpoint, ServerView
from rollout.metrics import MetricsSource, ModelCounters, Snapshot
from rollout.state import LocalStateStore

MODEL = "tiny"
ENDPOINTS = {"stable": [Endpoint("http://stable", "stable:1")], "canary": [Endpoint("http://canary", "canary:1")]}


class Stop(BaseException):
    """The controller stops here, as killed: nothing catches it (a BaseException, like KeyboardInterrupt)."""


class HookedStore(LocalStateStore):
    """The local state file; `after_save(document)` runs right after each write landed."""

    def __init__(self, base_dir, model: str = MODEL) -> None:
        super().__init__(base_dir, model)
        self.after_save: Callable[[dict[str, Any]], None] = lambda document: None

    def save(self, document: dict[str, Any], token: str) -> str:
        token = super().save(document, token)
        self.after_save(document)
        return token


class MemoryBackend(Backend):
    name = "memory"

    def __init__(self, store, stable: int = 1, published: tuple[int, ...] = (1, 2, 3, 4, 5),
                 metrics: MetricsSource | None = None) -> None:
        super().__init__(store, ENDPOINTS, metrics)
        self.configs: dict[str, tuple[list[int], dict[str, int]]] = {
            "stable": ([stable], {"stable": stable}), "canary": ([stable], {"canary": stable})}
        self.weight = 0
        self.published = set(published)
        # Versions whose load fails on a track's servers: {track: {version: error}}.
        self.failing: dict[str, dict[int, str]] = {"stable": {}, "canary": {}}
        self.writes: list[tuple] = []
        self.after_write: Callable[[tuple], None] = lambda write: None
        # Label moves TF Serving refuses: a label may only name a version the track already served before the write
        # ("labels can be assigned only to model versions that are already loaded and available", tensorflow/serving
        # 2.16 docs/serving_config.md; ServerCore::UpdateModelVersionLabelMap in model_servers/server_core.cc).
        self.refused_labels: list[tuple[str, str, int]] = []
        # Why the routes carry no traffic (a route no gateway took), as KubernetesBackend.check_routing reads it.
        self.detached = ""
        # What the track's server answers at /monitoring/failures/<model> (serving/server/failures.py), by track.
        self.kept_failures: dict[str, list[dict[str, Any]]] = {"stable": [], "canary": []}
        # What the track's servers answer at /monitoring/answers/<model>/<since> (serving/server/answers.py), and
        # whether its router mirrors (rollout.shadow), with the share it copies now.
        self.kept_answers: dict[str, list[dict[str, Any]]] = {"stable": [], "canary": []}
        self.mirrors = False
        self.mirrored = 0

    def served(self) -> dict[str, Any]:
        """What `Controller.served_state` reads back, straight from the fake."""
        return {track: {"versions": list(self.configs[track][0]), "labels": dict(self.configs[track][1])}
                for track in ("stable", "canary")} | {"canary_weight": self.weight}

    def track_config(self, model: str, track: str) -> tuple[list[int], dict[str, int]]:
        assert model == MODEL, f"a backend call for model {model!r}"
        versions, labels = self.configs[track]
        return list(versions), dict(labels)

    def set_track(self, model: str, track: str, versions: list[int], labels: dict[str, int]) -> None:
        assert model == MODEL, f"a backend call for model {model!r}"
        wanted = (sorted(versions), dict(labels))
        if self.configs[track] == wanted:
            return
        if any(v not in versions for v in labels.values()):
            raise BackendError(f"labels {labels} must point at served versions {versions}.")
        if self.supports_labels:
            self.refused_labels += [(track, label, version) for label, version in labels.items()
                                    if version not in self.configs[track][0]]
        self.configs[track] = wanted
        self._wrote(("set_track", track, wanted[0], wanted[1]))

    def _wrote(self, write: tuple) -> None:
        self.writes.append(write)
        self.after_write(write)

    def version_views(self, model: str, track: str, version: int) -> list[ServerView]:
        assert model == MODEL, f"a backend call for model {model!r}"
        if version in self.failing[track] and version in self.configs[track][0]:
            return [ServerView(f"{track}-0", "END", self.failing[track][version])]
        state = "AVAILABLE" if version in self.configs[track][0] else "NOT_FOUND"
        return [ServerView(f"{track}-0", state)]

    def label_views(self, model: str, track: str, label: str) -> list[int | None]:
        assert model == MODEL, f"a backend call for model {model!r}"
        version = self.configs[track][1].get(label)
        return [version if version not in self.failing[track] else None]

    def server_gets(self, track: str, version: int, path: str) -> list[tuple[str, int, str]]:
        if path.startswith(f"/monitoring/answers/{MODEL}/"):
            since = int(path.rsplit("/", 1)[1]) / 1000.0
            kept = [a for a in self.kept_answers[track] if a["time"] > since]
            return [(f"{track}-0", 200, json.dumps({"answers": kept, "instance": track, "dropped": False,
                                                    "oldest": kept[0]["time"] if kept else None}))]
        assert path == f"/monitoring/failures/{MODEL}", path
        return [(f"{track}-0", 200, json.dumps({"failures": self.kept_failures[track]}))]

    def can_mirror(self) -> bool:
        return self.mirrors

    def set_shadow_percent(self, percent: int) -> None:
        if not self.mirrors:
            super().set_shadow_percent(percent)
        elif self.mirrored != percent:
            self.mirrored = percent
            self._wrote(("mirror", percent))

    def shadow_percent(self) -> int:
        return self.mirrored

    def set_canary_weight(self, percent: int) -> None:
        if self.weight == percent:
            return
        self.weight = percent
        self._wrote(("weight", percent))

    def canary_weight(self) -> int:
        return self.weight

    def check_version(self, model: str, version: int) -> None:
        assert model == MODEL, f"a backend call for model {model!r}"
        if version not in self.published:
            raise BackendError(f"version {version} of {model!r} is not published.")

    def check_routing(self) -> None:
        if self.detached:
            raise BackendError(self.detached)


class OneVersionBackend(MemoryBackend):
    """A track serves one version and answers no label, as KubeDLBackend (rollout/kube.py) does: the highest
    version its config names."""

    name = "one-version"
    supports_labels = False

    def loaded_versions(self, versions: list[int]) -> list[int]:
        return [max(versions)]

    def set_track(self, model: str, track: str, versions: list[int], labels: dict[str, int]) -> None:
        version = max(versions)
        super().set_track(model, track, [version], {track: version})

    def label_views(self, model: str, track: str, label: str) -> list[int | None]:
        raise NotImplementedError("one version per server: no labels")


class ScriptedVerifier:
    """Golden and window verdicts by step weight: `fail_at` weights fail their window, `inconclusive_at` weights give
    inconclusive windows (as many times as listed), and a `golden_error` fails every golden comparison."""

    def __init__(self, fail_at: tuple[int | str, ...] = (), inconclusive_at: list[int] | None = None,
                 golden_error: str = "", fail_after_promotion: bool = False) -> None:
        self.fail_at = fail_at
        self.golden_error = golden_error
        self.fail_after_promotion = fail_after_promotion
        # The versions of each window on the stable servers after the traffic moved there.
        self.stable_windows: list[int] = []
        self.inconclusive_at = list(inconclusive_at or [])
        self.windows: list[int | str] = []
        self._weight = 0

    def golden(self, stable: int, candidate: int) -> dict[str, Any]:
        assert isinstance(stable, int) and isinstance(candidate, int) and stable != candidate, (stable, candidate)
        return {"rows": 3, "rest_max_abs_diff": 0.0, "grpc_max_abs_diff": 0.0, "rest_grpc_max_abs_diff": 0.0,
                **({"error": self.golden_error} if self.golden_error else {})}

    def window(self, candidate: int, weight: int) -> dict[str, Any]:
        assert isinstance(candidate, int), candidate
        self.windows.append(weight)
        figures: dict[str, Any] = {"source": "scripted", "seconds": 0, "requests": 10, "errors": 0,
                                   "error_rate": 0.0, "p99_ms": 1.0}
        if weight in self.fail_at:
            figures["error"] = f"error rate 0.5 > rollout.max_error_rate 0.01 at {weight}%"
        elif weight in self.inconclusive_at:
            self.inconclusive_at.remove(weight)
            figures["inconclusive"] = "no metrics from the canary server(s) canary-0 (failed scrape)"
        return figures


    def shadow_window(self, stable: int, candidate: int) -> dict[str, Any]:
        self.windows.append("shadow")
        figures: dict[str, Any] = {"source": "shadow", "traffic": "users", "percent": 100, "seconds": 0,
                                   "requests": 10, "errors": 0, "error_rate": 0.0, "p99_ms": 1.0}
        if "shadow" in self.fail_at:
            figures["error"] = "the candidate's decisions disagree with stable's on 5 of 10 rows"
        return figures

    def stable_window(self, version: int) -> dict[str, Any]:
        self.stable_windows.append(version)
        figures: dict[str, Any] = {"source": "scripted", "traffic": "users", "version": version, "seconds": 0,
                                   "requests": 40, "errors": 0, "error_rate": 0.0, "predictions": 40, "p99_ms": 1.0,
                                   "verdict": "passed"}
        if self.fail_after_promotion and len(self.stable_windows) == 1:
            figures.update(p99_ms=900.0, verdict="failed", error="p99 latency 900.0 ms of version 2 on the stable "
                                                                 "servers > rollout.max_p99_ms 500")
        return figures


class ScriptedClient:
    """A REST or gRPC client whose answers a function of (rows, version) gives; `fail` raises instead."""

    def __init__(self, answer: Callable[[list[dict], int | None], list[dict]], error: Exception | None = None,
                 latency_ms: float = 0.0, clock: list[float] | None = None) -> None:
        self.answer = answer
        self.error = error
        self.calls = 0
        self.latency_ms = latency_ms
        self.clock = clock
        # (model, version, keyword arguments) of every call.
        self.requests: list[tuple[str, int | None, dict[str, Any]]] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def close(self) -> None:
        pass

    def predict_outputs(self, rows, model: str, version: int | None = None, **options: Any) -> list[dict]:
        self.calls += 1
        self.requests.append((model, version, options))
        if self.clock is not None:
            self.clock[0] += self.latency_ms / 1000.0
        if self.error is not None:
            raise self.error
        rows = [rows] if isinstance(rows, dict) else list(rows)
        return self.answer(rows, version)


def counters(ok: float = 0, errors: float = 0, latency_us: dict[float, float] | None = None) -> ModelCounters:
    """One server's cumulative counters: `ok` successful predictions (all in the bucket `latency_us` names, default
    the 1 ms bucket), `errors` failed requests."""
    buckets = latency_us if latency_us is not None else {1000.0: ok, float("inf"): ok}
    return ModelCounters({"OK": ok, **({"INTERNAL": errors} if errors else {})}, buckets)


class ScriptedMetrics(MetricsSource):
    """Snapshots in the order given; each call takes the next one."""

    name = "prometheus"

    def __init__(self, *snapshots: Snapshot | Exception) -> None:
        self.snapshots = list(snapshots)
        self.calls: list[float | None] = []
        self.models: list[str] = []

    def snapshot(self, model: str, fresh_after: float | None = None) -> Snapshot:
        self.calls.append(fresh_after)
        self.models.append(model)
        next_one = self.snapshots.pop(0)
        if isinstance(next_one, Exception):
            raise next_one
        return next_one
