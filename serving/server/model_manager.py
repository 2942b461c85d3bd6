"""Which model versions are loaded and which labels point where, swapped atomically on every config change.

Requests read one immutable snapshot (no lock per request). A reload loads new versions first and then
publishes a new snapshot, so a version is unloaded only after its replacement is available.

A failed load is retried as TF Serving does (`--max_num_load_retries` times, `--load_retry_interval_micros`
apart; the version shows LOADING meanwhile and END once given up), and from scratch whenever anything in its
folder changes: a version whose files are still being copied is retried once they are complete, not given up on.
"""
from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tensorflow_serving.config import model_server_config_pb2

from serving import DEFAULT_LOAD_RETRY_INTERVAL_S, DEFAULT_MAX_NUM_LOAD_RETRIES
from serving.repository.base import RepositoryError, list_versions, validate_label, validate_model_name
from serving.server.errors import invalid_argument, not_found
from serving.server.servable import ServableLoadError, ServableVersion
from serving.server.warmup import load_and_warm_up
from settings.errors import UserError

logger = logging.getLogger(__name__)

SUPPORTED_PLATFORMS = frozenset({"", "tensorflow"})
# A version folder is fingerprinted by at most this many entries (a SavedModel has a handful).
MAX_FINGERPRINT_ENTRIES = 10_000


class ModelConfigError(UserError, ValueError):
    """A ModelServerConfig that cannot be applied at all; the message says what to fix."""

    exit_code = 2


@dataclass(frozen=True)
class VersionState:
    """A row of GetModelStatus: `state` is START, LOADING, AVAILABLE, UNLOADING or END."""

    version: int
    state: str
    error_code: str = "OK"
    error_message: str = ""


@dataclass(frozen=True)
class FailedLoad:
    """A version that failed to load: its folder as it was, the retries made since, and when the next is due."""

    fingerprint: str
    retries: int
    next_retry_at: float
    code: str
    reason: str


@dataclass(frozen=True)
class ModelSnapshot:
    name: str
    versions: Mapping[int, ServableVersion] = field(default_factory=dict)
    labels: Mapping[str, int] = field(default_factory=dict)

    def latest(self) -> ServableVersion | None:
        return self.versions[max(self.versions)] if self.versions else None


def validate_config(config: model_server_config_pb2.ModelServerConfig) -> None:
    """Raises ModelConfigError when `config` uses something this server cannot apply."""
    if config.HasField("custom_model_config"):
        raise ModelConfigError("custom_model_config is not supported; use model_config_list.")
    seen: set[str] = set()
    for model_config in config.model_config_list.config:
        try:
            validate_model_name(model_config.name)
            for label in model_config.version_labels:
                validate_label(label)
        except RepositoryError as e:
            raise ModelConfigError(str(e)) from e
        if model_config.name in seen:
            raise ModelConfigError(f"Model {model_config.name!r} appears twice in the config; keep one entry.")
        seen.add(model_config.name)
        if not model_config.base_path:
            raise ModelConfigError(f"Model {model_config.name!r} has no base_path; set it to the model's folder.")
        if model_config.model_platform not in SUPPORTED_PLATFORMS:
            raise ModelConfigError(
                f"Model {model_config.name!r} uses platform {model_config.model_platform!r}; "
                "only 'tensorflow' is supported."
            )
        if model_config.model_type:
            raise ModelConfigError(f"Model {model_config.name!r} sets the deprecated model_type; use model_platform.")


def single_model_config(model_name: str, base_path: str) -> model_server_config_pb2.ModelServerConfig:
    """The config the real server builds from --model_name and --model_base_path: latest version only."""
    config = model_server_config_pb2.ModelServerConfig()
    model_config = config.model_config_list.config.add()
    model_config.name = model_name
    model_config.base_path = base_path
    model_config.model_platform = "tensorflow"
    return config


def aspired_versions(model_config: model_server_config_pb2.ModelConfig, on_disk: list[int]) -> list[int]:
    """The versions the config's version policy asks for, among those on disk (default: the latest one)."""
    policy = model_config.model_version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return list(on_disk)
    if choice == "specific":
        wanted = set(policy.specific.versions)
        return [v for v in on_disk if v in wanted]
    count = max(policy.latest.num_versions, 1) if choice == "latest" else 1
    return on_disk[-count:]


