"""The task kinds (binary, multiclass, regression) as plain code: what the model outputs, the metrics every stage
judges it by, and how much worse a metric may get.

One definition serves the Optimizer (transformed eval batches), the Exporter (each format's outputs) and the
Evaluator (TFMA, through the accumulators below), so that "AUC" or "RMSE" means the same number in each report.
NumPy and scikit-learn only; TensorFlow is imported where the Transform output is read.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sklearn.metrics import roc_auc_score

from settings.tasks import OUTPUT_NAMES, TASK_METRICS, TaskKind, task_metric

# Probabilities are clipped this far from 0 and 1 for log loss, as Keras does.
PROB_EPSILON = 1e-7
# Score buckets of the streaming AUC the Evaluator computes (MulticlassStats): resolution 1/AUC_BUCKETS.
AUC_BUCKETS = 2000
# Rows up to which MulticlassStats keeps each prediction, so that its AUC is the exact one the Exporter computes:
# a confident model's probabilities crowd into the end buckets, where the histogram counts them as ties.
EXACT_AUC_ROWS = 100_000


@dataclass(frozen=True)
class Task:
    """What a run's model predicts, as the Trainer, the Optimizer and the Exporter need to know it.

    classes: the class names of a multiclass label, in the order of the model's probabilities (label id i is
    classes[i]). label_mean, label_std: the regression label's mean and standard deviation on the training split;
    the model predicts z-scores and rescales them, so its output is in the label's units.
    """

    kind: TaskKind = "binary"
    classes: tuple[str, ...] = ()
    label_mean: float = 0.0
    label_std: float = 1.0

    @property
    def output_name(self) -> str:
        return OUTPUT_NAMES[self.kind]

    @property
    def units(self) -> int:
        """Width of the model's last layer."""
        return len(self.classes) if self.kind == "multiclass" else 1

    def describe(self) -> dict[str, Any]:
        """The task as JSON, recorded with the model (export report, preprocessing.json)."""
        described: dict[str, Any] = {"kind": self.kind, "output": self.output_name}
        if self.kind == "multiclass":
            described["classes"] = list(self.classes)
        return described


def task_from_transform(label: Any, tft_output: Any) -> Task:
    """The Task of a run from its label section and the Transform output (classes of a multiclass label, the
    regression label's mean and standard deviation), as the Transform recorded them."""
    from components.label_rule import CLASSES_VOCABULARY
    from components.transform import LABEL_CONSTANTS, read_constants

    if label.kind == "multiclass":
        classes = tuple(v.decode("utf-8") for v in tft_output.vocabulary_by_name(CLASSES_VOCABULARY))
        if len(classes) < 2:
            raise ValueError(f"the label column '{label.column}' holds {len(classes)} class(es) in the training "
                             "split; a multiclass label needs at least 2 (use label.kind=regression for a number).")
        return Task("multiclass", classes=classes)
    if label.kind == "regression":
        mean, std = read_constants(tft_output)[LABEL_CONSTANTS]
        return Task("regression", label_mean=float(mean), label_std=float(std) if std > 0 else 1.0)
    return Task("binary")


