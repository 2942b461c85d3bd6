"""What the local and the gs:// model repository share: TF Serving's layout, `<base>/<model>/<integer version>/` plus
a text-format `models.config`, and its rules.

Versions are immutable: a version is staged under a hidden temporary name, given a checksum manifest of every file,
and renamed into place only when complete, so a server polling the folder never sees half a SavedModel and a
changed file is detected. Version numbers only grow. Two config files name what is served: `models.config` (the
stable servers, label `stable`) and `models.canary.config` (the canary servers of a rollout, label `canary`).

`serving/repository/local.py` is the local (or mounted) repository, `serving/repository/gcs.py` the same layout on
gs://, which TF Serving reads itself; `open_repository` (`serving/repository/factory.py`) picks one by the base path.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from settings.errors import UserError
from settings.files import EXPORT_REPORT_HTML, EXPORT_REPORT_JSON

MODEL_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
LABEL_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
VERSION_DIR_PATTERN = re.compile(r"^[0-9]+$")
SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
CONFIG_FILE_NAME = "models.config"
CANARY_CONFIG_FILE_NAME = "models.canary.config"
# Server track -> its config file; each track's servers answer the label named after the track.
TRACK_CONFIG_FILES = {"stable": CONFIG_FILE_NAME, "canary": CANARY_CONFIG_FILE_NAME}
# Written into every version folder: sha256, size and md5 of every other file, then what published it.
MANIFEST_FILE = "MANIFEST.json"
PUBLICATION_FILE = "publication.json"
# Files of a version that are not its model: left out when two versions are compared.
NOT_MODEL_FILES = frozenset({PUBLICATION_FILE, EXPORT_REPORT_JSON, EXPORT_REPORT_HTML})
GCS_SCHEME = "gs://"


class RepositoryError(UserError, ValueError):
    """A request to the model repository that cannot be honoured; the message says what to change."""

    exit_code = 2


def validate_model_name(name: str) -> str:
    """Returns `name` if it is a safe model name (no `/`, no `..`), else raises RepositoryError."""
    if not isinstance(name, str) or not MODEL_NAME_PATTERN.match(name) or ".." in name:
        raise RepositoryError(
            f"Model name {name!r} is invalid: use letters, digits, '_', '-' and '.', "
            "start with a letter or digit, and do not use '..' or '/'."
        )
    return name


def validate_label(label: str) -> str:
    """Returns `label` if it is a valid version label (e.g. `stable`, `canary`), else raises RepositoryError."""
    if not isinstance(label, str) or not LABEL_PATTERN.match(label):
        raise RepositoryError(f"Version label {label!r} is invalid: use letters, digits, '_' and '-'.")
    return label


def is_saved_model_dir(path: Path) -> bool:
    return any((path / name).is_file() for name in SAVED_MODEL_FILES)


def list_versions(model_dir: Path) -> list[int]:
    """The complete versions under `model_dir`: sub-folders named by an integer (temporary names are hidden)."""
    if not model_dir.is_dir():
        return []
    return sorted(
        int(entry.name)
        for entry in os.scandir(model_dir)
        if entry.is_dir() and VERSION_DIR_PATTERN.match(entry.name)
    )


def parse_model_server_config(text: str, source: str) -> model_server_config_pb2.ModelServerConfig:
    """Parses text-format ModelServerConfig; raises RepositoryError naming `source` and the parser's reason."""
    config = model_server_config_pb2.ModelServerConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as e:
        raise RepositoryError(f"Model config {source} is not a valid text-format ModelServerConfig: {e}") from e
    return config


def read_model_server_config(path: str | Path) -> model_server_config_pb2.ModelServerConfig:
    return parse_model_server_config(Path(path).read_text(), str(path))


