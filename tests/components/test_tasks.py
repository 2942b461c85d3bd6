"""The task kinds' metrics and the direction of every gate on them, at their thresholds: just inside passes, just
outside fails, for a metric where higher is better (AUC, macro AUC, R²) and for an error (RMSE, MAE, log loss), in the
Evaluator's blessing (through TFMA's own validator), the Optimizer's pruning gate and the Exporter's gate."""
import dataclasses

import numpy as np
import pytest
from sklearn.metrics import log_loss, mean_absolute_error, precision_score, r2_score, recall_score, roc_auc_score
from tensorflow_model_analysis.evaluators import metrics_validator
from tensorflow_model_analysis.metrics import metric_specs
from tensorflow_model_analysis.utils import config_util

from components.exporter.export import check_artifact
from components.optimizer.optimize import pruning_gate
from components.tasks import (
    BinaryStats,
    MulticlassStats,
    RegressionStats,
    degradation,
    degradation_gate,
    max_output_difference,
    no_skill_figures,
    task_metrics,
)
from pipeline.pipeline import eval_config
from settings.config import DEFAULT_CONFIG, ConfigError, ExportConfig, load_config
from settings.tasks import TASK_METRICS, task_metric

CONFIGS = DEFAULT_CONFIG.parent
STEP = 1e-4


def example_config(name: str, *overrides: str):
    return load_config(str(CONFIGS / f"{name}.yaml"), list(overrides))


# --- the direction of each metric -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, metric, higher", [
    (kind, metric, higher) for kind, metrics in TASK_METRICS.items() for metric, higher in metrics.items()])
def test_degradation_runs_the_metrics_way_at_the_limit(kind, metric, higher):
    before, limit = 0.5, 0.02
    worse_inside = before - (limit - STEP) if higher else before + (limit - STEP)
    worse_outside = before - (limit + STEP) if higher else before + (limit + STEP)
    assert degradation_gate(kind, metric, before, worse_inside, limit) == (pytest.approx(limit - STEP), True)
    assert degradation_gate(kind, metric, before, worse_outside, limit) == (pytest.approx(limit + STEP), False)
    # An improvement of the same size is a negative degradation and passes even a limit of 0.
    better = before + (limit + STEP) if higher else before - (limit + STEP)
    assert degradation_gate(kind, metric, before, better, 0.0) == (pytest.approx(-(limit + STEP)), True)


def test_each_kind_defaults_to_its_first_metric_and_a_nan_never_passes():
    assert [task_metric(kind) for kind in TASK_METRICS] == ["auc", "macro_auc", "rmse"]
    assert degradation("regression", "auto", 50.0, 52.0) == 2.0
    assert degradation_gate("regression", "rmse", 50.0, float("nan"), 100.0)[1] is False
    assert degradation_gate("binary", "auc", 0.9, float("nan"), 1.0)[1] is False


@pytest.mark.parametrize("higher, before, inside, outside", [
    (True, 0.9312, 0.9312 - 0.0149, 0.9312 - 0.0151),   # AUC: a drop
    (False, 54.32, 54.32 + 0.0149, 54.32 + 0.0151),     # RMSE: a rise
])
def test_pruning_gate_in_each_direction(higher, before, inside, outside):
    assert pruning_gate(before, inside, 0.015, higher)[1] is True
    assert pruning_gate(before, outside, 0.015, higher)[1] is False
    # The other way round is an improvement, and passes a zero allowance.
    improved = before + (before - outside) if higher else before - (outside - before)
    worse, passed = pruning_gate(before, improved, 0.0, higher)
    assert worse < 0 and passed


# --- the Evaluator's blessing, through TFMA's validator ----------------------------------------------------------

def validate(config, value: float, change: float) -> bool:
    """TFMA's verdict on the blessing metric with `value` for the candidate and `change` (candidate - baseline)."""
    config_with_baseline = config_util.update_eval_config_with_defaults(eval_config(config), has_baseline=True)
    thresholds = metric_specs.metric_thresholds_from_metrics_specs(config_with_baseline.metrics_specs,
                                                                   eval_config=config_with_baseline)
    candidate = {key: (change if key.is_diff else value) for key in thresholds if key.model_name == "candidate"}
    assert {key.name for key in candidate} == {TFMA_KEYS[task_metric(config.label.kind, config.evaluation.metric)]}
    return metrics_validator.validate_metrics(((), candidate), config_with_baseline).validation_ok


