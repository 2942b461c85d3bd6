"""The Evaluator's own failure: when TFMA does not bless a model, the message names every config key, with its
value, that sets the comparison that failed (the bounds on evaluation.metric, evaluation.no_skill,
evaluation.max_degradation with the baseline and the other tolerances of the same metric). Each case runs TFMA's own
validator just inside (blessed, nothing to say) and just outside the threshold, for a binary, a multiclass and a
regression model."""
import io
import math

import pytest
from tensorflow_model_analysis.evaluators import metrics_validator
from tensorflow_model_analysis.metrics import metric_specs
from tensorflow_model_analysis.utils import config_util

from pipeline.pipeline import eval_config, not_blessed_message
from pipeline.summary import RunSummary, validation_failures
from settings.config import DEFAULT_CONFIG, load_config

STEP = 1e-4
LABEL_STD = 77.0


def example_config(name: str, *overrides: str):
    return load_config(str(DEFAULT_CONFIG.parent / f"{name}.yaml"), list(overrides))


def message(config, figures: dict[str, float], changes: dict[str, float] | None = None) -> str:
    """The not-blessed message for a candidate with these overall figures (TFMA's names) and, with a baseline, these
    changes (candidate - baseline), through TFMA's validator and the summary's reading of its result."""
    with_baseline = changes is not None
    evaluation_config = config_util.update_eval_config_with_defaults(eval_config(config), has_baseline=with_baseline)
    thresholds = metric_specs.metric_thresholds_from_metrics_specs(evaluation_config.metrics_specs,
                                                                   eval_config=evaluation_config)
    values = {key: (changes[key.name] if key.is_diff else figures[key.name]) for key in thresholds
              if key.model_name == ("candidate" if with_baseline else "")}
    validation = metrics_validator.validate_metrics(((), values), evaluation_config)
    failures = validation_failures(validation)
    assert bool(failures) != validation.validation_ok
    baseline = {name: figures[name] - (changes or {}).get(name, 0.0) for name in figures} if with_baseline else {}
    return not_blessed_message(failures, config, figures, baseline, LABEL_STD)


def tolerances(metric: str) -> str:
    return (f"optimize.max_degradation and export.max_quantized_degradation limit the same eval {metric} in the same "
            "units, so raise them alike")


def comparison(metric: str, figure: float, change: float, config_value: str, extra: str = "") -> str:
    side = "below" if change < 0 else "above"
    return (f"the eval {metric} {figure:.4f} is {abs(change):.4f} {side} the baseline model's {figure - change:.4f}, "
            f"more than evaluation.max_degradation={config_value} allows (the baseline model chosen by "
            f"evaluation.baseline=previous_blessed, the metric by evaluation.metric=auto, which judges {metric}; "
            f"{tolerances(metric)}{extra}); allow more with evaluation.max_degradation, compare with "
            "another evaluation.baseline (none: the bounds alone) or improve the model")


def test_binary_auc_below_its_lower_bound_names_both_bounds_and_the_metric():
    config = example_config("taxi")  # lower_bound 0.6
    assert message(config, {"auc": 0.6 + STEP}, {"auc": 0.0}) == ""
    assert message(config, {"auc": 0.6 - STEP}, {"auc": 0.0}) == (
        "the eval auc 0.5999 is below its lower bound 0.6 (set by evaluation.lower_bound=0.6 and "
        "evaluation.upper_bound=null on evaluation.metric=auto, which judges auc); improve the model or move the "
        "bound with those keys")


def test_binary_auc_worse_than_the_baseline_names_every_tolerance_of_the_same_auc():
    config = example_config("taxi")  # evaluation.max_degradation 0.01
    assert message(config, {"auc": 0.8}, {"auc": -(0.01 - STEP)}) == ""
    assert message(config, {"auc": 0.8}, {"auc": -(0.01 + STEP)}) == (
        "the eval auc 0.8000 is 0.0101 below the baseline model's 0.8101, more than evaluation.max_degradation=0.01 "
        "allows (the baseline model chosen by evaluation.baseline=previous_blessed, the metric by "
        "evaluation.metric=auto, which judges auc; optimize.max_degradation and export.max_quantized_degradation "
        "limit the same eval auc in the same units, so raise them alike); allow more with evaluation.max_degradation, "
        "compare with another evaluation.baseline (none: the bounds alone) or improve the model")