class ModelManager:
    """Loads and unloads versions to match a ModelServerConfig and answers which version serves a request."""

    def __init__(
        self,
        loader: Callable[[str, int, str], ServableVersion] = load_and_warm_up,
        max_num_load_retries: int = DEFAULT_MAX_NUM_LOAD_RETRIES,
        load_retry_interval_s: float = DEFAULT_LOAD_RETRY_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_num_load_retries < 0 or load_retry_interval_s < 0:
            raise ValueError("max_num_load_retries and load_retry_interval_s must not be negative.")
        self._loader = loader
        self.max_num_load_retries = max_num_load_retries
        self.load_retry_interval_s = load_retry_interval_s
        self._clock = clock
        self._reload_lock = threading.Lock()
        self._config = model_server_config_pb2.ModelServerConfig()
        # Published mappings are never mutated, only replaced, so readers need no lock.
        self._models: Mapping[str, ModelSnapshot] = {}
        self._states: Mapping[str, Mapping[int, VersionState]] = {}
        self._failed_loads: dict[tuple[str, int], FailedLoad] = {}
        # Problems already logged: a problem that persists is returned by every sync but warned about once.
        self._reported_problems: frozenset[str] = frozenset()

    def apply_config(self, config: model_server_config_pb2.ModelServerConfig) -> list[str]:
        """Makes the loaded versions and labels match `config`; returns the problems met (empty when all applied).

        Raises ModelConfigError, changing nothing, when the config itself is unusable. An empty config (no
        model_config_list at all, e.g. a file caught mid-write) changes nothing either, as in TF Serving.
        """
        if config.WhichOneof("config") is None:
            logger.info("Taking no action for empty config")
            return []
        validate_config(config)
        with self._reload_lock:
            new_config = model_server_config_pb2.ModelServerConfig()
            new_config.CopyFrom(config)
            self._config = new_config
            return self._sync()

    def refresh(self) -> list[str]:
        """Re-scans the model folders under the current config (new version folders appear this way)."""
        with self._reload_lock:
            return self._sync()

    def resolve(self, model_name: str, version: int | None = None, label: str | None = None) -> ServableVersion:
        """The loaded version a request names: by number, by label, or the latest."""
        snapshot = self._snapshot(model_name)
        if label:
            if snapshot is None:
                raise not_found(f"Servable not found for request: Latest({model_name})")
            labelled = snapshot.labels.get(label)
            if labelled is None:
                raise invalid_argument(f"Unrecognized servable version label: {label}")
            version = labelled
        if version is not None:
            found = snapshot.versions.get(version) if snapshot else None
            if found is None:
                raise not_found(f"Servable not found for request: Specific({model_name}, {version})")
            return found
        latest = snapshot.latest() if snapshot else None
        if latest is None:
            raise not_found(f"Servable not found for request: Latest({model_name})")
        return latest

    def model_status(self, model_name: str, version: int | None = None, label: str | None = None) -> list[VersionState]:
        """GetModelStatus: the state of one version (by number or label) or of all versions, newest first."""
        snapshot = self._snapshot(model_name)
        states = self._states.get(model_name, {})
        if label:
            labelled = snapshot.labels.get(label) if snapshot else None
            if labelled is None:
                raise invalid_argument(f"Unrecognized servable version label: {label}")
            version = labelled
        if version is not None:
            if version not in states:
                raise not_found(f"Could not find version {version} of model {model_name}")
            return [states[version]]
        if not states:
            raise not_found(f"Could not find any versions of model {model_name}")
        return [states[v] for v in sorted(states, reverse=True)]

    def available_versions(self, model_name: str) -> list[int]:
        snapshot = self._models.get(model_name)
        return sorted(snapshot.versions) if snapshot else []

    def labels(self, model_name: str) -> dict[str, int]:
        snapshot = self._models.get(model_name)
        return dict(snapshot.labels) if snapshot else {}

    def unload_all(self) -> None:
        with self._reload_lock:
            for name, snapshot in self._models.items():
                for version in snapshot.versions:
                    self._set_state(name, VersionState(version, "END"))
            self._models = {}

    def _snapshot(self, model_name: str) -> ModelSnapshot | None:
        try:
            validate_model_name(model_name)
        except RepositoryError as e:
            raise invalid_argument(str(e)) from e
        return self._models.get(model_name)

    def _sync(self) -> list[str]:
        problems: list[str] = []
        models: dict[str, ModelSnapshot] = {}
        for model_config in self._config.model_config_list.config:
            snapshot = self._sync_model(model_config, problems)
            models[model_config.name] = snapshot
            # Publish per model so a model that finished loading serves while the next one loads.
            self._models = {**self._models, model_config.name: snapshot}
        for name, snapshot in self._models.items():
            if name not in models:
                for version in snapshot.versions:
                    self._set_state(name, VersionState(version, "END"))
                logger.info("unloaded model %s (no longer in the config)", name)
        self._models = models
        for problem in problems:
            if problem not in self._reported_problems:
                logger.warning("%s", problem)
        self._reported_problems = frozenset(problems)
        return problems

    def _sync_model(self, model_config: model_server_config_pb2.ModelConfig, problems: list[str]) -> ModelSnapshot:
        name = model_config.name
        base_path = Path(model_config.base_path)
        old = self._models.get(name) or ModelSnapshot(name)
        on_disk = list_versions(base_path)
        if not base_path.is_dir():
            logger.info("model %s: base path %s does not exist yet; waiting for versions", name, base_path)
        loaded: dict[int, ServableVersion] = {}
        for version in aspired_versions(model_config, on_disk):
            path = str(base_path / str(version))
            current = old.versions.get(version)
            if current is not None and current.path == path:
                loaded[version] = current
                continue
            servable = self._load(name, version, path, problems)
            if servable is not None:
                loaded[version] = servable

        retained = dict(loaded)
        if not loaded and old.versions:
            # Availability first: keep what serves until something newer has loaded.
            retained = dict(old.versions)
            problems.append(
                f"Model {name}: no version asked for by the config could be loaded; "
                f"still serving versions {sorted(retained)}."
            )

        # Each label on its own: a label pointing at an unavailable version keeps its previous version (or is
        # left out when it had none); the other labels move as configured.
        labels: dict[str, int] = {}
        unavailable: dict[str, int] = {}
        kept: dict[str, int] = {}
        for label, version in sorted(model_config.version_labels.items()):
            if version in retained:
                labels[label] = version
                continue
            unavailable[label] = version
            previous = old.labels.get(label)
            if previous is not None and previous in old.versions:
                labels[label] = kept[label] = previous
                retained.setdefault(previous, old.versions[previous])
        if unavailable:
            dropped = sorted(set(unavailable) - set(kept))
            problems.append(
                f"Model {name}: labels {unavailable} point at versions that are not available; "
                f"keeping their previous versions {kept}"
                + (f" and leaving {dropped} unset." if dropped else ".")
            )

        for version in old.versions:
            if version not in retained:
                self._set_state(name, VersionState(version, "END"))
                logger.info("unloaded %s version %d", name, version)
        return ModelSnapshot(name, retained, labels)

    def _load(self, name: str, version: int, path: str, problems: list[str]) -> ServableVersion | None:
        fingerprint = folder_fingerprint(path)
        failed = self._failed_loads.get((name, version))
        retry = 0
        if failed is not None and failed.fingerprint == fingerprint:
            if not load_retry_due(failed, self.max_num_load_retries, self._clock()):
                if failed.retries < self.max_num_load_retries:
                    problems.append(f"Model {name} version {version} failed to load, retrying: {failed.reason}")
                else:
                    problems.append(f"Model {name} version {version} failed to load: {failed.reason}")
                return None  # its status already says why
            retry = failed.retries + 1
        # A folder that changed since it failed (still being written, or fixed) starts over with a fresh budget.
        self._set_state(name, VersionState(version, "LOADING"))
        try:
            servable = self._loader(name, version, path)
        except Exception as e:  # noqa: BLE001 - a broken version must never stop the versions already serving
            code, reason = (e.code, e.message) if isinstance(e, ServableLoadError) else ("UNKNOWN", repr(e))
            self._failed_loads[(name, version)] = FailedLoad(
                fingerprint, retry, self._clock() + self.load_retry_interval_s, code, reason
            )
            if retry < self.max_num_load_retries:
                # As TF Serving: LOADING while retries remain.
                message = (f"Load failed, retry {retry + 1} of {self.max_num_load_retries} in "
                           f"{self.load_retry_interval_s:g} s (sooner if the folder changes): {reason}")
                self._set_state(name, VersionState(version, "LOADING", "OK", message))
                problems.append(f"Model {name} version {version} failed to load, retrying: {reason}")
            else:
                self._set_state(name, VersionState(version, "END", code, reason))
                problems.append(f"Model {name} version {version} failed to load: {reason}")
            return None
        self._failed_loads.pop((name, version), None)
        self._set_state(name, VersionState(version, "AVAILABLE"))
        logger.info("loaded %s version %d from %s", name, version, path)
        return servable

    def _set_state(self, name: str, state: VersionState) -> None:
        model_states = {**self._states.get(name, {}), state.version: state}
        self._states = {**self._states, name: model_states}


def load_retry_due(failed: FailedLoad, max_num_load_retries: int, now: float) -> bool:
    """Whether an unchanged version that failed may be loaded again: retries left and the interval passed."""
    return failed.retries < max_num_load_retries and now >= failed.next_retry_at


def folder_fingerprint(path: str) -> str:
    """Names, sizes and modification times of everything under `path`: any write inside the folder changes it."""
    digest = hashlib.sha256()
    entries = 0
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            try:
                stat = os.stat(os.path.join(root, name))
            except OSError:
                continue
            digest.update(f"{os.path.relpath(os.path.join(root, name), path)}\0{stat.st_size}\0"
                          f"{stat.st_mtime_ns}\0".encode())
            entries += 1
            if entries >= MAX_FINGERPRINT_ENTRIES:
                return digest.hexdigest()
    return digest.hexdigest()