TFMA_KEYS = {"auc": "auc", "accuracy": "binary_accuracy", "macro_auc": "macro_auc", "log_loss": "log_loss",
             "rmse": "rmse", "mae": "mae", "r2": "r2"}


@pytest.mark.parametrize("name, overrides, bound, higher", [
    pytest.param("taxi", [], 0.6, True, id="binary-auc"),
    pytest.param("iris", [], 0.9, True, id="multiclass-macro_auc"),
    pytest.param("iris", ["evaluation.metric=log_loss", "evaluation.lower_bound=null",
                          "evaluation.upper_bound=0.4", "evaluation.max_degradation=0.05"], 0.4, False,
                 id="multiclass-log_loss"),
    pytest.param("diabetes", [], 70.0, False, id="regression-rmse"),
    pytest.param("diabetes", ["evaluation.metric=r2", "evaluation.upper_bound=null", "evaluation.lower_bound=0.3",
                              "evaluation.max_degradation=0.03"], 0.3, True, id="regression-r2"),
])
def test_blessing_at_the_bound_and_the_change_threshold(name, overrides, bound, higher):
    config = example_config(name, *overrides)
    allowed = config.evaluation.max_degradation
    better_than_bound = bound + STEP if higher else bound - STEP
    worse_than_bound = bound - STEP if higher else bound + STEP
    # Just worse than the baseline by the allowance passes; a hair more does not (a drop for AUC, a rise for RMSE).
    sign = -1 if higher else 1
    assert validate(config, better_than_bound, sign * (allowed - STEP))
    assert not validate(config, better_than_bound, sign * (allowed + STEP))
    assert not validate(config, worse_than_bound, sign * (allowed - STEP))
    # A large improvement over the baseline passes: a threshold the wrong way round would refuse it.
    assert validate(config, better_than_bound, -sign * 10 * allowed)


def _verdict(config, figures: dict[str, float]) -> bool:
    """TFMA's verdict on a first model (no baseline) with these overall figures (TFMA metric names)."""
    evaluation_config = config_util.update_eval_config_with_defaults(eval_config(config), has_baseline=False)
    thresholds = metric_specs.metric_thresholds_from_metrics_specs(evaluation_config.metrics_specs,
                                                                   eval_config=evaluation_config)
    candidate = {key: figures[key.name] for key in thresholds if not key.is_diff}
    assert {key.name for key in candidate} == set(figures)
    return metrics_validator.validate_metrics(((), candidate), evaluation_config).validation_ok


def test_a_multiclass_model_no_better_than_the_majority_class_is_not_blessed():
    # Five classes, the most common 49% of the rows: `mlops init` writes no_skill.accuracy 0.49 beside the AUC bound.
    config = example_config("iris", "evaluation.baseline=none", "evaluation.lower_bound=0.6",
                            "evaluation.no_skill.accuracy=0.49")
    assert not _verdict(config, {"macro_auc": 0.85, "accuracy": 0.52}), "a good AUC does not bless a weak model"
    assert _verdict(config, {"macro_auc": 0.85, "accuracy": 0.541 + STEP})
    assert not _verdict(config, {"macro_auc": 0.85, "accuracy": 0.541 - STEP})
    assert not _verdict(config, {"macro_auc": 0.55, "accuracy": 0.9})
    both = example_config("iris", "evaluation.baseline=none", "evaluation.metric=accuracy",
                          "evaluation.lower_bound=0.5", "evaluation.no_skill.accuracy=0.49")
    assert not _verdict(both, {"accuracy": 0.53}), "the higher of the two bounds holds"