def test_binary_accuracy_below_its_no_skill_bound_names_both_keys():
    config = example_config("taxi", "evaluation.no_skill.accuracy=0.6", "evaluation.no_skill_margin=0.25",
                            "evaluation.baseline=none")
    assert message(config, {"auc": 0.9, "binary_accuracy": 0.7 + STEP}) == ""
    assert message(config, {"auc": 0.9, "binary_accuracy": 0.7 - STEP}) == (
        "the eval accuracy 0.6999 is below its lower bound 0.7 (set by evaluation.no_skill.accuracy=0.6 and "
        "evaluation.no_skill_margin=0.25); improve the model or move the bound with those keys")


@pytest.mark.parametrize("name, figure, others", [
    # Three positives in ten rows: the base rate's log loss is 0.6109.
    pytest.param("taxi", 0.6109, {"auc": 0.9}, id="binary-base-rate"),
    # Three classes in equal shares: ln 3.
    pytest.param("iris", 1.0986, {"macro_auc": 0.95}, id="multiclass-class-shares"),
])
def test_a_log_loss_no_better_than_the_no_skill_one_names_both_keys(name, figure, others):
    config = example_config(name, f"evaluation.no_skill.log_loss={figure}", "evaluation.baseline=none")
    bound = 0.9 * figure  # a tenth of the way to 0
    assert message(config, {**others, "log_loss": bound - STEP}) == ""
    assert message(config, {**others, "log_loss": bound + STEP}) == (
        f"the eval log_loss {bound + STEP:.4f} is above its upper bound {bound:g} (set by "
        f"evaluation.no_skill.log_loss={figure} and evaluation.no_skill_margin=0.1); improve the model or move the "
        "bound with those keys")


def test_multiclass_macro_auc_bound_and_comparison():
    config = example_config("iris")  # lower_bound 0.9, max_degradation 0.02
    assert message(config, {"macro_auc": 0.9 + STEP}, {"macro_auc": -(0.02 - STEP)}) == ""
    assert message(config, {"macro_auc": 0.9 - STEP}, {"macro_auc": 0.0}) == (
        "the eval macro_auc 0.8999 is below its lower bound 0.9 (set by evaluation.lower_bound=0.9 and "
        "evaluation.upper_bound=null on evaluation.metric=auto, which judges macro_auc); improve the model or move "
        "the bound with those keys")
    assert message(config, {"macro_auc": 0.95}, {"macro_auc": -(0.02 + STEP)}) == comparison(
        "macro_auc", 0.95, -(0.02 + STEP), "0.02")


def test_multiclass_no_better_than_the_majority_class_names_the_no_skill_keys():
    # The five classes: macro AUC 0.85 but accuracy 0.52 where always answering the most common class scores
    # 0.49; `mlops init` writes no_skill.accuracy 0.49, and the margin 0.1 makes the bound 0.541.
    config = example_config("iris", "evaluation.baseline=none", "evaluation.lower_bound=0.6",
                            "evaluation.no_skill.accuracy=0.49")
    assert message(config, {"macro_auc": 0.85, "accuracy": 0.541 + STEP}) == ""
    assert message(config, {"macro_auc": 0.85, "accuracy": 0.52}) == (
        "the eval accuracy 0.5200 is below its lower bound 0.541 (set by evaluation.no_skill.accuracy=0.49 and "
        "evaluation.no_skill_margin=0.1); improve the model or move the bound with those keys")
    assert message(config, {"macro_auc": 0.85, "accuracy": 0.541 - STEP}) != ""