def _binary(outputs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    p = outputs.reshape(-1).astype(np.float64)
    y = labels.reshape(-1)
    auc = float(roc_auc_score(y, p)) if np.unique(y).size > 1 else float("nan")
    chosen = np.clip(np.where(y == 1, p, 1.0 - p), PROB_EPSILON, 1.0)
    # A probability of exactly 0.5 is a negative prediction, as for Keras' and TFMA's binary accuracy.
    return {"auc": auc, "accuracy": float(np.mean((p > 0.5) == (y == 1))), "log_loss": float(np.mean(-np.log(chosen)))}


def macro_auc(probabilities: np.ndarray, labels: np.ndarray) -> float:
    """One-vs-rest AUC of each class that has both positive and negative rows, averaged; NaN when none has."""
    aucs = []
    for class_id in range(probabilities.shape[1]):
        positive = labels == class_id
        if positive.any() and not positive.all():
            aucs.append(roc_auc_score(positive, probabilities[:, class_id]))
    return float(np.mean(aucs)) if aucs else float("nan")


def _multiclass(outputs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    p = outputs.reshape(len(labels), -1).astype(np.float64)
    y = labels.reshape(-1).astype(np.int64)
    chosen = np.clip(p[np.arange(len(y)), y], PROB_EPSILON, 1.0)
    return {"macro_auc": macro_auc(p, y), "accuracy": float(np.mean(np.argmax(p, axis=1) == y)),
            "log_loss": float(np.mean(-np.log(chosen)))}


def _regression(outputs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    predicted = outputs.reshape(-1).astype(np.float64)
    y = labels.reshape(-1).astype(np.float64)
    errors = predicted - y
    total = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum(errors**2)) / total if total > 0 else float("nan")
    return {"rmse": float(np.sqrt(np.mean(errors**2))), "mae": float(np.mean(np.abs(errors))), "r2": r2}


def task_metrics(kind: str, outputs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Every metric of the kind (TASK_METRICS) for a model's `outputs` on rows with `labels`: probabilities
    [rows] and 0/1 labels, probabilities [rows, classes] and class ids, or values [rows] and numbers."""
    if len(labels) == 0:
        raise ValueError("there are no rows to compute metrics on.")
    return {"binary": _binary, "multiclass": _multiclass, "regression": _regression}[kind](np.asarray(outputs),
                                                                                            np.asarray(labels))


def no_skill_figures(kind: str, labels: np.ndarray, classes: int = 0) -> dict[str, float]:
    """What a predictor that ignores the features scores on rows with these `labels`: for binary the base rate
    (AUC 0.5, the majority's accuracy, the base rate's log loss), for multiclass the class shares (the majority
    class's accuracy, the shares' log loss), for a regression the rows' mean (its RMSE and MAE, R² 0)."""
    y = np.asarray(labels).reshape(-1)
    if y.size == 0:
        return {}
    if kind == "regression":
        y = y.astype(np.float64)
        return {"rmse": float(np.std(y)), "mae": float(np.mean(np.abs(y - y.mean()))), "r2": 0.0}
    counts = np.bincount(y.astype(np.int64), minlength=max(classes, 2 if kind == "binary" else 1))
    shares = counts / counts.sum()
    log_loss = float(-np.sum(shares * np.log(np.clip(shares, PROB_EPSILON, 1.0))))
    if kind == "binary":
        return {"auc": 0.5, "accuracy": float(shares.max()), "log_loss": log_loss}
    return {"macro_auc": 0.5, "accuracy": float(shares.max()), "log_loss": log_loss}


def degradation(kind: str, metric: str, before: float, after: float) -> float:
    """How much worse `after` is than `before` on the metric, in its units: positive when worse, negative when
    better (a drop in AUC, a rise in RMSE)."""
    return before - after if TASK_METRICS[kind][task_metric(kind, metric)] else after - before


def degradation_gate(kind: str, metric: str, before: float, after: float, max_degradation: float
                     ) -> tuple[float, bool]:
    """A gate on one metric: its degradation from `before` to `after`, and whether that is at most
    `max_degradation` (an improvement always passes a limit of 0 or more). A NaN metric never passes."""
    worse = degradation(kind, metric, before, after)
    return worse, bool(worse <= max_degradation)


def max_output_difference(kind: str, outputs: np.ndarray, reference: np.ndarray) -> float:
    """The largest difference between two formats' outputs over every row and every output value. Probabilities
    compare absolutely; a regression value relative to its size (|difference| / max(1, |value|)), since float32
    carries about seven significant digits whatever the label's units."""
    outputs = np.asarray(outputs, dtype=np.float64).reshape(np.shape(reference))
    reference = np.asarray(reference, dtype=np.float64)
    difference = np.abs(outputs - reference)
    if kind == "regression":
        difference = difference / np.maximum(1.0, np.abs(reference))
    return float(np.max(difference)) if difference.size else 0.0


@dataclass
class BinaryStats:
    """Mergeable sums of a binary model's log loss, its probabilities clipped as the Trainer's and the gates' are
    (TFMA's BinaryCrossEntropy does not clip: one probability of exactly 0 or 1 on the wrong row makes it infinite)."""

    weight: float = 0.0
    log_loss_sum: float = 0.0

    def add(self, label: float, probability: float, weight: float = 1.0) -> None:
        chosen = probability if label == 1 else 1.0 - probability
        self.weight += weight
        self.log_loss_sum -= weight * float(np.log(np.clip(chosen, PROB_EPSILON, 1.0)))

    def merge(self, other: BinaryStats) -> BinaryStats:
        self.weight += other.weight
        self.log_loss_sum += other.log_loss_sum
        return self

    def metrics(self) -> dict[str, float]:
        return {"log_loss": self.log_loss_sum / self.weight if self.weight else float("nan")}


@dataclass
class MulticlassStats:
    """Mergeable sums from which the multiclass metrics follow: what the Evaluator's TFMA combiners accumulate.

    The class count grows with the widest prediction seen, so nothing needs to know the classes beforehand. AUC is
    exact (as task_metrics computes it) up to EXACT_AUC_ROWS rows; past them it comes from score histograms
    (AUC_BUCKETS per class), where two scores in one bucket count as a tie.
    """

    weight: float = 0.0
    log_loss_sum: float = 0.0
    # confusion[actual, predicted] (argmax), positives[c, b] / negatives[c, b]: weight of rows of class c (or not
    # of class c) whose probability for c falls in bucket b.
    confusion: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    positives: np.ndarray = field(default_factory=lambda: np.zeros((0, AUC_BUCKETS)))
    negatives: np.ndarray = field(default_factory=lambda: np.zeros((0, AUC_BUCKETS)))
    # (label, probabilities, weight) of every row while there are at most EXACT_AUC_ROWS; None past them.
    rows: list[tuple[int, np.ndarray, float]] | None = field(default_factory=list)

    def _grow(self, classes: int) -> None:
        have = self.confusion.shape[0]
        if classes <= have:
            return
        confusion = np.zeros((classes, classes))
        confusion[:have, :have] = self.confusion
        self.confusion = confusion
        self.positives = np.vstack([self.positives, np.zeros((classes - have, AUC_BUCKETS))])
        self.negatives = np.vstack([self.negatives, np.zeros((classes - have, AUC_BUCKETS))])

    def add(self, label: int, probabilities: np.ndarray, weight: float = 1.0) -> None:
        probabilities = np.asarray(probabilities, dtype=np.float64).reshape(-1)
        classes = probabilities.size
        if not 0 <= label < classes:
            raise ValueError(f"label id {label} is outside the model's {classes} classes; the eval split holds a "
                             "class the training split does not.")
        self._grow(classes)
        self.weight += weight
        self.log_loss_sum -= weight * np.log(np.clip(probabilities[label], PROB_EPSILON, 1.0))
        self.confusion[label, int(np.argmax(probabilities))] += weight
        buckets = np.minimum((np.clip(probabilities, 0.0, 1.0) * AUC_BUCKETS).astype(np.int64), AUC_BUCKETS - 1)
        is_label = np.arange(classes) == label
        self.positives[is_label, buckets[is_label]] += weight
        self.negatives[~is_label, buckets[~is_label]] += weight
        if self.rows is not None:
            self.rows.append((label, probabilities.copy(), weight))  # not a view of the caller's batch
            self._limit_rows()

    def _limit_rows(self) -> None:
        if self.rows is not None and len(self.rows) > EXACT_AUC_ROWS:
            self.rows = None

    def merge(self, other: MulticlassStats) -> MulticlassStats:
        self._grow(other.confusion.shape[0])
        n = other.confusion.shape[0]
        self.weight += other.weight
        self.log_loss_sum += other.log_loss_sum
        self.confusion[:n, :n] += other.confusion
        self.positives[:n] += other.positives
        self.negatives[:n] += other.negatives
        if self.rows is None or other.rows is None:
            self.rows = None
        else:
            self.rows.extend(other.rows)
            self._limit_rows()
        return self

    def class_aucs(self) -> list[float]:
        """One-vs-rest AUC per class, from the rows kept or else the histograms (NaN for a class without positives
        or negatives)."""
        if self.rows is not None:
            return [self._exact_auc(class_id) for class_id in range(self.confusion.shape[0])]
        aucs = []
        for pos, neg in zip(self.positives, self.negatives, strict=True):
            if pos.sum() == 0 or neg.sum() == 0:
                aucs.append(float("nan"))
                continue
            negatives_below = np.cumsum(neg) - neg
            wins = np.sum(pos * negatives_below) + 0.5 * np.sum(pos * neg)
            aucs.append(float(wins / (pos.sum() * neg.sum())))
        return aucs

    def _exact_auc(self, class_id: int) -> float:
        # A row predicted over fewer classes holds no score for this one, as in the histograms.
        scored = [(label == class_id, p[class_id], w) for label, p, w in self.rows if p.size > class_id]
        positive = np.array([row[0] for row in scored], dtype=bool)
        weights = np.array([row[2] for row in scored], dtype=np.float64)
        if not weights[positive].sum() or not weights[~positive].sum():
            return float("nan")
        scores = np.array([row[1] for row in scored], dtype=np.float64)
        return float(roc_auc_score(positive, scores, sample_weight=weights))

    def metrics(self) -> dict[str, Any]:
        """accuracy, log_loss, macro_auc, and per-class precision and recall (lists, NaN where undefined)."""
        if self.weight == 0:
            return {"accuracy": float("nan"), "log_loss": float("nan"), "macro_auc": float("nan"),
                    "precision": [], "recall": []}
        aucs = [a for a in self.class_aucs() if not np.isnan(a)]
        correct = np.diag(self.confusion)
        with np.errstate(invalid="ignore", divide="ignore"):
            precision = correct / self.confusion.sum(axis=0)
            recall = correct / self.confusion.sum(axis=1)
        return {"accuracy": float(correct.sum() / self.weight), "log_loss": float(self.log_loss_sum / self.weight),
                "macro_auc": float(np.mean(aucs)) if aucs else float("nan"),
                "precision": [float(v) for v in precision], "recall": [float(v) for v in recall]}


@dataclass
class RegressionStats:
    """Mergeable weighted sums from which RMSE, MAE and R² follow exactly."""

    weight: float = 0.0
    label_sum: float = 0.0
    label_squares: float = 0.0
    absolute_errors: float = 0.0
    squared_errors: float = 0.0

    def add(self, label: float, prediction: float, weight: float = 1.0) -> None:
        error = float(prediction) - float(label)
        self.weight += weight
        self.label_sum += weight * label
        self.label_squares += weight * label * label
        self.absolute_errors += weight * abs(error)
        self.squared_errors += weight * error * error

    def merge(self, other: RegressionStats) -> RegressionStats:
        for name in ("weight", "label_sum", "label_squares", "absolute_errors", "squared_errors"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self

    def metrics(self) -> dict[str, float]:
        if self.weight == 0:
            return {"rmse": float("nan"), "mae": float("nan"), "r2": float("nan")}
        total = self.label_squares - self.label_sum**2 / self.weight
        return {"rmse": float(np.sqrt(self.squared_errors / self.weight)), "mae": self.absolute_errors / self.weight,
                "r2": 1.0 - self.squared_errors / total if total > 0 else float("nan")}


def describe_figures(metrics: Mapping[str, float], kind: str) -> str:
    """The kind's metrics as 'auc 0.9312, accuracy 0.8710' for logs and messages."""
    return ", ".join(f"{name} {metrics[name]:.4f}" for name in TASK_METRICS[kind] if name in metrics)
