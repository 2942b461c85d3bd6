"""The model repository on a local (or mounted) file system: `<base>/<model>/<integer version>/` plus `models.config`,
each version staged under a hidden name and renamed into place, every config change under a file lock."""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from tensorflow_serving.config import model_server_config_pb2

from serving.repository.base import (
    CONFIG_FILE_NAME,
    MANIFEST_FILE,
    MODEL_NAME_PATTERN,
    PUBLICATION_FILE,
    TRACK_CONFIG_FILES,
    ChecksumCheck,
    RepositoryBase,
    RepositoryError,
    StagedVersion,
    build_manifest,
    check_repository_location,
    check_version,
    is_saved_model_dir,
    list_versions,
    manifest_bytes,
    publication_bytes,
    read_model_server_config,
    validate_model_name,
    verify_manifest,
    write_model_server_config,
)


class ModelRepository(RepositoryBase):
    """Owns `<base_dir>/<model>/<version>/` and the `models.config` that tells TF Serving what to serve, on a local
    (or mounted) file system.

    `served_base_dir` is where the server sees `base_dir` (e.g. `/models` inside a container); by default
    the config names the local absolute path.
    """

    def __init__(
        self,
        base_dir: str | Path,
        config_path: str | Path | None = None,
        served_base_dir: str | None = None,
    ) -> None:
        if "://" in check_repository_location(base_dir):
            # Path() would make gs://b/x a relative folder "gs:/b/x" of the working directory: a silent local write.
            raise RepositoryError(f"{base_dir} is not a local folder; open it with open_repository().")
        self.base_dir = Path(base_dir).resolve()
        self.config_path = Path(config_path) if config_path else self.base_dir / CONFIG_FILE_NAME
        self.served_base_dir = served_base_dir.rstrip("/") if served_base_dir else str(self.base_dir)

    @classmethod
    def for_track(cls, base_dir: str | Path, track: str, served_base_dir: str | None = None) -> ModelRepository:
        """The repository as one server track sees it: the same versions, that track's config file."""
        if track not in TRACK_CONFIG_FILES:
            raise RepositoryError(f"Unknown server track {track!r}; use one of {sorted(TRACK_CONFIG_FILES)}.")
        base = cls(base_dir).base_dir  # refuses a URI before Path() makes it a local folder
        return cls(base, base / TRACK_CONFIG_FILES[track], served_base_dir)

    # Layout

    def model_dir(self, model_name: str) -> Path:
        return self.base_dir / validate_model_name(model_name)

    def version_dir(self, model_name: str, version: int) -> Path:
        return self.model_dir(model_name) / str(check_version(version))

    def models(self) -> list[str]:
        """Model folders present under the base folder."""
        if not self.base_dir.is_dir():
            return []
        return sorted(
            entry.name for entry in os.scandir(self.base_dir)
            if entry.is_dir() and MODEL_NAME_PATTERN.match(entry.name) and ".." not in entry.name
        )

    def versions(self, model_name: str) -> list[int]:
        """Complete versions of `model_name`, ascending."""
        return list_versions(self.model_dir(model_name))

    def _staged_version(self, model_name: str, version: int | None = None) -> Iterator[StagedVersion]:
        """Yields a temporary folder to write a SavedModel into; publishes it as `version` when the block succeeds.

        `version` defaults to one more than the newest version. An existing version is never replaced.
        """
        model_dir = self.model_dir(model_name)
        model_dir.mkdir(parents=True, exist_ok=True)
        with self._lock():
            if version is None:
                version = (self.latest_version(model_name) or 0) + 1
            target = model_dir / str(check_version(version))
            if target.exists():
                raise RepositoryError(
                    f"Version {version} of model {model_name!r} already exists and versions are immutable; "
                    "publish a new version number instead."
                )
            latest = self.latest_version(model_name)
            if latest is not None and version < latest:
                raise RepositoryError(
                    f"Version {version} of model {model_name!r} is below the latest version {latest}; version "
                    "numbers only grow (TF Serving serves the highest by default), so publish a higher one."
                )
            staging = model_dir / f".staging-{version}-{uuid.uuid4().hex[:8]}"
            staging.mkdir()
        try:
            yield StagedVersion(model_name, version, staging)
            if not is_saved_model_dir(staging):
                raise RepositoryError(
                    f"Nothing publishable was written for version {version} of {model_name!r}: "
                    f"{staging} holds no saved_model.pb."
                )
            (staging / MANIFEST_FILE).write_bytes(manifest_bytes(build_manifest(staging)))
            with self._lock():
                if target.exists():
                    raise RepositoryError(
                        f"Version {version} of model {model_name!r} was published by someone else meanwhile; "
                        "publish a new version number instead."
                    )
                os.rename(staging, target)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)

    # Decorated apart from its body: mutmut makes no mutant of a decorated function.
    staged_version = contextlib.contextmanager(_staged_version)

    def add_version(self, model_name: str, saved_model_dir: str | Path, version: int | None = None) -> int:
        """Copies the SavedModel at `saved_model_dir` in as a new version and returns its number."""
        source = Path(saved_model_dir)
        if not is_saved_model_dir(source):
            raise RepositoryError(f"{source} is not a SavedModel folder (no saved_model.pb); pass the export folder.")
        with self.staged_version(model_name, version) as staged:
            shutil.copytree(source, staged.path, dirs_exist_ok=True)
        return staged.version

    def publish(
        self, model_name: str, write: Callable[[Path], None], record: Mapping[str, object] | None = None
    ) -> int:
        """Publishes the next version: `write(folder)` fills a staging folder, `record` (what published it: run,
        blessing...) lands in publication.json, a manifest checksums every file, and one rename makes it visible.
        Publishing serves nothing: a rollout does (see rollout)."""
        with self.staged_version(model_name) as staged:
            write(staged.path)
            if record is not None:
                (staged.path / PUBLICATION_FILE).write_bytes(publication_bytes(model_name, staged.version, record))
        return staged.version

    def verify(self, model_name: str, version: int) -> ChecksumCheck:
        """Checks a published version's files against its manifest."""
        return verify_manifest(self.version_dir(model_name, version))

    def read_version_file(self, model_name: str, version: int, name: str) -> bytes:
        return (self.version_dir(model_name, version) / name).read_bytes()

    # models.config

    def read_config(self) -> model_server_config_pb2.ModelServerConfig:
        """The current ModelServerConfig (empty when the file does not exist yet)."""
        if not self.config_path.exists():
            return model_server_config_pb2.ModelServerConfig()
        return read_model_server_config(self.config_path)

    def _missing_versions(self, model_name: str, versions: list[int]) -> list[int]:
        return [v for v in versions if not self.version_dir(model_name, v).is_dir()]

    def _update_config(
        self, change: Callable[[model_server_config_pb2.ModelServerConfig], bool]
    ) -> model_server_config_pb2.ModelServerConfig:
        with self._lock():
            config = self.read_config()
            if change(config):
                write_model_server_config(config, self.config_path)
            return config

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        # One writer at a time across processes (pusher, rollout controller): read-modify-write of the config.
        self.base_dir.mkdir(parents=True, exist_ok=True)
        with open(self.base_dir / ".repository.lock", "w") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)