def write_model_server_config(config: model_server_config_pb2.ModelServerConfig, path: str | Path) -> None:
    """Writes `config` as text format, atomically (temporary file, then rename) so pollers never read half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text_format.MessageToString(config))
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


def file_sha256(read_chunks: Iterable[bytes]) -> str:
    digest = hashlib.sha256()
    for chunk in read_chunks:
        digest.update(chunk)
    return digest.hexdigest()


def _local_chunks(path: Path, size: int = 1 << 20) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(size):
            yield chunk


def manifest_entry(chunks: Iterable[bytes]) -> dict[str, object]:
    """{"sha256", "bytes", "md5"} of one file: sha256 is the checksum; md5 (base64) is the one GCS keeps for every
    object, so a repository on gs:// checks a version from a listing instead of downloading it."""
    sha256, md5, size = hashlib.sha256(), hashlib.md5(), 0
    for chunk in chunks:
        sha256.update(chunk)
        md5.update(chunk)
        size += len(chunk)
    return {"sha256": sha256.hexdigest(), "bytes": size, "md5": base64.b64encode(md5.digest()).decode()}


def build_manifest(folder: Path) -> dict[str, dict[str, object]]:
    """{relative path: {"sha256", "bytes", "md5"}} for every file under `folder` except the manifest itself."""
    files = {}
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder).as_posix()
        if path.is_file() and relative != MANIFEST_FILE:
            files[relative] = manifest_entry(_local_chunks(path))
    return files


def manifest_bytes(files: Mapping[str, Mapping[str, object]]) -> bytes:
    """MANIFEST.json as both repositories write it."""
    return json_bytes({"algorithm": "sha256", "files": files})


def json_bytes(content: object) -> bytes:
    return (json.dumps(content, indent=2, sort_keys=True) + "\n").encode()


def content_digest(files: Mapping[str, Mapping[str, object]]) -> str:
    """One digest of a version's model files: equal digests, same model. The publication record and the export
    report are left out: the report's latencies differ on every run of the same model bytes."""
    lines = "".join(f"{name}\0{entry['sha256']}\n" for name, entry in sorted(files.items())
                    if name not in NOT_MODEL_FILES)
    return hashlib.sha256(lines.encode()).hexdigest()


@dataclass(frozen=True)
class ChecksumCheck:
    """`state` is "ok", "no manifest" (published before manifests, or by hand) or "MISMATCH"; `problems` says how."""

    state: str
    problems: list[str] = field(default_factory=list)


