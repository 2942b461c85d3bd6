"""The model repository on Google Cloud Storage: the local layout (`<base>/<model>/<version>/` with the same
MANIFEST.json and publication.json, `models.config`, `models.canary.config`) under gs://bucket/path, which TF Serving
reads itself and k8s/serving's object-storage overlay copies from.

An object store has no folder rename and no lock; every guarantee of the local repository rests instead on GCS's
preconditions (`ifGenerationMatch`), which make one object write conditional and atomic:

- Staging: a version's files are uploaded below `<model>/.staging-<random>/` (a name no server or reader lists) and
  checked against their manifest (sizes and GCS's md5, from one listing).
- Number: the version number is claimed by creating `<model>/.claims/<N>` only if absent (`ifGenerationMatch=0`):
  two publishers never share a number (the loser takes the next one), and a claimed number is never reused, even
  when its publish failed. Numbers are claimed in increasing order, after the upload, so they only grow.
- Commit: the staged objects are copied on the server into `<model>/<N>/` (each only if absent, so a published
  object is never overwritten), checked against the manifest again, and the version becomes visible in one step:
  MANIFEST.json, created last and only if absent. Readers list only versions that hold one, models.config names only
  listed versions, and the object-storage overlay syncs only them, so half a version is never read or served.
- models.config is read with its generation and written with `ifGenerationMatch=<generation>`: when another writer
  got there first, the write fails with 412 and the change is applied again to the newer config, so no update is lost.

Not guaranteed: two publishers that claim numbers at the same moment may commit in the other order (N+1 visible a
moment before N). tf.io.gfile has no conditional writes, so this module talks to GCS through google-cloud-storage
(Beam's gcsio client, with the same Application Default Credentials).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from serving.repository.base import (
    CONFIG_FILE_NAME,
    GCS_SCHEME,
    MANIFEST_FILE,
    PUBLICATION_FILE,
    TRACK_CONFIG_FILES,
    VERSION_DIR_PATTERN,
    ChecksumCheck,
    RepositoryBase,
    RepositoryError,
    build_manifest,
    check_version,
    is_saved_model_dir,
    manifest_bytes,
    manifest_entry,
    parse_model_server_config,
    publication_bytes,
    validate_model_name,
)

# Attempts at claiming a version number, and at writing models.config, while other writers keep winning.
CLAIM_ATTEMPTS = 20
CONFIG_ATTEMPTS = 10
CLAIMS_FOLDER = ".claims"
STAGING_PREFIX = ".staging-"


def split_gcs_uri(uri: str) -> tuple[str, str]:
    """("bucket", "path/inside") of gs://bucket/path/inside."""
    if not uri.startswith(GCS_SCHEME):
        raise RepositoryError(f"{uri} is not a gs:// URI.")
    bucket, _, path = uri[len(GCS_SCHEME):].partition("/")
    if not bucket:
        raise RepositoryError(f"{uri} names no bucket; write gs://bucket/path.")
    return bucket, path.strip("/")


