"""The Evaluator's baseline from the model repository the Publisher writes (a local folder or gs://): the version
labelled `stable` in models.config (`evaluation.baseline: stable`) or the newest published version whose
publication.json says it was blessed (`published_blessed`). No ML Metadata is read, so it runs the same locally, on
open-source Kubeflow Pipelines (which runs no TFX resolver) and on Vertex AI.

A version folder holds the Exporter's SavedModel at its root (with tflite/, onnx/, tfjs/ beside it); only the
SavedModel is copied, into the Format-Serving folder of a Model artifact, where TFX's Evaluator looks for a model.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from absl import logging

from components import artifacts
from serving.repository.base import RepositoryError
from serving.repository.factory import open_repository

STABLE = "stable"
PUBLISHED_BLESSED = "published_blessed"
RULES = (STABLE, PUBLISHED_BLESSED)
# What TFMA feeds the baseline (pipeline.pipeline.eval_config): both models must carry these signatures.
REQUIRED_SIGNATURES = ("serving_examples", "transform_features")
# The SavedModel's own entries in a version folder; the other formats and the reports stay behind.
SAVED_MODEL_ENTRIES = ("saved_model.pb", "fingerprint.pb", "variables", "assets", "assets.extra")
# Custom properties of the output Model: the Evaluator's executor drops a baseline whose `resolved` is 0.
RESOLVED_PROPERTY = "resolved"
VERSION_PROPERTY = "baseline_version"
SOURCE_PROPERTY = "baseline_source"


class BaselineError(ValueError):
    """The repository names a baseline the Evaluator cannot use; the message says what to do."""


@dataclass(frozen=True)
class Baseline:
    version: int
    # The published version folder the SavedModel was copied from.
    source: str


def choose_version(serving_base_dir: str, model_name: str, rule: str) -> int | None:
    """The version `rule` names in the repository, or None when there is none yet (the first run)."""
    if rule not in RULES:
        raise BaselineError(f"the repository baseline must be one of {', '.join(RULES)}; got {rule!r}.")
    repository = open_repository(serving_base_dir)
    versions = repository.versions(model_name)
    if not versions:
        return None
    if rule == STABLE:
        stable = repository.labels(model_name).get(STABLE)
        if stable in versions:
            return stable
        # Published but nothing labelled stable (a repository edited by hand): the newest blessed one serves best.
        logging.warning("no version of %s is labelled stable in %s; comparing with the newest blessed version",
                        model_name, serving_base_dir)
    for version in reversed(versions):
        if repository.publication(model_name, version).get("blessed") is True:
            return version
    return None


def check_signatures(saved_model_pb: bytes, source: str) -> None:
    """Raises BaselineError unless the SavedModel has the signatures TFMA feeds."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel.FromString(saved_model_pb)
    signatures = {name for graph in saved_model.meta_graphs for name in graph.signature_def}
    missing = [name for name in REQUIRED_SIGNATURES if name not in signatures]
    if missing:
        raise BaselineError(f"the baseline {source} has no {', '.join(missing)} signature, which the Evaluator "
                            "feeds; label a version this pipeline published as stable, or set "
                            "evaluation.baseline=none.")


def resolve_baseline(serving_base_dir: str, model_name: str, rule: str, output_uri: str) -> Baseline | None:
    """Copies the SavedModel of the version `rule` names into `<output_uri>/Format-Serving`; None (nothing copied)
    when the repository holds no such version yet."""
    version = choose_version(serving_base_dir, model_name, rule)
    if version is None:
        logging.info("no published version of %s in %s: no baseline, the bounds alone decide", model_name,
                     serving_base_dir)
        return None
    repository = open_repository(serving_base_dir)
    check = repository.verify(model_name, version)
    if check.state == "MISMATCH":
        raise BaselineError(f"version {version} of {model_name} in {serving_base_dir} does not match its manifest "
                            f"({'; '.join(check.problems)}); restore it or label another version stable.")
    source = str(repository.version_dir(model_name, version))
    check_signatures(artifacts.read_bytes(artifacts.join(source, "saved_model.pb")), source)
    target = artifacts.serving_model_dir(output_uri)
    artifacts.make_dirs(target)
    for entry in SAVED_MODEL_ENTRIES:
        path = artifacts.join(source, entry)
        if entry.endswith(".pb") and artifacts.exists(path):
            artifacts.write_bytes(artifacts.join(target, entry), artifacts.read_bytes(path))
        elif artifacts.exists(path):
            artifacts.copy_tree(path, artifacts.join(target, entry))
    logging.info("baseline: version %d of %s (%s)", version, model_name, source)
    return Baseline(version, source)


def repository_state(serving_base_dir: str, model_name: str) -> str:
    """A digest of what choose_version reads (versions, labels, blessings): as a property it keys TFX's cache, so a
    local re-run reuses the baseline exactly while the repository is unchanged."""
    try:
        repository = open_repository(serving_base_dir)
        versions = repository.versions(model_name)
        state = {"versions": versions, "labels": repository.labels(model_name),
                 "blessed": [v for v in versions if repository.publication(model_name, v).get("blessed") is True]}
    except (OSError, RepositoryError) as error:
        # The executor reports the problem with its context; the cache key only needs to differ.
        state = {"unreadable": str(error)}
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()[:16]