def verify_manifest(folder: Path) -> ChecksumCheck:
    """Compares every file under `folder` with its MANIFEST.json: changed, missing and unlisted files are problems."""
    manifest_path = folder / MANIFEST_FILE
    if not manifest_path.is_file():
        return ChecksumCheck("no manifest")
    try:
        expected = json.loads(manifest_path.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        return ChecksumCheck("MISMATCH", [f"{manifest_path} is not a readable manifest"])
    actual = build_manifest(folder)
    problems = [f"{name}: changed" for name in sorted(set(expected) & set(actual))
                if expected[name]["sha256"] != actual[name]["sha256"]]
    problems += [f"{name}: missing" for name in sorted(set(expected) - set(actual))]
    problems += [f"{name}: not in the manifest" for name in sorted(set(actual) - set(expected))]
    return ChecksumCheck("MISMATCH" if problems else "ok", problems)


@dataclass(frozen=True)
class StagedVersion:
    """A version being written: fill `path` with a SavedModel; it becomes `<model>/<version>/` on success."""

    model_name: str
    version: int
    path: Path


class RepositoryBase:
    """What the local and the gs:// repository share: `models.config` and its rules. A subclass lists versions,
    reads the config and changes it as one atomic read-modify-write (`_update_config`)."""

    base_dir: Path | str
    config_path: Path | str
    served_base_dir: str

    def model_dir(self, model_name: str) -> Path | str:
        raise NotImplementedError

    def version_dir(self, model_name: str, version: int) -> Path | str:
        raise NotImplementedError

    def versions(self, model_name: str) -> list[int]:
        """Complete versions of `model_name`, ascending."""
        raise NotImplementedError

    def add_version(self, model_name: str, saved_model_dir: str | Path, version: int | None = None) -> int:
        """Copies the local SavedModel folder `saved_model_dir` in as a new version and returns its number."""
        raise NotImplementedError

    def publish(
        self, model_name: str, write: Callable[[Path], None], record: Mapping[str, object] | None = None
    ) -> int:
        """Publishes the next version: `write(folder)` fills a local folder, `record` (what published it: run,
        blessing...) lands in publication.json and a manifest checksums every file. Publishing serves nothing: a
        rollout does (see rollout)."""
        raise NotImplementedError

    def version_with_content(self, model_name: str, digest: str) -> int | None:
        """The published version whose model files have `digest` (see content_digest), if any."""
        for version in reversed(self.versions(model_name)):
            try:
                files = json.loads(self.read_version_file(model_name, version, MANIFEST_FILE))["files"]
            except (OSError, ValueError, KeyError):
                continue
            if content_digest(files) == digest:
                return version
        return None

    def verify(self, model_name: str, version: int) -> ChecksumCheck:
        """Checks a published version's files against its manifest."""
        raise NotImplementedError

    def read_version_file(self, model_name: str, version: int, name: str) -> bytes:
        """The bytes of file `name` of a version; FileNotFoundError when it has none."""
        raise NotImplementedError

    def publication(self, model_name: str, version: int) -> dict[str, object]:
        """What publication.json of a version says (empty when it has none, e.g. added by hand)."""
        try:
            return json.loads(self.read_version_file(model_name, version, PUBLICATION_FILE))
        except (OSError, ValueError):
            return {}

    def read_config(self) -> model_server_config_pb2.ModelServerConfig:
        """The current ModelServerConfig (empty when the file does not exist yet)."""
        raise NotImplementedError

    def _update_config(
        self, change: Callable[[model_server_config_pb2.ModelServerConfig], bool]
    ) -> model_server_config_pb2.ModelServerConfig:
        """Reads the config, applies `change` (which says whether it changed anything) and writes it back, with no
        other writer's change lost in between."""
        raise NotImplementedError

    def _missing_versions(self, model_name: str, versions: list[int]) -> list[int]:
        published = set(self.versions(model_name))
        return [v for v in versions if v not in published]

    def incomplete_versions(self, model_name: str) -> list[int]:
        """Version folders that are not (yet) complete, so no reader lists or serves them."""
        return []

    def latest_version(self, model_name: str) -> int | None:
        versions = self.versions(model_name)
        return versions[-1] if versions else None

    def serve(
        self,
        model_name: str,
        versions: Iterable[int],
        labels: Mapping[str, int] | None = None,
    ) -> model_server_config_pb2.ModelServerConfig:
        """Sets the versions TF Serving must serve for `model_name` (a `specific` policy) and its version labels.

        Every version must be published and every label must point at one of `versions`.
        """
        def change(config: model_server_config_pb2.ModelServerConfig) -> bool:
            self._serve_in(config, model_name, versions, labels)
            return True

        return self._update_config(change)

    def serve_if_unserved(self, model_name: str, version: int, label: str) -> bool:
        """Serves `version` with `label` when the config serves no version of `model_name` yet; says whether it did."""
        served = False

        def change(config: model_server_config_pb2.ModelServerConfig) -> bool:
            nonlocal served
            model_config = _find_model(config, model_name)
            served = model_config is None or not model_config.model_version_policy.specific.versions
            if served:
                self._serve_in(config, model_name, [version], {label: version})
            return served

        self._update_config(change)
        return served

    def _serve_in(
        self,
        config: model_server_config_pb2.ModelServerConfig,
        model_name: str,
        versions: Iterable[int],
        labels: Mapping[str, int] | None,
    ) -> None:
        # Changes `config` in place; the caller writes it (under _update_config).
        versions = sorted({check_version(v) for v in versions})
        if not versions:
            raise RepositoryError(f"Give at least one version to serve for {model_name!r}.")
        missing = self._missing_versions(model_name, versions)
        if missing:
            raise RepositoryError(
                f"Model {model_name!r} has no version(s) {missing} under {self.model_dir(model_name)}; "
                f"available: {self.versions(model_name)}."
            )
        labels = dict(labels or {})
        for label, version in labels.items():
            validate_label(label)
            if version not in versions:
                raise RepositoryError(
                    f"Label {label!r} points at version {version} of {model_name!r}, which is not served; "
                    f"serve it too (served: {versions})."
                )
        model_config = _find_or_add_model(config, model_name)
        model_config.base_path = f"{self.served_base_dir}/{model_name}"
        model_config.model_platform = "tensorflow"
        model_config.model_version_policy.Clear()
        model_config.model_version_policy.specific.versions.extend(versions)
        model_config.version_labels.clear()
        for label, version in sorted(labels.items()):
            model_config.version_labels[label] = version

    def served_versions(self, model_name: str) -> list[int]:
        """The versions named in the config's `specific` policy for `model_name` (empty if not configured)."""
        model_config = _find_model(self.read_config(), model_name)
        if model_config is None:
            return []
        return sorted(model_config.model_version_policy.specific.versions)

    def labels(self, model_name: str) -> dict[str, int]:
        model_config = _find_model(self.read_config(), model_name)
        return dict(model_config.version_labels) if model_config is not None else {}

    def set_label(self, model_name: str, label: str, version: int) -> model_server_config_pb2.ModelServerConfig:
        """Points `label` at `version`, which must already be served."""
        label = validate_label(label)
        version = check_version(version)

        def change(config: model_server_config_pb2.ModelServerConfig) -> bool:
            # Read, change and write as one update, so a concurrent writer's change is not lost.
            model_config = _find_model(config, model_name)
            labels = dict(model_config.version_labels) if model_config is not None else {}
            served = sorted(model_config.model_version_policy.specific.versions) if model_config is not None else []
            labels[label] = version
            self._serve_in(config, model_name, served, labels)
            return True

        return self._update_config(change)

    def remove_model(self, model_name: str) -> model_server_config_pb2.ModelServerConfig:
        """Drops `model_name` from the config (its folders stay)."""
        def change(config: model_server_config_pb2.ModelServerConfig) -> bool:
            kept = [c for c in config.model_config_list.config if c.name != model_name]
            del config.model_config_list.config[:]
            config.model_config_list.config.extend(kept)
            return True

        return self._update_config(change)


def check_repository_location(base_dir: str | Path) -> str:
    """Returns `base_dir` if a model repository can live there (a local or mounted folder, or gs://), else raises
    RepositoryError saying where to publish instead."""
    base = os.fspath(base_dir)
    if "://" in base and not base.startswith(GCS_SCHEME):
        scheme = base.split("://", 1)[0]
        raise RepositoryError(
            f"The model repository {base} is on {scheme}://, where versions cannot be published atomically (and TF "
            "Serving reads no s3:// since 2.7); publish to gs://bucket/path or to a local or mounted folder instead.")
    return base


def publication_bytes(model_name: str, version: int, record: Mapping[str, object]) -> bytes:
    """publication.json of a version: the model, its number and what published it."""
    return json_bytes({"model": model_name, "version": version, **record})


def check_version(version: int) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise RepositoryError(f"Version {version!r} is invalid: versions are non-negative integers.")
    return version


def _find_model(config: model_server_config_pb2.ModelServerConfig, model_name: str):
    for model_config in config.model_config_list.config:
        if model_config.name == model_name:
            return model_config
    return None


def _find_or_add_model(config: model_server_config_pb2.ModelServerConfig, model_name: str):
    found = _find_model(config, validate_model_name(model_name))
    if found is not None:
        return found
    model_config = config.model_config_list.config.add()
    model_config.name = model_name
    return model_config