def test_multiclass_accuracy_judged_with_a_no_skill_figure_names_every_bound_of_that_accuracy():
    # One TFMA threshold, the higher of the two lower bounds: all four keys set it.
    config = example_config("iris", "evaluation.baseline=none", "evaluation.metric=accuracy",
                            "evaluation.lower_bound=0.5", "evaluation.no_skill.accuracy=0.49")
    assert message(config, {"accuracy": 0.541 + STEP}) == ""
    assert message(config, {"accuracy": 0.541 - STEP}) == (
        "the eval accuracy 0.5409 is below its lower bound 0.541 (set by evaluation.lower_bound=0.5, "
        "evaluation.upper_bound=null, evaluation.no_skill.accuracy=0.49 and evaluation.no_skill_margin=0.1 on "
        "evaluation.metric=accuracy); improve the model or move the bound with those keys")


def test_multiclass_log_loss_above_its_upper_bound():
    config = example_config("iris", "evaluation.metric=log_loss", "evaluation.lower_bound=null",
                            "evaluation.upper_bound=0.4", "evaluation.baseline=none")
    assert message(config, {"log_loss": 0.4 - STEP}) == ""
    assert message(config, {"log_loss": 0.4 + STEP}) == (
        "the eval log_loss 0.4001 is above its upper bound 0.4 (set by evaluation.lower_bound=null and "
        "evaluation.upper_bound=0.4 on evaluation.metric=log_loss); improve the model or move the bound with those "
        "keys")


def test_regression_rmse_above_its_upper_bound():
    config = example_config("diabetes")  # upper_bound 70
    assert message(config, {"rmse": 70 - STEP}, {"rmse": 0.0}) == ""
    assert message(config, {"rmse": 70 + STEP}, {"rmse": 0.0}) == (
        "the eval rmse 70.0001 is above its upper bound 70 (set by evaluation.lower_bound=null and "
        "evaluation.upper_bound=70 on evaluation.metric=auto, which judges rmse); improve the model or move the "
        "bound with those keys")


def test_regression_rmse_worse_than_the_baseline_names_the_tolerances_and_the_label_s_spread():
    config = example_config("diabetes")  # max_degradation 2.0 for all three tolerances
    assert message(config, {"rmse": 60.0}, {"rmse": 2.0 - STEP}) == ""
    spread = ("; a regression's rmse is in the label's units (its standard deviation is 77), and 2.5% of that spread "
              "is a usual tolerance")
    assert message(config, {"rmse": 60.0}, {"rmse": 2.0 + STEP}) == comparison("rmse", 60.0, 2.0 + STEP, "2", spread)


def test_regression_r2_below_its_lower_bound():
    config = example_config("diabetes", "evaluation.metric=r2", "evaluation.upper_bound=null",
                            "evaluation.lower_bound=0.3", "evaluation.baseline=none")
    assert message(config, {"r2": 0.3 + STEP}) == ""
    assert message(config, {"r2": 0.3 - STEP}) == (
        "the eval r2 0.2999 is below its lower bound 0.3 (set by evaluation.lower_bound=0.3 and "
        "evaluation.upper_bound=null on evaluation.metric=r2); improve the model or move the bound with those keys")


def test_two_failed_thresholds_are_both_named():
    config = example_config("iris", "evaluation.no_skill.accuracy=0.49")
    said = message(config, {"macro_auc": 0.9 - STEP, "accuracy": 0.541 - STEP}, {"macro_auc": -(0.02 + STEP)})
    assert "the eval macro_auc 0.8999 is below its lower bound 0.9" in said
    assert "evaluation.max_degradation=0.02 allows" in said
    assert ("the eval accuracy 0.5409 is below its lower bound 0.541 (set by evaluation.no_skill.accuracy=0.49 and "
            "evaluation.no_skill_margin=0.1)") in said


