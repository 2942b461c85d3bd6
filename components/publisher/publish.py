"""Publishes an exported model folder as the next version of the TF Serving model repository.

The source is a pipeline artifact, read through tf.io.gfile (local, gs://, ...). The repository is a local folder
(or a mounted volume), where staging and an atomic rename make a version appear complete or not at all, or gs://
(on Kubeflow: `<kubeflow.output_root>/serving`), where staging, a claimed number and a MANIFEST.json created last
do (serving/repository/gcs.py); any other URI is refused, never written to the local disk. The same model published
twice (a retried or re-executed component) is the same version, not a new one.

Beside the model, a version carries the schema and the training split's statistics it was trained on, in
`assets.extra/training/` (TF Serving loads nothing from assets.extra but its warm-up file): `mlops monitor` compares
the requests the version answers with them, from the model repository alone.
"""
from __future__ import annotations

import os
import posixpath
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reports.records import REFERENCE_ARTIFACT, ExportReport
from serving.repository.base import PUBLICATION_FILE, TRACK_CONFIG_FILES, RepositoryError, content_digest, file_sha256
from serving.repository.factory import open_repository
from settings.files import EXPORT_REPORT_JSON, TRAINING_SCHEMA_FILE, TRAINING_STATISTICS_FILE


@dataclass(frozen=True)
class TrainingData:
    """What the model was trained on: the schema (text format) and the training split's TFDV statistics (a binary
    DatasetFeatureStatisticsList), each a file any tf.io.gfile path names."""

    schema: str
    statistics: str

    def files(self) -> dict[str, str]:
        """Version-relative name -> source file."""
        return {TRAINING_SCHEMA_FILE: self.schema, TRAINING_STATISTICS_FILE: self.statistics}


@dataclass(frozen=True)
class PublishedVersion:
    version: int
    path: str
    # False when an identical model was already published as `version` (nothing was copied).
    new: bool
    # The tracks that started serving this version because the model had no version served yet.
    bootstrapped: tuple[str, ...]


def _walk_files(root: str) -> Iterator[str]:
    import tensorflow as tf

    for folder, _, files in tf.io.gfile.walk(root):
        for name in files:
            yield posixpath.join(folder, name)


def _gfile_chunks(path: str, size: int = 1 << 20) -> Iterator[bytes]:
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "rb") as f:
        while chunk := f.read(size):
            yield chunk


def source_manifest(source_dir: str) -> dict[str, dict[str, object]]:
    """The manifest the repository would write for `source_dir` (any file system tf.io.gfile reads)."""
    root = source_dir.rstrip("/")
    return {posixpath.relpath(path, root): _file_entry(path) for path in sorted(_walk_files(root))}


def _copy_tree(source_dir: str, target: Path, extra: Mapping[str, str] | None = None) -> None:
    import tensorflow as tf

    root = source_dir.rstrip("/")
    files = {posixpath.relpath(path, root): path for path in _walk_files(root)}
    for relative, path in {**files, **(extra or {})}.items():
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        tf.io.gfile.copy(path, str(destination), overwrite=True)


def _exists(path: str) -> bool:
    import tensorflow as tf

    return tf.io.gfile.exists(path)


def _file_entry(path: str) -> dict[str, object]:
    import tensorflow as tf

    return {"sha256": file_sha256(_gfile_chunks(path)), "bytes": tf.io.gfile.stat(path).length}


def _export_report(source_dir: str) -> ExportReport | None:
    from components import artifacts  # TensorFlow's file systems, imported only when a model is published

    path = artifacts.join(source_dir.rstrip("/"), EXPORT_REPORT_JSON)
    try:
        return artifacts.read_export_report(source_dir.rstrip("/"))
    except ValueError as e:
        raise RepositoryError(f"the export report {path} cannot be read ({e}); export the model again.") from None


def publication_fields(report: ExportReport) -> dict[str, Any]:
    """What publication.json carries from the export report: the task (kind, output, classes, the metric that judged
    it, with the SavedModel's eval figures), the calibration (method and decision threshold) when the model was
    calibrated, and how the training CSV encodes a request row; a report written before task kinds has no task."""
    fields: dict[str, Any] = {}
    if report.task is not None:
        # A client or a rollout can tell a classifier's probabilities from a regression's value without the model.
        fields["task"] = {**report.task.to_dict(), "eval": {"artifact": REFERENCE_ARTIFACT, **report.reference}}
    calibration = report.calibration
    if calibration is not None and calibration.method not in ("", "none"):
        # A client turns a probability into a decision with the threshold chosen for this version.
        fields["calibration"] = {"method": calibration.method, "threshold": calibration.threshold,
                                 "objective": calibration.objective, "fitted_on": calibration.fitted_on,
                                 "rows": calibration.rows}
    if report.request is not None:
        # `mlops predict --csv` reads rows as the training CSV was read: its markers, without its label.
        fields["request"] = report.request.to_dict()
    return fields


def publish_model(
    source_dir: str, serving_base_dir: str, model_name: str, record: Mapping[str, object],
    training: TrainingData | None = None,
) -> PublishedVersion:
    """Publishes the SavedModel folder `source_dir` (with its other formats and export report) as the next version
    of `model_name` under `serving_base_dir`, with `record` in its publication.json and, when given, the schema and
    statistics of its training data in assets.extra/training/.

    Publishing routes no traffic. Only when no track serves the model yet (its first version) does each track's
    config start serving it, so that a server started on the repository has something to answer with; after that
    a rollout (`mlops rollout start --version V`) moves traffic.
    """
    report = _export_report(source_dir)
    if report is not None and not report.passed:
        raise RepositoryError(f"the export report in {source_dir} failed; a model whose formats disagree is never "
                              "published. Fix the export (see export_report.html) and run again.")
    if report is not None:
        record = {**record, **publication_fields(report)}
    repository = open_repository(serving_base_dir)
    manifest = source_manifest(source_dir)
    if PUBLICATION_FILE in manifest:
        raise RepositoryError(f"{source_dir} already holds a {PUBLICATION_FILE}; publish an export folder.")
    extra = training.files() if training is not None else {}
    missing = [path for path in extra.values() if not _exists(path)]
    if missing:
        raise RepositoryError(f"the training data file {missing[0]} does not exist, so the version could not carry it; "
                              "publish from a pipeline run whose StatisticsGen and schema artifacts are in place.")
    # The training files count in the content: the version is the same only with the same model and the same data.
    manifest = {**manifest, **{name: _file_entry(path) for name, path in extra.items()}}
    existing = repository.version_with_content(model_name, content_digest(manifest))
    if existing is not None:
        version, new = existing, False
    else:
        version = repository.publish(model_name, lambda folder: _copy_tree(source_dir, folder, extra), record)
        new = True
    bootstrapped = tuple(track for track in TRACK_CONFIG_FILES
                         if open_repository(serving_base_dir, track).serve_if_unserved(model_name, version, track))
    return PublishedVersion(version, os.fspath(repository.version_dir(model_name, version)), new, bootstrapped)