class GcsModelRepository(RepositoryBase):
    """`<base_dir>/<model>/<version>/` and the track configs on gs://. `served_base_dir` is where the servers see
    `base_dir`: by default the bucket itself (TF Serving reads gs://), `/models` where a copy is mounted."""

    def __init__(self, base_dir: str, config_path: str | None = None, served_base_dir: str | None = None,
                 client=None) -> None:
        self.bucket_name, self.prefix = split_gcs_uri(os.fspath(base_dir))
        self.base_dir = f"{GCS_SCHEME}{self.bucket_name}" + (f"/{self.prefix}" if self.prefix else "")
        self.config_path = os.fspath(config_path) if config_path else f"{self.base_dir}/{CONFIG_FILE_NAME}"
        self._config_bucket, self._config_name = split_gcs_uri(self.config_path)
        self.served_base_dir = served_base_dir.rstrip("/") if served_base_dir else self.base_dir
        self._client = client

    @classmethod
    def for_track(cls, base_dir: str, track: str, served_base_dir: str | None = None) -> GcsModelRepository:
        """The repository as one server track sees it: the same versions, that track's config file."""
        if track not in TRACK_CONFIG_FILES:
            raise RepositoryError(f"Unknown server track {track!r}; use one of {sorted(TRACK_CONFIG_FILES)}.")
        base = cls(base_dir).base_dir
        return cls(base, f"{base}/{TRACK_CONFIG_FILES[track]}", served_base_dir)

    @property
    def client(self):
        if self._client is None:
            from google.cloud import storage

            # No project: object reads and writes need none, and a pod may not know its project.
            self._client = storage.Client(project=None)
        return self._client

    # Layout

    def _name(self, *parts: str) -> str:
        return "/".join([self.prefix, *parts] if self.prefix else parts)

    def _blob(self, name: str, bucket: str | None = None):
        return self.client.bucket(bucket or self.bucket_name).blob(name)

    def _uri(self, name: str) -> str:
        return f"{GCS_SCHEME}{self.bucket_name}/{name}"

    def model_dir(self, model_name: str) -> str:
        return f"{self.base_dir}/{validate_model_name(model_name)}"

    def version_dir(self, model_name: str, version: int) -> str:
        return f"{self.model_dir(model_name)}/{check_version(version)}"

    def _model_prefix(self, model_name: str) -> str:
        return self._name(validate_model_name(model_name)) + "/"

    def _version_prefix(self, model_name: str, version: int) -> str:
        return f"{self._model_prefix(model_name)}{check_version(version)}/"

    def _objects(self, prefix: str) -> dict[str, object]:
        """{name below `prefix`: blob} of every object below `prefix` (folder placeholders left out)."""
        return {blob.name[len(prefix):]: blob for blob in self.client.list_blobs(self.bucket_name, prefix=prefix)
                if not blob.name.endswith("/")}

    def _claimed(self, model_name: str) -> set[int]:
        """Every number claimed by a publish (finished or not), and every version folder (one copied in by hand)."""
        model_prefix = self._model_prefix(model_name)
        claims = self._objects(f"{model_prefix}{CLAIMS_FOLDER}/")
        listing = self.client.list_blobs(self.bucket_name, prefix=model_prefix, delimiter="/")
        for _ in listing:  # the folder names arrive with the pages
            pass
        folders = (prefix[len(model_prefix):].rstrip("/") for prefix in listing.prefixes)
        return {int(name) for name in [*claims, *folders] if VERSION_DIR_PATTERN.match(name)}

    def versions(self, model_name: str) -> list[int]:
        """Committed versions (those holding a MANIFEST.json), ascending."""
        model_prefix = self._model_prefix(model_name)
        found = set()
        for blob in self.client.list_blobs(self.bucket_name, prefix=model_prefix,
                                           match_glob=f"{model_prefix}*/{MANIFEST_FILE}"):
            folder, _, name = blob.name[len(model_prefix):].partition("/")
            if name == MANIFEST_FILE and VERSION_DIR_PATTERN.match(folder):
                found.add(int(folder))
        return sorted(found)

    def incomplete_versions(self, model_name: str) -> list[int]:
        """Claimed numbers without a committed version: being published now, or a publish that failed."""
        return sorted(self._claimed(model_name) - set(self.versions(model_name)))

    def read_version_file(self, model_name: str, version: int, name: str) -> bytes:
        from google.api_core.exceptions import NotFound

        try:
            return self._blob(self._version_prefix(model_name, version) + name).download_as_bytes()
        except NotFound:
            raise FileNotFoundError(f"{self.version_dir(model_name, version)}/{name}") from None

    # Publishing

    def publish(
        self, model_name: str, write: Callable[[Path], None], record: Mapping[str, object] | None = None
    ) -> int:
        """Publishes the next version: `write(folder)` fills a local folder, which is staged, checked, numbered and
        committed (see the module's docstring). Publishing serves nothing: a rollout does (see rollout)."""
        validate_model_name(model_name)
        with tempfile.TemporaryDirectory(prefix="mlops-publish-") as folder:
            write(Path(folder))
            return self._publish_folder(model_name, Path(folder), record, None)

    def add_version(self, model_name: str, saved_model_dir: str | Path, version: int | None = None) -> int:
        source = Path(saved_model_dir)
        if not is_saved_model_dir(source):
            raise RepositoryError(f"{source} is not a SavedModel folder (no saved_model.pb); pass the export folder.")
        return self._publish_folder(model_name, source, None, version)

    def _publish_folder(
        self, model_name: str, folder: Path, record: Mapping[str, object] | None, version: int | None
    ) -> int:
        if version is not None:
            self._check_new_version(model_name, version, self._claimed(model_name))  # before uploading anything
        if not is_saved_model_dir(folder):
            raise RepositoryError(f"Nothing publishable was written for {model_name!r}: {folder} holds no "
                                  "saved_model.pb.")
        for reserved in (PUBLICATION_FILE, MANIFEST_FILE):
            if (folder / reserved).exists():
                raise RepositoryError(f"{folder} already holds a {reserved}; publish an export folder.")
        files = build_manifest(folder)
        staging = f"{self._model_prefix(model_name)}{STAGING_PREFIX}{uuid.uuid4().hex}/"
        written: list[str] = []
        target = None
        try:
            for relative in files:
                written.append(staging + relative)
                self._create(staging + relative, folder / relative, files[relative])
            self._check_objects(staging, files)
            version = self._claim(model_name, version)
            target = self._version_prefix(model_name, version)
            if record is not None:
                publication = publication_bytes(model_name, version, record)
                files[PUBLICATION_FILE] = manifest_entry([publication])
                self._create(target + PUBLICATION_FILE, publication, files[PUBLICATION_FILE])
                written.append(target + PUBLICATION_FILE)  # after: an object someone else wrote is not removed
            for relative in files:
                if relative != PUBLICATION_FILE:
                    self._copy(staging + relative, target + relative, files[relative])
                    written.append(target + relative)
            self._check_objects(target, files)
            manifest = manifest_bytes(files)
            self._commit(target, manifest)
            return version
        finally:
            self._discard(written, target)

    def _discard(self, written: list[str], target: str | None) -> None:
        """Deletes the staged objects, and the version's own unless it was committed (its claim stays: the number is
        spent). A publisher killed before this leaves them, unlisted: only a MANIFEST.json makes a version."""
        try:
            keep = target is not None and self._blob(target + MANIFEST_FILE).exists()
        except Exception:
            keep = True  # unknown (the store is unreachable): a committed version must never lose a file
        for name in written:
            if not (keep and name.startswith(target)):
                with contextlib.suppress(Exception):
                    self._blob(name).delete()

    def _commit(self, target: str, manifest: bytes) -> None:
        """The one write that makes the version visible: its MANIFEST.json, created only if absent."""
        self._create(target + MANIFEST_FILE, manifest, manifest_entry([manifest]))

    def _check_new_version(self, model_name: str, version: int, claimed: set[int]) -> int:
        version = check_version(version)
        if version in claimed:
            raise RepositoryError(
                f"Version {version} of model {model_name!r} already exists (or was claimed by a publish that did not "
                "finish) and versions are immutable; publish a new version number instead.")
        highest = max(claimed, default=None)
        if highest is not None and version < highest:
            raise RepositoryError(
                f"Version {version} of model {model_name!r} is below the latest version {highest}; version numbers "
                "only grow (TF Serving serves the highest by default), so publish a higher one.")
        return version

    def _claim(self, model_name: str, version: int | None) -> int:
        """Creates `<model>/.claims/<N>` only if absent: the number is then this publisher's alone."""
        token = uuid.uuid4().hex.encode()
        claims = f"{self._model_prefix(model_name)}{CLAIMS_FOLDER}/"
        tried = 0
        for _ in range(CLAIM_ATTEMPTS):
            claimed = self._claimed(model_name)
            if version is None:
                candidate = max(claimed | {tried}) + 1
            else:
                candidate = self._check_new_version(model_name, version, claimed)
            if self._create_if_absent(claims + str(candidate), token, manifest_entry([token])):
                return candidate
            if version is not None:
                raise RepositoryError(f"Version {candidate} of model {model_name!r} was claimed by another publisher "
                                      "meanwhile; publish a new version number instead.")
            tried = candidate
        raise RepositoryError(f"Other publishers took every version number of {model_name!r} tried "
                              f"({CLAIM_ATTEMPTS} attempts); publish again.")

    def _create_if_absent(self, name: str, data: bytes | Path, entry: Mapping[str, object]) -> bool:
        """Uploads `data` as a new object; False when the object exists already with other content. The same content
        there is this upload's own earlier attempt (a retried request whose first try landed)."""
        from google.api_core.exceptions import PreconditionFailed

        blob = self._blob(name)
        try:
            if isinstance(data, Path):
                blob.upload_from_filename(str(data), if_generation_match=0)
            else:
                blob.upload_from_string(data, content_type="application/octet-stream", if_generation_match=0)
        except PreconditionFailed:
            return self._holds(name, entry)
        return True

    def _holds(self, name: str, entry: Mapping[str, object]) -> bool:
        existing = self.client.bucket(self.bucket_name).get_blob(name)
        return existing is not None and existing.md5_hash == entry["md5"] and existing.size == entry["bytes"]

    def _create(self, name: str, data: bytes | Path, entry: Mapping[str, object]) -> None:
        if not self._create_if_absent(name, data, entry):
            raise RepositoryError(f"{self._uri(name)} was written by someone else while this version was being "
                                  "published; publish again (it gets a new number).")

    def _copy(self, source_name: str, target_name: str, entry: Mapping[str, object]) -> None:
        """Copies an object on the server side, creating the target only if absent."""
        from google.api_core.exceptions import PreconditionFailed

        source, target = self._blob(source_name), self._blob(target_name)
        try:
            token, _, _ = target.rewrite(source, if_generation_match=0)
            while token:  # a large object is copied in several calls
                token, _, _ = target.rewrite(source, token=token, if_generation_match=0)
        except PreconditionFailed:
            if not self._holds(target_name, entry):
                raise RepositoryError(f"{self._uri(target_name)} was written by someone else while this version was "
                                      "being published; publish again (it gets a new number).") from None

    def _check_objects(self, prefix: str, files: Mapping[str, Mapping[str, object]]) -> None:
        problems = _problems(files, self._objects(prefix))
        if problems:
            raise RepositoryError(f"{self._uri(prefix)} does not match its manifest after the upload "
                                  f"({'; '.join(problems[:3])}); nothing was published, publish again.")

    # Reading versions back

    def _manifest(self, model_name: str, version: int) -> dict[str, Mapping[str, object]]:
        return json.loads(self.read_version_file(model_name, version, MANIFEST_FILE))["files"]

    def verify(self, model_name: str, version: int) -> ChecksumCheck:
        """Compares the version's objects with its manifest: sizes and GCS's md5 from one listing; a file whose md5
        the manifest or GCS lacks (a composite object, a manifest without md5) is downloaded and its sha256 compared."""
        objects = self._objects(self._version_prefix(model_name, version))
        if objects.pop(MANIFEST_FILE, None) is None:
            return ChecksumCheck("no manifest")
        try:
            expected = self._manifest(model_name, version)
        except (OSError, ValueError, KeyError, TypeError):
            return ChecksumCheck("MISMATCH", [f"{self.version_dir(model_name, version)}/{MANIFEST_FILE} is not a "
                                              "readable manifest"])
        problems = _problems(expected, objects)
        return ChecksumCheck("MISMATCH" if problems else "ok", problems)

    # models.config

    def _read_config_object(self) -> tuple[model_server_config_pb2.ModelServerConfig, int, str]:
        """The config, its generation (0: absent) and its text, read as one consistent generation."""
        from google.api_core.exceptions import NotFound, PreconditionFailed

        for _ in range(CONFIG_ATTEMPTS):
            blob = self.client.bucket(self._config_bucket).get_blob(self._config_name)
            if blob is None:
                return model_server_config_pb2.ModelServerConfig(), 0, ""
            generation = int(blob.generation)  # read first: a download may reset the blob's properties
            try:
                text = blob.download_as_bytes(if_generation_match=generation).decode()
            except (NotFound, PreconditionFailed):
                continue  # replaced between the two requests
            return parse_model_server_config(text, self.config_path), generation, text
        raise RepositoryError(f"{self.config_path} kept changing while being read; try again.")

    def read_config(self) -> model_server_config_pb2.ModelServerConfig:
        return self._read_config_object()[0]

    def _update_config(
        self, change: Callable[[model_server_config_pb2.ModelServerConfig], bool]
    ) -> model_server_config_pb2.ModelServerConfig:
        from google.api_core.exceptions import PreconditionFailed

        for _ in range(CONFIG_ATTEMPTS):
            config, generation, _ = self._read_config_object()
            if not change(config):
                return config
            text = text_format.MessageToString(config)
            try:
                self._blob(self._config_name, self._config_bucket).upload_from_string(
                    text, content_type="text/plain", if_generation_match=generation)
                return config
            except PreconditionFailed:
                if self._read_config_object()[2] == text:
                    return config  # this write landed and a retry of it was refused
        raise RepositoryError(f"{self.config_path} kept changing under other writers ({CONFIG_ATTEMPTS} attempts); "
                              "try again.")


def _problems(expected: Mapping[str, Mapping[str, object]], objects: Mapping[str, object]) -> list[str]:
    """How the objects differ from the manifest's entries: changed, missing and unlisted files."""
    problems = [f"{name}: changed" for name in sorted(set(expected) & set(objects))
                if not _matches(expected[name], objects[name])]
    problems += [f"{name}: missing" for name in sorted(set(expected) - set(objects))]
    problems += [f"{name}: not in the manifest" for name in sorted(set(objects) - set(expected))]
    return problems


def _matches(entry: Mapping[str, object], blob) -> bool:
    if entry.get("bytes") != blob.size:
        return False
    if entry.get("md5") and blob.md5_hash:
        return entry["md5"] == blob.md5_hash
    return hashlib.sha256(blob.download_as_bytes()).hexdigest() == entry.get("sha256")