@pytest.mark.parametrize("name, no_skill, margin, others, metric, bound", [
    # Binary: the base rate's log loss (0.6109, three positives in ten); the bound 0.9 of it.
    pytest.param("taxi", "log_loss=0.6109", 0.1, {"auc": 0.9}, "log_loss", 0.9 * 0.6109, id="binary-log_loss"),
    pytest.param("taxi", "accuracy=0.7", 0.0, {"auc": 0.9}, "binary_accuracy", 0.7, id="binary-accuracy-margin-0"),
    # Multiclass: the class shares' log loss, judged beside the macro AUC bound.
    pytest.param("iris", "log_loss=1.0986", 0.2, {"macro_auc": 0.95}, "log_loss", 0.8 * 1.0986,
                 id="multiclass-log_loss"),
    # Regression: the mean's RMSE; 0.9 of 77 is stricter than the config's upper_bound 70.
    pytest.param("diabetes", "rmse=77", 0.1, {}, "rmse", 69.3, id="regression-rmse"),
    # ... and 0.9 of 80 is not: upper_bound 70 holds.
    pytest.param("diabetes", "rmse=80", 0.1, {}, "rmse", 70.0, id="regression-rmse-upper-bound-stricter"),
    pytest.param("diabetes", "r2=0", 0.1, {"rmse": 50.0}, "r2", 0.1, id="regression-r2"),
])
def test_a_model_must_beat_the_no_skill_figure_by_the_margin(name, no_skill, margin, others, metric, bound):
    config = example_config(name, "evaluation.baseline=none", f"evaluation.no_skill.{no_skill}",
                            f"evaluation.no_skill_margin={margin}")
    higher = metric in ("binary_accuracy", "r2")
    inside, outside = (bound + STEP, bound - STEP) if higher else (bound - STEP, bound + STEP)
    assert _verdict(config, {**others, metric: inside})
    assert not _verdict(config, {**others, metric: outside})


def test_no_skill_figures_a_model_cannot_score_are_one_sentence():
    with pytest.raises(ConfigError, match=r"evaluation.no_skill.auc names no metric of a regression model; name "
                                          r"rmse, mae, r2, or remove it\."):
        example_config("diabetes", "evaluation.no_skill.auc=0.5")
    with pytest.raises(ConfigError, match=r"evaluation.no_skill.accuracy \(1.5\) is not a accuracy a model can "
                                          r"score \(from 0 to 1\)"):
        example_config("iris", "evaluation.no_skill.accuracy=1.5")
    with pytest.raises(ConfigError, match=r"evaluation.no_skill.rmse \(-1.0\) is not a rmse"):
        example_config("diabetes", "evaluation.no_skill.rmse=-1")
    with pytest.raises(ConfigError, match=r"evaluation.no_skill_margin \(1.0\) must be from 0"):
        example_config("iris", "evaluation.no_skill_margin=1")
    with pytest.raises(ConfigError, match=r"config key 'evaluation.min_accuracy' is now evaluation.no_skill.accuracy"):
        example_config("iris", "evaluation.min_accuracy=0.541")
    assert example_config("diabetes", "evaluation.baseline=none", "evaluation.upper_bound=null",
                          "evaluation.no_skill.rmse=77").evaluation.no_skill == {"rmse": 77.0}, \
        "a no-skill figure is a bound: with no baseline it alone can bless"


def test_without_a_baseline_only_the_bound_blesses():
    config = example_config("diabetes", "evaluation.baseline=none")
    evaluation_config = eval_config(config)
    [metric] = [m for m in evaluation_config.metrics_specs[0].metrics if m.per_slice_thresholds]
    threshold = metric.per_slice_thresholds[0].threshold
    assert threshold.value_threshold.upper_bound.value == 70.0
    assert not threshold.HasField("change_threshold")


def test_a_metric_of_another_kind_or_a_renamed_key_is_one_sentence():
    with pytest.raises(ConfigError, match=r"evaluation.metric 'auc' does not judge a regression model; choose auto, "
                                          r"rmse, mae, r2\."):
        example_config("diabetes", "evaluation.metric=auc")
    with pytest.raises(ConfigError, match=r"config key 'evaluation.min_auc' is now evaluation.lower_bound"):
        load_config(None, ["evaluation.min_auc=0.7"])
    with pytest.raises(ConfigError, match=r"label.positive_value defines a binary label, but label.kind is "
                                          r"multiclass"):
        example_config("iris", "label.positive_value=setosa")
    with pytest.raises(ConfigError, match=r"nothing could bless a model"):
        example_config("diabetes", "evaluation.baseline=none", "evaluation.upper_bound=null")


# --- the Exporter's gate per kind ---------------------------------------------------------------------------------

def export_options(**changes):
    return dataclasses.replace(ExportConfig(), **{"max_abs_diff": 1e-4, "max_quantized_degradation": 2.0, **changes})


@pytest.fixture(scope="module")
def regression_set():
    rng = np.random.default_rng(12)
    labels = rng.normal(150.0, 77.0, 500)
    reference = (labels + rng.normal(0.0, 50.0, 500)).astype(np.float32)
    return reference, labels


