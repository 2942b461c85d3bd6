"""ServingBaseline's plain function: the version labelled stable or the newest blessed one, its SavedModel copied
where TFX's Evaluator loads a model from, and a clean "no baseline" for an empty repository."""
import shutil
from pathlib import Path

import pytest
import tensorflow as tf
from tfx.types import standard_artifacts

from components.serving_baseline.evaluator import BASELINE_KEY, without_empty_baseline
from components.serving_baseline.resolve import (
    RESOLVED_PROPERTY,
    BaselineError,
    choose_version,
    repository_state,
    resolve_baseline,
)
from serving.repository.factory import open_repository

MODEL = "taxi"


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory) -> dict[str, Path]:
    """A SavedModel with the signatures TFMA feeds, and one without them."""
    folder = tmp_path_factory.mktemp("saved_models")

    class Scorer(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def score(self, examples):
            return {"probabilities": tf.zeros_like(examples, tf.float32)}

    module = Scorer()
    tf.saved_model.save(module, str(folder / "good"), signatures={"serving_examples": module.score,
                                                                  "transform_features": module.score})
    tf.saved_model.save(module, str(folder / "bare"), signatures={"serving_default": module.score})
    return {"good": folder / "good", "bare": folder / "bare"}


def publish(base: Path, saved_model: Path, blessed: bool = True) -> int:
    """A version as the Publisher writes it: the SavedModel at the root, another format beside it."""
    def write(folder: Path) -> None:
        shutil.copytree(saved_model, folder, dirs_exist_ok=True)
        (folder / "tflite").mkdir()
        (folder / "tflite" / "model.tflite").write_bytes(b"not read")

    repository = open_repository(base)
    version = repository.publish(MODEL, write, {"blessed": blessed})
    open_repository(base, "stable").serve_if_unserved(MODEL, version, "stable")
    return version


def test_an_empty_repository_is_no_baseline(tmp_path):
    output = tmp_path / "out"
    assert resolve_baseline(str(tmp_path / "serving"), MODEL, "stable", str(output)) is None
    assert not (output / "Format-Serving").exists()


def test_stable_is_the_labelled_version_and_only_its_saved_model_is_copied(tmp_path, saved_models):
    base = tmp_path / "serving"
    first, second = publish(base, saved_models["good"]), publish(base, saved_models["good"])
    # Publishing routes no traffic: the first version stays stable, the newest blessed one is the second.
    assert choose_version(str(base), MODEL, "stable") == first
    assert choose_version(str(base), MODEL, "published_blessed") == second
    open_repository(base).serve(MODEL, [first, second], labels={"stable": second})
    assert choose_version(str(base), MODEL, "stable") == second
    baseline = resolve_baseline(str(base), MODEL, "stable", str(tmp_path / "out"))
    assert baseline.version == second and baseline.source == str(base / MODEL / str(second))
    copied = tmp_path / "out" / "Format-Serving"
    assert (copied / "saved_model.pb").is_file() and (copied / "variables").is_dir()
    assert not (copied / "tflite").exists() and not (copied / "MANIFEST.json").exists()
    assert set(tf.saved_model.load(str(copied)).signatures) == {"serving_examples", "transform_features"}


def test_unblessed_versions_are_skipped_and_an_unlabelled_repository_falls_back_to_them(tmp_path, saved_models):
    base = tmp_path / "serving"
    blessed = publish(base, saved_models["good"])
    publish(base, saved_models["good"], blessed=False)
    assert choose_version(str(base), MODEL, "published_blessed") == blessed
    open_repository(base).remove_model(MODEL)
    assert choose_version(str(base), MODEL, "stable") == blessed


def test_a_baseline_the_evaluator_cannot_feed_or_a_changed_one_is_refused_in_one_sentence(tmp_path, saved_models):
    base = tmp_path / "serving"
    version = publish(base, saved_models["bare"])
    with pytest.raises(BaselineError, match="no serving_examples, transform_features signature"):
        resolve_baseline(str(base), MODEL, "stable", str(tmp_path / "out"))
    other = tmp_path / "other"
    version = publish(other, saved_models["good"])
    (other / MODEL / str(version) / "saved_model.pb").write_bytes(b"changed")
    with pytest.raises(BaselineError, match="does not match its manifest"):
        resolve_baseline(str(other), MODEL, "stable", str(tmp_path / "out"))
    with pytest.raises(BaselineError, match="must be one of stable, published_blessed"):
        choose_version(str(other), MODEL, "latest_blessed")


def test_the_cache_key_changes_with_the_repository(tmp_path, saved_models):
    base = tmp_path / "serving"
    empty = repository_state(str(base), MODEL)
    first = publish(base, saved_models["good"])
    one = repository_state(str(base), MODEL)
    assert one != empty and repository_state(str(base), MODEL) == one
    second = publish(base, saved_models["good"])
    two = repository_state(str(base), MODEL)
    open_repository(base).serve(MODEL, [first, second], labels={"stable": second})
    assert len({empty, one, two, repository_state(str(base), MODEL)}) == 4


def test_the_evaluator_reads_an_empty_baseline_as_none():
    empty, found, candidate = standard_artifacts.Model(), standard_artifacts.Model(), standard_artifacts.Model()
    empty.set_int_custom_property(RESOLVED_PROPERTY, 0)
    found.set_int_custom_property(RESOLVED_PROPERTY, 1)
    assert without_empty_baseline({"model": [candidate], BASELINE_KEY: [empty]}) == {"model": [candidate]}
    kept = {"model": [candidate], BASELINE_KEY: [found]}
    assert without_empty_baseline(kept) == kept
    # On Kubeflow the property arrives as a JSON number (TFX's KFP V2 entry point turns custom properties to structs).
    from_kfp = standard_artifacts.Model()
    from_kfp.set_json_value_custom_property(RESOLVED_PROPERTY, 0.0)
    assert without_empty_baseline({"model": [candidate], BASELINE_KEY: [from_kfp]}) == {"model": [candidate]}
    # An MLMD resolver's baseline carries no such property and stays.
    assert without_empty_baseline({BASELINE_KEY: [candidate]}) == {BASELINE_KEY: [candidate]}


def test_a_gcs_repository_gives_its_stable_version_into_a_gcs_artifact(saved_models):
    from components.publisher.publish import publish_model
    from tests.gcs_emulator import GcsEmulator

    with GcsEmulator() as gcs, pytest.MonkeyPatch.context() as patch:
        for name, value in gcs.environment().items():
            patch.setenv(name, value)
        gcs.create_bucket("models")
        base = "gs://models/serving"
        assert resolve_baseline(base, MODEL, "stable", "gs://models/root/ServingBaseline/model/1") is None
        publish_model(str(saved_models["good"]), base, MODEL, {"blessed": True})
        baseline = resolve_baseline(base, MODEL, "stable", "gs://models/root/ServingBaseline/model/2")
        assert (baseline.version, baseline.source) == (1, f"{base}/{MODEL}/1")
        objects = set(gcs.list_objects("models", "root/"))
        assert "root/ServingBaseline/model/2/Format-Serving/saved_model.pb" in objects
        assert not any("/model/1/" in name for name in objects)
