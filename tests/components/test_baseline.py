"""The baseline the Evaluator compares with: the newest blessed model other than the candidate, in the two-channel
form TFX's Kubeflow V2 compiler accepts."""
import pytest
from tfx import types
from tfx import v1 as tfx

from components.baseline import PreviousBlessedModelStrategy, baseline_resolver, candidate_ids
from components.specs import MODEL_BLESSING_KEY, MODEL_KEY
from tests.mlmd_records import Execution, Recorder


def tfx_artifact(record, cls):
    artifact = cls()
    artifact.set_mlmd_artifact(record)
    return artifact


@pytest.fixture
def history(tmp_path):
    """run-1 trains and blesses M1; run-2 trains M2, blessed; run-3 is run-2 again, served from the cache."""
    recorder = Recorder(str(tmp_path / "metadata.db"))
    models, blessings = [], []
    for name, cached_from in (("run-1", None), ("run-2", None), ("run-3", 1)):
        run = recorder.run(name)
        if cached_from is None:
            model = recorder.artifact("Model", f"/models/{name}")
            recorder.execution(run, "Optimizer", outputs={"optimized_model": [model]})
            blessing = recorder.artifact("ModelBlessing", f"/blessings/{name}",
                                         custom={"blessed": 1, "current_model_id": model.id})
            recorder.execution(run, "Evaluator", outputs={"blessing": [blessing]})
            models.append(model)
            blessings.append(blessing)
        else:
            recorder.execution(run, "Optimizer", Execution.CACHED, outputs={"optimized_model": [models[cached_from]]})
    return recorder.store, models, blessings


def resolve(store, models, blessings):
    input_dict = {MODEL_KEY: [tfx_artifact(m, tfx.types.standard_artifacts.Model) for m in models],
                  MODEL_BLESSING_KEY: [tfx_artifact(b, tfx.types.standard_artifacts.ModelBlessing) for b in blessings]}
    result = PreviousBlessedModelStrategy().resolve_artifacts(store, input_dict)
    return [a.uri for a in result[MODEL_KEY]], [a.uri for a in result[MODEL_BLESSING_KEY]]


def test_a_cached_rerun_compares_with_what_the_first_run_compared_with(history):
    store, models, blessings = history
    # run-3 reused M2: the candidate is M2, so the baseline stays M1, as when run-2 evaluated M2 first.
    assert candidate_ids(store, [m.id for m in models]) == {models[1].id}
    assert resolve(store, models, blessings) == (["/models/run-1"], ["/blessings/run-1"])


def test_a_fresh_model_is_compared_with_the_newest_blessed_one(history, tmp_path):
    store, models, blessings = history
    recorder = Recorder(str(tmp_path / "metadata.db"))
    fresh = recorder.artifact("Model", "/models/run-4")
    recorder.execution(recorder.run("run-4"), "Optimizer", outputs={"optimized_model": [fresh]})
    assert resolve(store, [*models, fresh], blessings) == (["/models/run-2"], ["/blessings/run-2"])


def test_unblessed_models_and_the_first_run_have_no_baseline(history):
    store, models, blessings = history
    blessings[0].custom_properties["blessed"].int_value = 0
    assert resolve(store, models, blessings) == ([], [])
    assert resolve(store, models, []) == ([], [])


@pytest.mark.parametrize("kind", ["previous_blessed", "latest_blessed"])
def test_both_resolving_baselines_take_exactly_a_model_and_a_blessing_channel(kind):
    """The form TFX's Kubeflow V2 compiler accepts for LatestBlessedModelStrategy (its step builder asserts it)."""
    node = baseline_resolver(kind, "Optimizer", "optimized_model", "Evaluator")
    channels = {key: channel.type for key, channel in node.inputs.items()}
    assert channels == {MODEL_KEY: types.standard_artifacts.Model,
                        MODEL_BLESSING_KEY: types.standard_artifacts.ModelBlessing}


def test_no_baseline_is_no_node():
    assert baseline_resolver("none", "Optimizer", "optimized_model", "Evaluator") is None
    with pytest.raises(ValueError, match="evaluation.baseline must be"):
        baseline_resolver("newest", "Optimizer", "optimized_model", "Evaluator")