@pytest.fixture(scope="module")
def multiclass_set():
    rng = np.random.default_rng(13)
    labels = rng.integers(0, 3, 600)
    logits = rng.normal(0.0, 1.0, (600, 3)) + 1.5 * np.eye(3)[labels]
    reference = (np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)).astype(np.float32)
    return reference, labels


@pytest.mark.parametrize("scale, passes", [(0.98, True), (1.02, False)])
def test_a_float_regression_format_is_held_to_max_abs_diff_relative_to_the_value(regression_set, scale, passes):
    reference, labels = regression_set
    outputs = reference.astype(np.float64).copy()
    # Row 3 differs by `scale` x 1e-4 of its size; the rest by far less.
    outputs[3] = reference[3] + scale * 1e-4 * max(1.0, abs(float(reference[3])))
    row = check_artifact("onnx", outputs, reference, labels, export_options(), "regression")
    assert row.max_abs_diff == pytest.approx(scale * 1e-4, rel=1e-3)
    assert row.check.figure == "max_abs_diff" and row.check.passed is passes
    assert set(row.metrics) == {"rmse", "mae", "r2"}


@pytest.mark.parametrize("shift, passes", [(STEP, True), (-STEP, False)])
def test_a_quantized_regression_variant_may_raise_the_rmse_by_the_allowance(regression_set, shift, passes):
    reference, labels = regression_set
    quantized = reference + np.float32(3.0)  # off by a constant: RMSE rises
    rmse = {name: task_metrics("regression", values, labels)["rmse"] for name, values in
            [("quantized", quantized), ("reference", reference)]}
    worse = rmse["quantized"] - rmse["reference"]
    assert worse > 0
    row = check_artifact("tflite/int8", quantized, reference, labels,
                         export_options(max_quantized_degradation=worse + shift), "regression")
    assert row.check.figure == "rmse_degradation" and row.check.value == pytest.approx(worse)
    assert row.check.config_key == "export.max_quantized_degradation"
    assert row.check.passed is passes
    # The SavedModel and the variant swapped: the variant has the lower RMSE, a negative degradation that passes 0.
    swapped = check_artifact("tflite/int8", reference, quantized, labels, export_options(max_quantized_degradation=0.0),
                             "regression")
    assert swapped.check.value == pytest.approx(-worse) and swapped.check.passed


@pytest.mark.parametrize("scale, passes", [(0.98, True), (1.02, False)])
def test_a_float_multiclass_format_is_held_to_max_abs_diff_over_every_class(multiclass_set, scale, passes):
    reference, labels = multiclass_set
    outputs = reference.astype(np.float64).copy()
    outputs[5, 2] += scale * 1e-4  # only the last class's probability of one row moves
    row = check_artifact("tfjs", outputs, reference, labels, export_options(), "multiclass")
    assert row.max_abs_diff == pytest.approx(scale * 1e-4, rel=1e-3)
    assert row.check.passed is passes


@pytest.mark.parametrize("metric", ["macro_auc", "log_loss", "accuracy"])
def test_a_quantized_multiclass_variant_is_judged_on_the_configured_metric(multiclass_set, metric):
    reference, labels = multiclass_set
    noisy = np.clip(reference + np.random.default_rng(3).normal(0.0, 0.15, reference.shape), 1e-3, None)
    quantized = (noisy / noisy.sum(axis=1, keepdims=True)).astype(np.float32)
    before, after = task_metrics("multiclass", reference, labels), task_metrics("multiclass", quantized, labels)
    worse = after[metric] - before[metric] if metric == "log_loss" else before[metric] - after[metric]
    assert worse > 0, "noise makes every figure worse"
    for limit, passes in [(worse + STEP, True), (worse - STEP, False)]:
        row = check_artifact("tflite/float16", quantized, reference, labels,
                             export_options(max_quantized_degradation=limit), "multiclass", metric)
        assert row.check.figure == f"{metric}_degradation"
        assert row.check.value == pytest.approx(worse) and row.check.passed is passes


# --- the metrics themselves -------------------------------------------------------------------------------------

def test_multiclass_metrics_match_scikit_learn(multiclass_set):
    probabilities, labels = multiclass_set
    metrics = task_metrics("multiclass", probabilities, labels)
    assert metrics["macro_auc"] == pytest.approx(roc_auc_score(labels, probabilities, multi_class="ovr",
                                                               average="macro"), abs=1e-9)
    assert metrics["log_loss"] == pytest.approx(log_loss(labels, probabilities), rel=1e-5)
    assert metrics["accuracy"] == pytest.approx(np.mean(probabilities.argmax(axis=1) == labels))


