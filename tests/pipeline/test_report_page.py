"""The run report and the index of runs, drawn from fabricated summaries of each task kind and loaded in headless
chromium: every section and chart present, no console message, user data escaped, the calibration step's threshold
used for the confusion matrix; a planted script error and a missing section are caught."""
import json
import re
import shlex
from pathlib import Path

import pytest

from reports.run_page import SECTIONS, confusion_at, grpc_example, index_page, rest_example, roc_and_pr, run_page
from tests.browser import render

# The charts each kind's page must draw (the export's is a PNG image with data-chart="export").
CHARTS = {
    "binary": {"timeline", "rows", "distribution", "loss", "training_metric", "slices", "roc", "precision_recall",
               "calibration_plot", "confusion_matrix", "sparsity", "export"},
    "multiclass": {"timeline", "rows", "distribution", "loss", "training_metric", "slices", "confusion_matrix",
                   "precision_per_class", "recall_per_class", "sparsity", "export"},
    "regression": {"timeline", "rows", "distribution", "loss", "training_metric", "slices", "predicted_actual",
                   "residuals", "sparsity", "export"},
}
NOT_FOR = {"multiclass": {"roc", "precision_recall", "calibration_plot"},
           "regression": {"roc", "precision_recall", "calibration_plot", "confusion_matrix"}}
HOSTILE = "<script>alert(1)</script>"
CALIBRATION = {"method": "platt", "fitted_on": "the eval split's first half", "rows": 812, "objective": "f1",
               "threshold": 0.3, "scale": 0.8, "shift": -0.4, "measured_on": "the eval split", "measured_rows": 790,
               "before": {"calibration": 1.24, "ece": 0.05, "auc": 0.91, "precision": 0.70, "recall": 0.997},
               "after": {"calibration": 1.01, "ece": 0.01, "auc": 0.91, "precision": 0.81, "recall": 0.93},
               "positive_rate": {"fitted": 0.222, "measured": 0.241}, "applied": True,
               "reliability": {"before": [], "after": []}}


def report_problems(rendered, kind: str) -> list[str]:
    """What a rendered report lacks or does wrong; empty when it is whole."""
    problems = [f"console: {line}" for line in rendered.console]
    problems += [f"section {s} missing" for s in SECTIONS if rendered.ids.get(s) != "section"]
    problems += [f"chart {c} missing" for c in sorted(CHARTS[kind] - set(rendered.charts))]
    problems += [f"chart {c} drawn for a {kind} task" for c in sorted(NOT_FOR.get(kind, set()) & set(rendered.charts))]
    return problems


def thresholds() -> list[dict[str, float]]:
    """A plot's confusion matrices: 100 positives, 300 negatives; higher thresholds keep fewer of each."""
    found = []
    for i in range(0, 101, 5):
        t = i / 100
        tp, fp = round(100 * (1 - t**2)), round(300 * (1 - t) ** 2)
        found.append({"threshold": t, "tp": tp, "fp": fp, "fn": 100 - tp, "tn": 300 - fp})
    return found