def test_a_nan_metric_names_no_bound_but_its_likely_cause():
    config = example_config("diabetes")
    said = message(config, {"rmse": math.nan}, {"rmse": math.nan})
    assert said == ("the eval rmse is nan, which no bound passes: the model or the eval rows hold a value that is not "
                    "a number (a missing label, a NaN training loss); check the label column and the Trainer's log")


def test_the_console_summary_and_the_report_say_why_the_model_was_not_blessed():
    from pipeline.runner import _print_summary, blessing_failure
    from reports.run_page import _baseline

    config = example_config("diabetes")
    summary = RunSummary(run_id="r", blessed=False, metrics={"rmse": 60.0},
                         baseline={"metrics": {"rmse": 57.0}, "validation_ok": False, "failures": ["rmse"],
                                   "failed_thresholds": [{"metric": "rmse", "is_diff": True, "value": 3.0,
                                                          "message": ""}]},
                         data={"features": {"train": {config.label.name: {"kind": "numeric", "std": 77.0}}}})
    summary.blessing_failure = blessing_failure(summary, config)
    assert summary.blessing_failure == comparison(
        "rmse", 60.0, 3.0, "2", "; a regression's rmse is in the label's units (its standard deviation is 77), and "
                                "2.5% of that spread is a usual tolerance")
    out = io.StringIO()
    _print_summary(summary, "s.json", "s.html", out)
    assert f"  blessed       False: {summary.blessing_failure}\n" in out.getvalue()
    assert "  published     nothing (not blessed)" in out.getvalue()
    page = _baseline(summary.__dict__, "rmse")
    assert "Not blessed: the eval rmse 60.0000 is 3.0000 above the baseline model&#x27;s 57.0000" in page


@pytest.mark.parametrize("blessed", [True, None])
def test_a_blessed_or_unjudged_model_has_nothing_to_explain(blessed):
    from pipeline.runner import _print_summary

    out = io.StringIO()
    _print_summary(RunSummary(run_id="r", blessed=blessed), "s.json", "s.html", out)
    assert "  blessed       False" not in out.getvalue()


def test_regression_rmse_no_better_than_the_mean_names_every_key_of_that_rmse():
    # upper_bound 70 and the mean's RMSE 77 with a margin of 0.1 (69.3): the stricter holds, all four keys set it.
    config = example_config("diabetes", "evaluation.no_skill.rmse=77")
    assert message(config, {"rmse": 69.3 - STEP}, {"rmse": 0.0}) == ""
    assert message(config, {"rmse": 69.3 + STEP}, {"rmse": 0.0}) == (
        "the eval rmse 69.3001 is above its upper bound 69.3 (set by evaluation.lower_bound=null, "
        "evaluation.upper_bound=70, evaluation.no_skill.rmse=77 and evaluation.no_skill_margin=0.1 on "
        "evaluation.metric=auto, which judges rmse); improve the model or move the bound with those keys")


def test_the_report_shows_the_no_skill_figures_beside_the_models_with_and_without_a_baseline():
    from reports.run_page import _baseline

    summary = {"blessed": False, "metrics": {"auc": 0.81, "binary_accuracy": 0.75, "log_loss": 0.52},
               "task": {"kind": "binary"},
               "export": {"passed": True, "no_skill": {"auc": 0.5, "accuracy": 0.62, "log_loss": 0.6641}}}
    page = _baseline(summary, "auc")
    assert "<th>no skill</th>" in page and "<th>baseline</th>" not in page
    assert "<td>binary_accuracy</td><td>0.7500</td><td>0.6200</td>" in page
    assert "<td>log_loss</td><td>0.5200</td><td>0.6641</td>" in page and "No baseline model" in page
    summary["baseline"] = {"metrics": {"auc": 0.8, "binary_accuracy": 0.74, "log_loss": 0.53}}
    page = _baseline(summary, "auc")
    assert "<td>auc</td><td>0.8100</td><td>0.5000</td><td>0.8000</td><td>+0.0100</td>" in page