def test_regression_metrics_match_scikit_learn(regression_set):
    values, labels = regression_set
    metrics = task_metrics("regression", values, labels)
    assert metrics["mae"] == pytest.approx(mean_absolute_error(labels, values))
    assert metrics["rmse"] == pytest.approx(np.sqrt(np.mean((labels - values) ** 2)))
    assert metrics["r2"] == pytest.approx(r2_score(labels, values))


def test_the_evaluators_binary_log_loss_is_the_gates_and_finite_at_a_certain_wrong_answer():
    rng = np.random.default_rng(3)
    labels = (rng.random(300) < 0.3).astype(np.int64)
    probabilities = np.clip(0.3 + 0.4 * (labels - 0.3) + 0.2 * rng.standard_normal(300), 0.0, 1.0)
    probabilities[:2] = 1.0 - labels[:2]  # certain and wrong: TFMA's own BinaryCrossEntropy would be infinite
    first, second = BinaryStats(), BinaryStats()
    for i in range(300):
        (first if i < 120 else second).add(float(labels[i]), float(probabilities[i]))
    merged = first.merge(second).metrics()["log_loss"]
    direct = task_metrics("binary", probabilities, labels)["log_loss"]
    assert np.isfinite(merged) and merged == pytest.approx(direct, rel=1e-9)
    base_rate = no_skill_figures("binary", labels)["log_loss"]
    rate = labels.mean()
    assert base_rate == pytest.approx(-(rate * np.log(rate) + (1 - rate) * np.log(1 - rate)))
    assert np.isnan(BinaryStats().metrics()["log_loss"])


def test_the_evaluators_merged_multiclass_sums_give_the_same_figures(multiclass_set):
    probabilities, labels = multiclass_set
    # Two accumulators merged, as Beam combines partial results; the first sees only two of the three classes.
    first, second = MulticlassStats(), MulticlassStats()
    order = np.argsort(labels == 2, kind="stable")
    for i in order[:200]:
        first.add(int(labels[i]), probabilities[i, :2] / probabilities[i, :2].sum())
    for i in order[200:]:
        second.add(int(labels[i]), probabilities[i])
    whole = MulticlassStats()
    for i in range(len(labels)):
        whole.add(int(labels[i]), probabilities[i])
    figures = whole.metrics()
    direct = task_metrics("multiclass", probabilities, labels)
    assert figures["accuracy"] == pytest.approx(direct["accuracy"])
    assert figures["log_loss"] == pytest.approx(direct["log_loss"], rel=1e-6)
    assert figures["macro_auc"] == pytest.approx(direct["macro_auc"], rel=1e-12)
    predicted = probabilities.argmax(axis=1)
    assert figures["precision"] == pytest.approx(list(precision_score(labels, predicted, average=None)))
    assert figures["recall"] == pytest.approx(list(recall_score(labels, predicted, average=None)))
    merged = first.merge(second).metrics()
    assert merged["precision"] and len(merged["recall"]) == 3
    with pytest.raises(ValueError, match="outside the model's 3 classes"):
        whole.add(3, probabilities[0])


def test_a_confident_models_auc_is_the_exporters_not_the_histograms(monkeypatch):
    """Softmax outputs crowd into the end score buckets (0.99990 and 0.99999 share one): the Evaluator's macro AUC
    must still be the exact figure the Exporter prints beside it, up to EXACT_AUC_ROWS rows."""
    import components.tasks as tasks

    generator = np.random.default_rng(3)
    labels = generator.integers(0, 3, 60)
    logits = generator.normal(0.0, 1.0, (60, 3))
    logits[np.arange(60), labels] += 1.5
    scaled = np.exp(12.0 * (logits - logits.max(axis=1, keepdims=True)))
    probabilities = (scaled / scaled.sum(axis=1, keepdims=True)).astype(np.float32)  # as a model serves them
    exact = task_metrics("multiclass", probabilities, labels)["macro_auc"]

    def evaluated(rows_kept: int) -> float:
        monkeypatch.setattr(tasks, "EXACT_AUC_ROWS", rows_kept)
        first, second = MulticlassStats(), MulticlassStats()
        for i in range(60):
            (first if i < 25 else second).add(int(labels[i]), probabilities[i])
        return first.merge(second).metrics()["macro_auc"]

    assert evaluated(60) == pytest.approx(exact, rel=1e-12)
    histogram = evaluated(59)
    assert abs(histogram - exact) > 5e-3, "past EXACT_AUC_ROWS the histograms decide, and here they are coarse"
    assert evaluated(24) == histogram, "one accumulator past the limit drops the rows of the merge too"


