"""The task kinds and, for each, the one table of the metrics it is judged on: each metric's name, the heading a
report prints, whether a higher figure is better, and how TFMA computes it. Every other view (the config's check of
evaluation.metric, the Evaluator's metrics, the export report's columns) is read from this table."""
from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

TaskKind = Literal["binary", "multiclass", "regression"]
TASK_KINDS: tuple[str, ...] = typing.get_args(TaskKind)
# The module of this project's own TFMA metrics (the Evaluator imports it by name).
EVALUATOR_METRICS = "components.evaluator_metrics"


@dataclass(frozen=True)
class Metric:
    """One figure a model of a task kind is judged on, and how TFMA computes it (class, module, key of the figure;
    an empty module is TFMA's own)."""

    name: str
    heading: str
    higher_is_better: bool
    tfma_class: str
    tfma_module: str = ""
    tfma_key: str = ""

    @property
    def key(self) -> str:
        """The name TFMA reports the figure under."""
        return self.tfma_key or self.name


# Per kind; the first is the kind's default (evaluation.metric: auto).
METRICS: dict[str, tuple[Metric, ...]] = {
    "binary": (Metric("auc", "AUC", True, "AUC"),
               Metric("accuracy", "accuracy", True, "BinaryAccuracy", tfma_key="binary_accuracy"),
               Metric("log_loss", "log loss", False, "BinaryMetric", EVALUATOR_METRICS)),
    "multiclass": (Metric("macro_auc", "macro AUC", True, "MulticlassMetric", EVALUATOR_METRICS),
                   Metric("accuracy", "accuracy", True, "MulticlassMetric", EVALUATOR_METRICS),
                   Metric("log_loss", "log loss", False, "MulticlassMetric", EVALUATOR_METRICS)),
    "regression": (Metric("rmse", "RMSE", False, "RegressionMetric", EVALUATOR_METRICS),
                   Metric("mae", "MAE", False, "RegressionMetric", EVALUATOR_METRICS),
                   Metric("r2", "R²", True, "RegressionMetric", EVALUATOR_METRICS)),
}
# Whether a higher figure is better, per kind and metric name: a view of METRICS.
TASK_METRICS: dict[str, dict[str, bool]] = {
    kind: {metric.name: metric.higher_is_better for metric in metrics} for kind, metrics in METRICS.items()}
# The SavedModel's output each kind answers with: one probability per row (binary), a probability per class
# (multiclass, beside the predicted class name and the class names), or the predicted number (regression).
OUTPUT_NAMES: dict[str, str] = {"binary": "probabilities", "multiclass": "probabilities", "regression": "value"}


def metric_names(kind: str) -> list[str]:
    """The metrics a model of `kind` is judged on, its default first."""
    return [metric.name for metric in METRICS[kind]]


def heading(name: str) -> str:
    """The column heading of the metric `name` in a report; the name itself for a figure of no task's table."""
    return next((metric.heading for metrics in METRICS.values() for metric in metrics if metric.name == name), name)


def task_metric(kind: str, metric: str = "auto") -> str:
    """The metric that judges a model of this task kind: `metric`, or the kind's default when it is "auto"."""
    return METRICS[kind][0].name if metric == "auto" else metric


def higher_is_better(kind: str, metric: str = "auto") -> bool:
    return TASK_METRICS[kind][task_metric(kind, metric)]


def no_skill_bound(kind: str, metric: str, figure: float, margin: float) -> float:
    """The bound a model must meet on `metric` to beat the no-skill `figure`: `margin` of the way from it to a
    perfect score (1 for AUC, accuracy and R², 0 for an error or a log loss)."""
    perfect = 1.0 if higher_is_better(kind, metric) else 0.0
    return figure + margin * (perfect - figure)
