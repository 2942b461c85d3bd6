"""Two local runs with evaluation.baseline=stable: the first publishes version 1 with no baseline; the second, a
model that cannot see the payment type, is compared with version 1 through ServingBaseline and not blessed."""
from pathlib import Path

import pytest

from components.serving_baseline.resolve import RESOLVED_PROPERTY, VERSION_PROPERTY
from pipeline import metadata
from pipeline.pipeline import EVALUATOR_NODE, SERVING_BASELINE_NODE
from pipeline.runner import run_local
from tests.conftest import small_config

# The taxi job's strongest feature left out (cash tips are not recorded, so the payment type nearly decides the
# label), and with it the slices by payment type.
WITHOUT_PAYMENT_TYPE = ["data.vocab_features=[company, dropoff_census_tract]", "evaluation.slice_feature="]
# A lower bound that model still meets (eval AUC about 0.63), so only the comparison with the baseline can refuse it.
SETTINGS = ["evaluation.baseline=stable", "evaluation.lower_bound=0.5"]


@pytest.fixture(scope="module")
def two_runs(taxi_slice, tmp_path_factory):
    output_root = tmp_path_factory.mktemp("outputs")
    first_config = small_config(taxi_slice, output_root, *SETTINGS)
    first = run_local(first_config)
    first_baseline = baseline_output(first_config)
    second_config = small_config(taxi_slice, output_root, *SETTINGS, *WITHOUT_PAYMENT_TYPE)
    second = run_local(second_config)
    return second_config, first, first_baseline, second, baseline_output(second_config)


def baseline_output(config):
    """ServingBaseline's newest Model, and whether the Evaluator's newest execution took it as its baseline."""
    store = metadata.connect(config.metadata_path)
    model = metadata.latest_outputs(store, config.name, SERVING_BASELINE_NODE)["model"]
    evaluator = store.get_context_by_type_and_name(metadata.NODE_CONTEXT, f"{config.name}.{EVALUATOR_NODE}")
    latest = max(store.get_executions_by_context(evaluator.id), key=lambda e: e.id)
    inputs = {e.artifact_id for e in store.get_events_by_execution_ids([latest.id])
              if e.type == e.INPUT}
    return model, model.id in inputs


def test_the_first_run_has_no_baseline_and_publishes_version_1(two_runs):
    _, first, (model, taken), _, _ = two_runs
    assert model.custom_properties[RESOLVED_PROPERTY].int_value == 0 and taken
    assert first.blessed is True and first.published_version == 1
    assert "metrics" not in first.baseline


def test_the_second_run_is_compared_with_the_stable_version_through_serving_baseline(two_runs):
    config, first, _, second, (model, taken) = two_runs
    assert SERVING_BASELINE_NODE not in second.cached_stages, "the repository changed: resolved again"
    assert model.custom_properties[RESOLVED_PROPERTY].int_value == 1 and taken
    assert model.custom_properties[VERSION_PROPERTY].int_value == 1
    assert Path(model.uri, "Format-Serving", "saved_model.pb").is_file()
    # The baseline scored on the same eval rows is the first run's model, figure for figure.
    assert second.baseline["metrics"]["auc"] == pytest.approx(first.metrics["auc"], abs=1e-6)


def test_a_worse_second_model_is_not_blessed_and_not_published(two_runs):
    config, first, _, second, _ = two_runs
    auc = second.metrics["auc"]
    assert config.evaluation.lower_bound <= auc < first.metrics["auc"] - config.evaluation.max_degradation
    # Within the bounds, so the AUC failed its change threshold against the baseline.
    assert second.blessed is False and second.baseline["validation_ok"] is False
    assert second.baseline["failures"] == ["auc"]
    # The run says why, naming the keys of that comparison with this run's values.
    assert second.blessing_failure.startswith(f"the eval auc {auc:.4f} is ")
    assert (f"more than evaluation.max_degradation={config.evaluation.max_degradation:g} allows (the baseline model "
            "chosen by evaluation.baseline=stable") in second.blessing_failure
    assert second.published_version is None
    assert sorted(p.name for p in Path(config.serving_dir).iterdir() if p.name.isdigit()) == ["1"]
