"""What the controller acts on: server tracks (stable and canary), each with its model config, its servers' view of
each version, and the traffic weight between them. `local` is `mlops serve` processes on this machine reading the
repository's models.config and models.canary.config; the cluster backends are in rollout/kube.py."""
from __future__ import annotations

import json
import os
import tempfile
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from rollout.metrics import MetricsSource
from rollout.state import LocalStateStore, StateStore
from serving.repository.base import RepositoryError
from serving.repository.local import ModelRepository
from serving.server.failures import FAILURES_PATH
from settings.errors import UserError

TRACKS = ("stable", "canary")


class BackendError(UserError, RuntimeError):
    """The backend cannot do what the rollout needs (a server or object is missing); the message says what to do."""

    exit_code = 2


@dataclass(frozen=True)
class Endpoint:
    rest: str
    grpc: str


@dataclass(frozen=True)
class ServerView:
    """One server's answer about one version: AVAILABLE, LOADING, END (with the error), NOT_FOUND or UNREACHABLE."""

    server: str
    state: str
    error: str = ""


class Backend(ABC):
    name = "backend"
    # False where a track serves one version and TF Serving labels do not apply (KubeDL predictors).
    supports_labels = True

    def __init__(self, store: StateStore, endpoints: dict[str, list[Endpoint]],
                 metrics: MetricsSource | None = None) -> None:
        self.store = store
        self._endpoints = endpoints
        # None only where no monitoring runs (a local backend without the local stack): the verifier then measures
        # its own requests and says so in the window's `source`.
        self.metrics = metrics

    def endpoints(self, track: str) -> list[Endpoint]:
        """Where golden and window requests for a track go."""
        return self._endpoints[track]

    @abstractmethod
    def track_config(self, model: str, track: str) -> tuple[list[int], dict[str, int]]:
        """The versions a track's config serves and its labels."""

    @abstractmethod
    def set_track(self, model: str, track: str, versions: list[int], labels: dict[str, int]) -> None:
        """Makes the track's config serve `versions` with `labels` (nothing is written when it already does)."""

    def loaded_versions(self, versions: list[int]) -> list[int]:
        """The versions a track actually loads for a config naming `versions`."""
        return sorted(versions)

    @abstractmethod
    def version_views(self, model: str, track: str, version: int) -> list[ServerView]:
        """Every server of the track, about `version`."""

    @abstractmethod
    def label_views(self, model: str, track: str, label: str) -> list[int | None]:
        """The version `label` resolves to on every server of the track (None: not set there yet)."""

    @abstractmethod
    def server_gets(self, track: str, version: int, path: str) -> list[tuple[str, int, str]]:
        """GET `path` on the REST port of every server of the track that serves `version`: (server, HTTP status,
        body), status 0 where nothing answered."""

    def failures(self, model: str, track: str, version: int, since: float) -> tuple[list[dict[str, Any]], list[str]]:
        """The failed predictions of `version` (or of no version: the request named one that was not there) the
        track's servers kept since `since` (serving/server/failures.py), and the servers that could not be read."""
        found: list[dict[str, Any]] = []
        unread: list[str] = []
        for server, status, body in self.server_gets(track, version, f"{FAILURES_PATH}/{quote(model, safe='')}"):
            try:
                kept = json.loads(body)["failures"] if status == 200 else None
            except (ValueError, KeyError, TypeError):
                kept = None
            if not isinstance(kept, list):
                unread.append(f"{server}: {status or 'no answer'} {body[:200]}".strip())
                continue
            found.extend(f for f in kept if isinstance(f, dict) and f.get("version") in (version, None)
                         and isinstance(f.get("time"), (int, float)) and f["time"] >= since)
        return found, unread

    @abstractmethod
    def set_canary_weight(self, percent: int) -> None:
        """Routes `percent` of the traffic to the canary track, the rest to the stable track."""

    @abstractmethod
    def canary_weight(self) -> int:
        """The canary track's current share of the traffic, in percent."""

    def can_mirror(self) -> bool:
        """Whether the router can copy requests to the canary (the shadow step, rollout/mirror.py)."""
        return False

    def set_shadow_percent(self, percent: int) -> None:
        """Copies `percent` of the requests to the canary track besides routing them (0: none)."""
        if percent:
            raise BackendError(f"the {self.name} backend's router cannot mirror requests; set rollout.shadow.percent "
                               "to 0.")

    def shadow_percent(self) -> int:
        """The share of the requests copied to the canary, in percent, as the router applies it."""
        return 0

    def publication(self, model: str, version: int) -> dict[str, Any]:
        """What the version's publication.json says (its task and calibrated threshold); empty where it cannot be
        read."""
        return {}

    @abstractmethod
    def check_version(self, model: str, version: int) -> None:
        """Raises BackendError when `version` cannot be rolled out (not published, files changed)."""

    @abstractmethod
    def check_routing(self) -> None:
        """Raises BackendError when the routes that split the traffic do not carry it (a route no gateway took)."""