def summary(kind: str) -> dict:
    metric = {"binary": "auc", "multiclass": "macro_auc", "regression": "rmse"}[kind]
    task = {"kind": kind, "metric": metric}
    plots: dict = {}
    metrics = {metric: 0.87, "example_count": 400.0}
    if kind == "binary":
        plots = {"thresholds": thresholds(),
                 "calibration": [{"low": i / 10, "high": (i + 1) / 10, "count": 40.0, "label": 4.0 * i,
                                  "prediction": 40 * (i + 0.5) / 10} for i in range(10)]}
        metrics.update(precision=0.7, recall=0.99, calibration=1.24)
    elif kind == "multiclass":
        task["classes"] = ["setosa", "versicolor", HOSTILE]
        plots = {"multiclass_confusion": [[a, p, 10.0 if a == p else 1.0] for a in range(3) for p in range(3)]}
        metrics.update({f"precision/classId:{i}": 0.9 for i in range(3)}, **{f"recall/classId:{i}": 0.8
                                                                             for i in range(3)})
    else:
        plots = {"predicted_actual": [[float(i), i + (-1) ** i * 3.0] for i in range(50)]}
    features = {"fare": {"kind": "numeric", "missing": 0.0, "mean": 11.0, "std": 9.0, "min": 0.0, "max": 80.0,
                         "histogram": [5.0, 30.0, 12.0, 4.0, 1.0]},
                HOSTILE: {"kind": "string", "missing": 0.12, "unique": 3,
                          "top": [["Cash", 900.0], [HOSTILE, 300.0], ["Card", 10.0]]}}
    return {
        "run_id": f"2026-11-30T10:00:00 {kind}", "task": task, "metrics": metrics,
        "slices": {"payment_type=Cash": {metric: 0.85, "example_count": 380.0},
                   f"payment_type={HOSTILE}": {metric: 0.0, "example_count": 20.0},
                   "payment_type=Unknown": {metric: 0.0, "example_count": 264.0, "mean_label": 0.0}},
        "blessed": True, "published_version": 3, "pushed_path": "/tmp/serving/taxi/3",
        "optimization": {"metric": metric, "stages": ["prune"],
                         "input": {"parameters": 3000, "nonzero_parameters": 3000, "gzip_bytes": 12000,
                                   metric: 0.88, "rows": 400},
                         "pruned": {"parameters": 3000, "nonzero_parameters": 1500, "gzip_bytes": 7000, metric: 0.87,
                                    "rows": 400, "degradation": 0.01, "pruned_from": "input",
                                    "kernel_sparsity": {"dense_0": 0.5, "dense_1": 0.5}}},
        "export": {"passed": True, "eval_rows": 400, "task": task, "reference": {metric: 0.87, "accuracy": 0.8},
                   "artifacts": [{"artifact": "saved_model", "path": ".", "size_bytes": 40000, "max_abs_diff": 0.0,
                                  "latency_ms_p50": 1.2, **{n: 0.87 for n in ("auc", "accuracy", "macro_auc",
                                                                               "log_loss", "rmse", "mae", "r2")},
                                  "check": {"passed": True, "figure": "max |diff|", "value": 0.0, "threshold": 1e-4,
                                            "config_key": "export.max_abs_diff"}}]},
        "data": {"rows": {"train": 1600, "eval": 400},
                 "features": {"train": features, "eval": features},
                 "anomalies": {"train": [], "eval": [{"feature": HOSTILE, "severity": "ERROR",
                                                      "description": f"unexpected value {HOSTILE}"}]},
                 "drift": {"previous_run": "r0", "split": "train", "same_statistics": False,
                           "features": [{"feature": "fare", "measure": "mean shift (std devs)", "value": 0.3,
                                         "missing_change": 0.01}]}},
        "training": {"epochs": {"loss": [0.6, 0.5, 0.45], "val_loss": [0.62, 0.55, 0.5],
                                metric: [0.7, 0.8, 0.85], f"val_{metric}": [0.69, 0.78, 0.84]},
                     "monitor": f"val_{metric}", "mode": "max", "settings": {"hidden_units": [64, 32]},
                     "tuner_best": {"units": 64, "depth": 2, "learning_rate": 0.002},
                     "tuner_trials": [{"trial_id": "0", "score": 0.8, "units": 64, "depth": 2,
                                       "learning_rate": 0.002}]},
        "plots": plots,
        "baseline": {"metrics": {metric: 0.86, "example_count": 400.0}, "validation_ok": True, "failures": []},
        "calibration": CALIBRATION if kind == "binary" else {},
        "serving": {"model_name": "taxi", "version": 3,
                    "row": {"fare": 12.5, "company": "Flash Cab", "trip_start_hour": 7}},
        "cached_stages": ["CsvExampleGen"], "stage_seconds": {"CsvExampleGen": 0.4, "Trainer": 20.0},
        "elapsed_seconds": 30.0,
    }


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pages")
    found = {}
    for kind in CHARTS:
        path = folder / f"{kind}.html"
        path.write_text(run_page(summary(kind)))
        found[kind] = (path, render(path))
    return found


@pytest.mark.parametrize("kind", sorted(CHARTS))
def test_every_section_and_chart_renders_without_a_console_message(pages, kind):
    _, rendered = pages[kind]
    assert report_problems(rendered, kind) == []
    assert rendered.charts["distribution"] >= 4, "a small chart per feature and split"


@pytest.mark.parametrize("kind", sorted(CHARTS))
def test_user_data_is_escaped(pages, kind):
    path, rendered = pages[kind]
    assert "<script" not in path.read_text().lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in rendered.dom


def test_slices_show_their_example_counts_and_few_rows_stand_out(pages):
    _, rendered = pages["binary"]
    slices = re.search(r"data-chart=\"slices\".*?</svg>", rendered.dom, re.S).group(0)
    assert "n=380<" in slices and "n=20 (few rows)" in slices and "n=400<" in slices
    assert "n=264 (one class: AUC undefined)" in slices


