"""The console summary's lines fit the run's state: the baseline comparison that took part in the blessing, no
rollout hint for the version that already serves, and no decision-threshold text for a model without one."""
import io

from pipeline.runner import _print_summary, baseline_line
from pipeline.summary import RunSummary
from reports.run_page import run_page


def summary(**fields) -> RunSummary:
    values = {"run_id": "r1", "metrics": {"rmse": 410.0}, "blessed": True, "task": {"kind": "regression",
                                                                                    "metric": "rmse"}}
    return RunSummary(**{**values, **fields})


def printed(run: RunSummary) -> str:
    out = io.StringIO()
    _print_summary(run, "summary.json", "summary.html", out)
    return out.getvalue()


def test_the_baseline_comparison_is_printed_with_both_figures_and_the_change():
    run = summary(baseline={"metrics": {"rmse": 420.5}})
    assert baseline_line(run) == "rmse 420.5000, this model 410.0000, change -10.5000"
    assert "  baseline      rmse 420.5000, this model 410.0000, change -10.5000\n" in printed(run)
    cached = summary(baseline={"metrics": {"rmse": 420.5}}, cached_stages=["Evaluator"])
    assert baseline_line(cached).endswith("(the cached Evaluator's comparison, from the run that evaluated this model)")
    assert baseline_line(summary()) == ("none to compare with (the first blessed model, or evaluation.baseline "
                                        "none): the bounds alone decided")
    assert baseline_line(summary(blessed=None)) == "", "nothing was judged: no comparison decided anything"
    assert baseline_line(summary(metrics={})) == ""


def test_no_rollout_hint_for_the_version_that_serves():
    serving = summary(published_version=1, pushed_path="/s/m/1", published_new=True, published_serving=True)
    text = printed(serving)
    assert "it is the version served: it serves without a rollout" in text
    assert "rollout start" not in text
    waiting = summary(published_version=2, pushed_path="/s/m/2", published_new=True)
    assert "`mlops rollout start --version 2` moves traffic to it" in printed(waiting)
    same = summary(published_version=1, pushed_path="/s/m/1", published_new=False, published_serving=True)
    assert "published     nothing new: version 1 at /s/m/1 already holds this model" in printed(same)
    assert "rollout" not in printed(same)


def test_the_run_page_gives_the_same_hint_as_the_console():
    serving = run_page(summary(published_version=1, pushed_path="/s/m/1", published_new=True,
                               published_serving=True).to_dict())
    assert "It is the version served: it serves without a rollout." in serving and "rollout start" not in serving
    stable = run_page(summary(published_version=3, pushed_path="/s/m/3", published_new=True,
                              published_labels=["stable"]).to_dict())
    assert "It is labelled stable: it serves without a rollout." in stable and "rollout start" not in stable
    waiting = run_page(summary(published_version=2, pushed_path="/s/m/2", published_new=True).to_dict())
    assert "<code>mlops rollout start --version 2</code> moves it to serving" in waiting
    assert "published as version 2" in waiting
    same = run_page(summary(published_version=1, pushed_path="/s/m/1", published_new=False,
                            published_serving=True).to_dict())
    assert "Nothing new was published: version 1 already holds this model" in same
    assert "rollout start" not in same and "published as version" not in same


def test_a_regression_report_has_no_decision_threshold_text():
    page = run_page(summary().to_dict())
    calibration = page.split("<section id='calibration'>")[1].split("</section>")[0]
    assert "threshold" not in page.lower()
    assert "A regression model serves a value" in calibration
    binary = run_page(summary(task={"kind": "binary", "metric": "auc"}, metrics={"auc": 0.8}).to_dict())
    calibration = binary.split("<section id='calibration'>")[1].split("</section>")[0]
    assert "<h2>Calibration and threshold</h2>" in calibration and "decision threshold is 0.5" in calibration