class LocalBackend(Backend):
    """`mlops serve --model-config <repo>/models.config` (stable) and `--model-config <repo>/models.canary.config`
    (canary) processes. With the local stack (`mlops deploy local`, rollout/local_stack.py) the weight and the shadow
    step's mirror are its Envoy's, set through its routes and read back from its admin interface, and `metrics` is its
    Prometheus; without it the weight is only recorded (<repo>/.rollouts/<model>-routes.json) and the verifier's own
    requests are what a window measures. The recorded weight is kept in both cases: a stack started later begins
    with it."""

    name = "local"

    def __init__(self, base_dir: str | Path, model: str, endpoints: dict[str, list[Endpoint]],
                 timeout_s: float = 5.0, router=None, metrics: MetricsSource | None = None) -> None:
        super().__init__(LocalStateStore(base_dir, model), endpoints, metrics)
        self.base_dir = Path(base_dir)
        self.model = model
        self.timeout_s = timeout_s
        self.routes_path = self.base_dir / ".rollouts" / f"{model}-routes.json"
        # The local stack's rollout.envoy.EnvoyRouter, or None where no router runs.
        self.router = router

    def _repository(self, track: str) -> ModelRepository:
        return ModelRepository.for_track(self.base_dir, track)

    def track_config(self, model: str, track: str) -> tuple[list[int], dict[str, int]]:
        repository = self._repository(track)
        return repository.served_versions(model), repository.labels(model)

    def set_track(self, model: str, track: str, versions: list[int], labels: dict[str, int]) -> None:
        if self.track_config(model, track) == (sorted(versions), dict(labels)):
            return
        try:
            self._repository(track).serve(model, versions, labels)
        except RepositoryError as e:
            raise BackendError(str(e)) from e

    def _rest(self, track: str):
        from serving.clients import RestClient

        return [RestClient(endpoint.rest, retries=0) for endpoint in self.endpoints(track)]

    def version_views(self, model: str, track: str, version: int) -> list[ServerView]:
        from serving.clients import ModelNotFoundError, ServingError

        views = []
        for client in self._rest(track):
            with client:
                try:
                    [status] = client.status(model, version=version, timeout=self.timeout_s)
                    views.append(ServerView(client.address, status.state, status.error_message))
                except ModelNotFoundError:
                    views.append(ServerView(client.address, "NOT_FOUND"))
                except (ServingError, OSError) as e:
                    views.append(ServerView(client.address, "UNREACHABLE", str(e)))
        return views

    def label_views(self, model: str, track: str, label: str) -> list[int | None]:
        from serving.clients import ServingError

        # Metadata, as TF Serving's model status ignores a label (see KubernetesBackend's label views).
        versions: list[int | None] = []
        for client in self._rest(track):
            with client:
                try:
                    versions.append(client.metadata(model, label=label, timeout=self.timeout_s).version)
                except (ServingError, OSError):
                    versions.append(None)
        return versions

    def server_gets(self, track: str, version: int, path: str) -> list[tuple[str, int, str]]:
        answers = []
        for endpoint in self.endpoints(track):
            url = endpoint.rest.rstrip("/") + path
            try:
                with urllib.request.urlopen(url, timeout=self.timeout_s) as response:
                    answers.append((endpoint.rest, response.status, response.read().decode(errors="replace")))
            except urllib.error.HTTPError as e:
                answers.append((endpoint.rest, e.code, e.read().decode(errors="replace")))
            except (urllib.error.URLError, OSError) as e:
                answers.append((endpoint.rest, 0, f"GET {url}: {getattr(e, 'reason', e)}"))
        return answers

    def set_canary_weight(self, percent: int) -> None:
        if self.router is not None and self.router.canary_weight() != percent:
            self.router.set_canary_weight(percent)
        if self.recorded_canary_weight() == percent and self.routes_path.exists():
            return
        self.routes_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".routes.", dir=self.routes_path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump({"stable": 100 - percent, "canary": percent}, f)
        os.replace(tmp, self.routes_path)

    def canary_weight(self) -> int:
        if self.router is not None:
            return self.router.canary_weight()
        return self.recorded_canary_weight()

    def can_mirror(self) -> bool:
        return self.router is not None

    def set_shadow_percent(self, percent: int) -> None:
        if self.router is None:
            super().set_shadow_percent(percent)
        elif self.router.shadow_percent() != percent:
            self.router.set_shadow_percent(percent)

    def shadow_percent(self) -> int:
        return self.router.shadow_percent() if self.router is not None else 0

    def publication(self, model: str, version: int) -> dict[str, Any]:
        return ModelRepository(self.base_dir).publication(model, version)

    def recorded_canary_weight(self) -> int:
        try:
            return int(json.loads(self.routes_path.read_text())["canary"])
        except (OSError, ValueError, KeyError):
            return 0

    def check_routing(self) -> None:
        return None  # no routes: the local router's weight is set and read back by the controller itself

    def check_version(self, model: str, version: int) -> None:
        check_published_version(self.base_dir, model, version)


def check_published_version(base_dir: str | Path, model: str, version: int) -> None:
    """Raises BackendError unless `version` of `model` is published under `base_dir` and matches its checksums."""
    repository = ModelRepository(base_dir)
    if version not in repository.versions(model):
        raise BackendError(f"version {version} of {model!r} is not published under {repository.model_dir(model)} "
                           f"(published: {repository.versions(model)}); run the pipeline or pick one of those.")
    check = repository.verify(model, version)
    if check.state == "MISMATCH":
        raise BackendError(f"version {version} of {model!r} does not match its checksum manifest "
                           f"({'; '.join(check.problems[:5])}); publish it again as a new version.")