def test_calibration_section_and_confusion_matrix_use_the_chosen_threshold(pages):
    _, rendered = pages["binary"]
    section = re.search(r"<section id=\"calibration\">.*?</section>", rendered.dom, re.S).group(0)
    for text in ("platt", "the eval split's first half", "812", "f1", "0.3000", "1.2400", "1.0100", "0.9970",
                 "before: as trained, at 0.5", "after: calibrated, at 0.3",
                 "22.2% of the rows fitted on, 24.1% of the 790 rows measured on"):
        assert text in section, text
    evaluation = re.search(r"<section id=\"evaluation\">.*?</section>", rendered.dom, re.S).group(0)
    assert "at threshold 0.300" in evaluation
    assert "Rows per bucket, left to right: " + ", ".join(["40"] * 10) + "." in evaluation
    matrix = confusion_at(thresholds(), 0.3)
    assert f">{matrix['tp']:.0f}<" in evaluation and f">{matrix['fp']:.0f}<" in evaluation


def test_the_calibration_steps_own_count_at_its_threshold_is_the_confusion_matrix():
    counts = {"tp": 91, "fp": 17, "fn": 9, "tn": 283}
    page = run_page({**summary("binary"), "calibration": {**CALIBRATION, "confusion_at_threshold": counts}})
    evaluation = re.search(r"<section id=[\"']evaluation[\"']>.*?</section>", page, re.S).group(0)
    matrix = re.search(r"data-chart=[\"']confusion_matrix[\"'].*?</svg>", evaluation, re.S).group(0)
    assert all(f">{n}<" in matrix for n in counts.values())
    assert "at the decision threshold 0.3, chosen and counted by the calibration step" in evaluation


def test_without_calibration_the_threshold_is_one_half():
    page = run_page({**summary("binary"), "calibration": {}})
    assert "No calibration step ran" in page and "at threshold 0.500" in page


def test_roc_and_precision_recall_points():
    roc, pr = roc_and_pr(thresholds())
    assert roc[0] == (0.0, 0.0) and roc[-1] == (1.0, 1.0)
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(roc, roc[1:], strict=False))
    assert pr[-1] == (1.0, 0.25)


def test_a_planted_script_error_and_a_missing_section_are_caught(tmp_path):
    page = run_page(summary("binary"))
    broken = tmp_path / "broken.html"
    broken.write_text(page.replace("</body>", "<script>undefinedFunction()</script></body>"))
    assert any("undefinedFunction" in p for p in report_problems(render(broken), "binary"))
    missing = tmp_path / "missing.html"
    missing.write_text(re.sub(r"<section id='optimization'>.*?</section>", "", page, flags=re.S))
    problems = report_problems(render(missing), "binary")
    assert "section optimization missing" in problems and "chart sparsity missing" in problems


def test_call_examples_carry_the_row_for_this_model_and_version():
    row = {"fare": 12.5, "company": "O'Hare Cab", "trip_miles": float("nan")}
    rest = rest_example("taxi", 3, row)
    assert "/v1/models/taxi/versions/3:predict" in rest
    assert json.loads(shlex.split(rest.replace("\\\n", " "))[-1]) == {
        "instances": [{"fare": 12.5, "company": "O'Hare Cab", "trip_miles": None}]}
    code = grpc_example("taxi", 3, row)
    compiled = compile(code, "example", "exec")
    assert compiled and "version=3" in code and "'company': \"O'Hare Cab\"" in code


def test_index_lists_runs_with_their_figures_and_links(tmp_path):
    page = index_page([("run-b", summary("binary")), ("run-a", {**summary("regression"), "blessed": False})])
    path = tmp_path / "index.html"
    path.write_text(page)
    rendered = render(path)
    assert rendered.console == [] and rendered.ids.get("runs") == "section"
    assert "href=\"./run-b/summary.html\"" in rendered.dom and "auc 0.8700" in rendered.dom
    assert "rmse 0.8700" in rendered.dom and rendered.dom.index("run-b") < rendered.dom.index("run-a")


def test_write_index_reads_every_runs_summary(tmp_path):
    from reports.run_page import write_index

    for name in ("2026-01", "2026-02"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps({**summary("binary"), "run_id": name}))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "summary.json").write_text("{")
    page = Path(write_index(str(tmp_path))).read_text()
    assert page.index("2026-02") < page.index("2026-01") and "broken" not in page


@pytest.mark.parametrize("partial", [{"run_id": "data-only", "task": {"kind": "binary"}},
                                     {**summary("binary"), "blessed": False, "published_version": None,
                                      "export": {}, "serving": {}, "plots": {}, "training": {}, "data": {}}])
def test_a_run_that_stopped_early_still_gets_every_section_with_a_reason(partial):
    page = run_page(partial)
    for section in SECTIONS:
        assert f"<section id='{section}'>" in page
    assert "Nothing was published" in page and "Nothing was exported" in page