def test_the_evaluators_merged_regression_sums_give_the_same_figures(regression_set):
    values, labels = regression_set
    first, second = RegressionStats(), RegressionStats()
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        (first if i % 3 else second).add(float(label), float(value))
    figures = first.merge(second).metrics()
    direct = task_metrics("regression", values, labels)
    for name in ("rmse", "mae", "r2"):
        assert figures[name] == pytest.approx(direct[name], rel=1e-9), name
    assert np.isnan(RegressionStats().metrics()["rmse"])


def test_max_output_difference_is_relative_only_for_a_regression_value():
    reference = np.array([0.5, 200.0])
    outputs = np.array([0.5001, 200.02])
    assert max_output_difference("regression", outputs, reference) == pytest.approx(1e-4)
    assert max_output_difference("binary", outputs, reference) == pytest.approx(0.02)


def test_a_regression_value_under_one_compares_absolutely():
    # |value| < 1 divides by 1, not by the value: 0.5 -> 0.6 differs by 0.1 whatever the denominator floor would hide.
    assert max_output_difference("regression", np.array([0.6]), np.array([0.5])) == pytest.approx(0.1)


def test_outputs_are_compared_row_by_row_in_the_reference_shape():
    # A TFLite or ONNX answer of shape [rows, 1] against a SavedModel's [rows]: no broadcasting into every pair.
    reference = np.array([0.1, 0.9, 0.5])
    assert max_output_difference("binary", reference.reshape(3, 1), reference) == 0.0
    assert max_output_difference("multiclass", np.array([[0.2, 0.8], [0.6, 0.4]]),
                                 np.array([[0.2, 0.8], [0.5, 0.5]])) == pytest.approx(0.1)


def test_no_rows_differ_by_nothing():
    assert max_output_difference("binary", np.zeros(0), np.zeros(0)) == 0.0


def test_regression_figures_of_constant_labels_and_of_weighted_rows():
    # Every label the same: R² is undefined (NaN), RMSE and MAE are not.
    constant = task_metrics("regression", np.array([1.0, 3.0]), np.array([2.0, 2.0]))
    assert constant["rmse"] == 1.0 and constant["mae"] == 1.0 and np.isnan(constant["r2"])
    stats = RegressionStats()
    stats.add(2.0, 1.0)
    stats.add(2.0, 3.0)
    assert np.isnan(stats.metrics()["r2"]) and stats.metrics()["rmse"] == 1.0
    # A row of weight 2 counts as that row twice.
    weighted, repeated = RegressionStats(), RegressionStats()
    for label, value, weight in [(1.0, 2.0, 2.0), (5.0, 4.0, 1.0), (9.0, 6.0, 1.0)]:
        weighted.add(label, value, weight)
        for _ in range(int(weight)):
            repeated.add(label, value)
    assert weighted.metrics() == pytest.approx(repeated.metrics())
    assert all(np.isnan(v) for v in RegressionStats().metrics().values())
    empty = MulticlassStats().metrics()
    assert np.isnan(empty["accuracy"]) and empty["precision"] == [] and empty["recall"] == []


def test_no_skill_figures_are_what_ignoring_the_features_scores():
    binary = no_skill_figures("binary", np.array([1, 0, 0, 0]))
    assert binary["auc"] == 0.5 and binary["accuracy"] == 0.75
    assert binary["log_loss"] == pytest.approx(log_loss([1, 0, 0, 0], [0.25] * 4))
    labels = np.array([0] * 49 + [1] * 30 + [2] * 21)
    multiclass = no_skill_figures("multiclass", labels, classes=3)
    assert multiclass["accuracy"] == pytest.approx(0.49)
    assert multiclass["log_loss"] == pytest.approx(log_loss(labels, np.tile([0.49, 0.30, 0.21], (100, 1))))
    values = np.array([1.0, 2.0, 3.0, 6.0])
    regression = no_skill_figures("regression", values)
    assert regression["rmse"] == pytest.approx(np.sqrt(np.mean((values - 3.0) ** 2))) and regression["r2"] == 0.0
    assert regression["mae"] == pytest.approx(1.5)
    assert no_skill_figures("binary", np.array([])) == {}
