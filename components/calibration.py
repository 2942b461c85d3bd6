"""Calibrated probabilities and a chosen decision threshold, folded into the model's output layer.

Class weights shift a classifier's probabilities (a balanced loss on unbalanced data), so "0.8" stops meaning 80%.
The fix is fitted on rows the model never trained on and the Evaluator never measures (the calibration split):
- binary: Platt scaling, p = sigmoid(a * z + b) on the logit z; a > 0 keeps the ranking, so AUC is unchanged;
- multiclass: temperature scaling, p = softmax(z / T), which keeps every row's argmax;
- regression: nothing to calibrate.
Both are affine maps of the logits, so they fold into the last Dense layer's kernel and bias: every format the
Exporter converts (SavedModel, TFLite, ONNX, TF.js) serves calibrated values with no extra op to convert.

The decision threshold (binary) is then chosen on the calibrated probabilities of the same rows for
calibration.threshold_objective. NumPy functions, and the few below them that read and rewrite a Keras model.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import tensorflow as tf
from sklearn.metrics import roc_auc_score

from reports.records import CalibrationFigures, CalibrationRecord, Confusion, ReliabilityBins
from settings.config import CalibrationConfig

# Newton steps of the Platt fit and the bounds of log T searched by the temperature fit.
_NEWTON_STEPS = 100
_LOG_TEMPERATURE_BOUNDS = (-5.0, 5.0)
# Equal-mass bins of the expected calibration error: ten groups of rows, ordered by probability.
ECE_BINS = 10


class CalibrationError(ValueError):
    """The calibration rows cannot support the configured fit or threshold; the message says what to change."""


@dataclass(frozen=True)
class Calibration:
    """What folds into the output layer: logit' = scale * logit + shift (binary; Platt), or logits / temperature
    (multiclass, stored as scale = 1 / temperature and shift = 0)."""

    method: str
    scale: float = 1.0
    shift: float = 0.0


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(z, dtype=np.float64)))


def softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def fit_platt(logits: np.ndarray, labels: np.ndarray) -> Calibration:
    """Platt scaling: the (scale, shift) that minimise the log loss of sigmoid(scale * logit + shift) against the
    0/1 labels (Newton's method on the two-parameter logistic regression, float64)."""
    z = np.asarray(logits, dtype=np.float64).reshape(-1)
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    positives = int(y.sum())
    if positives == 0 or positives == y.size:
        raise CalibrationError(f"the calibration rows hold only one class ({positives} positives of {y.size}); "
                               "raise data.calibration_buckets or check the label settings.")
    x = np.stack([z, np.ones_like(z)], axis=1)
    w = np.array([1.0, 0.0])
    for _ in range(_NEWTON_STEPS):
        p = sigmoid(x @ w)
        gradient = x.T @ (p - y)
        hessian = (x * (p * (1.0 - p))[:, None]).T @ x + 1e-9 * np.eye(2)
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if np.max(np.abs(step)) < 1e-10:
            break
    if not np.all(np.isfinite(w)) or w[0] <= 0:
        raise CalibrationError(f"Platt scaling fitted a non-positive slope ({w[0]:.4g}) on the calibration rows, so "
                               "the model's scores do not rank them; check the model or set calibration.method=none.")
    return Calibration("platt", scale=float(w[0]), shift=float(w[1]))


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> Calibration:
    """Temperature scaling: the T that minimises the log loss of softmax(logits / T) against the class ids."""
    from scipy.optimize import minimize_scalar

    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64).reshape(-1)
    if np.unique(y).size < 2:
        raise CalibrationError("the calibration rows hold only one class; raise data.calibration_buckets.")

    def log_loss(log_t: float) -> float:
        scaled = z / np.exp(log_t)
        scaled = scaled - scaled.max(axis=1, keepdims=True)
        return float(np.mean(np.log(np.exp(scaled).sum(axis=1)) - scaled[np.arange(y.size), y]))

    best = minimize_scalar(log_loss, bounds=_LOG_TEMPERATURE_BOUNDS, method="bounded", options={"xatol": 1e-8})
    return Calibration("temperature", scale=float(np.exp(-best.x)), shift=0.0)


def apply(calibration: Calibration, logits: np.ndarray) -> np.ndarray:
    """Calibrated probabilities from logits, as the folded output layer computes them."""
    z = calibration.scale * np.asarray(logits, dtype=np.float64) + calibration.shift
    return softmax(z) if calibration.method == "temperature" else sigmoid(z).reshape(-1)


def _counts(probabilities: np.ndarray, labels: np.ndarray, threshold: float) -> tuple[int, int, int]:
    """True positives, false positives and false negatives when probability > threshold is positive."""
    predicted = probabilities > threshold
    positive = labels == 1
    return int(np.sum(predicted & positive)), int(np.sum(predicted & ~positive)), int(np.sum(~predicted & positive))


def choose_threshold(probabilities: np.ndarray, labels: np.ndarray, objective: str, min_precision: float = 0.0
                     ) -> float:
    """The decision threshold (positive when probability > threshold) for the objective on these rows:
    f1, the highest F1; min_precision, the highest recall among thresholds with precision >= min_precision.
    Candidates lie halfway between neighbouring distinct probabilities, so the choice does not sit on one row's
    score. Raises CalibrationError when no threshold reaches min_precision."""
    p = np.asarray(probabilities, dtype=np.float64).reshape(-1)
    y = np.asarray(labels).reshape(-1) == 1
    scores = np.unique(p)
    # Every distinct cut of the sorted rows: below all of them, between each pair, at the top (none positive).
    candidates = np.concatenate([[scores[0] / 2.0], (scores[:-1] + scores[1:]) / 2.0, [scores[-1]]])
    order = np.argsort(p, kind="stable")
    below = np.searchsorted(p[order], candidates, side="right")
    positives = int(y.sum())
    true_pos = positives - np.concatenate([[0], np.cumsum(y[order])])[below]
    predicted = len(p) - below
    precision = true_pos / np.maximum(predicted, 1)
    recall = true_pos / max(positives, 1)
    f1 = 2 * true_pos / np.maximum(predicted + positives, 1)
    if objective == "f1":
        return float(candidates[int(np.argmax(f1))])
    if objective == "min_precision":
        allowed = (precision >= min_precision) & (true_pos > 0)
        if not allowed.any():
            raise CalibrationError(f"no threshold reaches a precision of {min_precision} on the calibration rows (the "
                                   f"best is {float(np.max(precision)):.4f}); lower calibration.min_precision or use "
                                   "calibration.threshold_objective=f1.")
        # The highest recall; among equal recalls, the highest precision.
        best = np.lexsort((precision, np.where(allowed, recall, -1.0)))[-1]
        return float(candidates[best])
    raise CalibrationError(f"calibration.threshold_objective '{objective}' is unknown; choose f1 or min_precision.")


def expected_calibration_error(confidence: np.ndarray, outcome: np.ndarray, bins: int = ECE_BINS) -> float:
    """The expected calibration error over equal-mass bins: the rows cut at the quantiles of `confidence` into
    `bins` groups of about equal size (equal confidences stay in one group), each group's |mean confidence - mean
    outcome| weighted by its share of the rows. 0 when every probability means the frequency it claims; NaN
    without rows."""
    c = np.asarray(confidence, dtype=np.float64).reshape(-1)
    o = np.asarray(outcome, dtype=np.float64).reshape(-1)
    if c.size == 0:
        return float("nan")
    edges = np.quantile(c, np.linspace(0.0, 1.0, bins + 1)[1:-1])
    groups = np.searchsorted(edges, c, side="right")
    return float(sum(np.mean(groups == g) * abs(c[groups == g].mean() - o[groups == g].mean())
                     for g in np.unique(groups)))


def reliability_bins(confidence: np.ndarray, outcome: np.ndarray, bins: int = ECE_BINS) -> ReliabilityBins:
    """The reliability diagram's points over the same equal-mass bins as expected_calibration_error: per bin the
    mean confidence, the observed frequency and the rows."""
    c = np.asarray(confidence, dtype=np.float64).reshape(-1)
    o = np.asarray(outcome, dtype=np.float64).reshape(-1)
    if c.size == 0:
        return ()
    groups = np.searchsorted(np.quantile(c, np.linspace(0.0, 1.0, bins + 1)[1:-1]), c, side="right")
    return tuple((float(c[groups == g].mean()), float(o[groups == g].mean()), int(np.sum(groups == g)))
                 for g in np.unique(groups))


def _reliability(kind: str, probabilities: np.ndarray, labels: np.ndarray) -> ReliabilityBins:
    """A binary model's positive probability against the share of positives; a multiclass model's confidence (its
    highest probability) against how often that class is right."""
    p, y = np.asarray(probabilities, dtype=np.float64), np.asarray(labels).reshape(-1)
    if kind == "temperature":
        return reliability_bins(p.max(axis=1), np.argmax(p, axis=1) == y)
    return reliability_bins(p.reshape(-1), y == 1)


def binary_figures(probabilities: np.ndarray, labels: np.ndarray, threshold: float) -> CalibrationFigures:
    """calibration (mean probability / mean label, TFMA's figure), the expected calibration error of the positive
    probability (equal-mass bins), AUC, and precision and recall at `threshold`."""
    p = np.asarray(probabilities, dtype=np.float64).reshape(-1)
    y = np.asarray(labels).reshape(-1)
    true_pos, false_pos, false_neg = _counts(p, y, threshold)
    positive_rate = float(np.mean(y == 1))
    return CalibrationFigures(
        calibration=float(np.mean(p) / positive_rate) if positive_rate > 0 else float("nan"),
        ece=expected_calibration_error(p, y == 1),
        auc=float(roc_auc_score(y == 1, p)) if 0 < positive_rate < 1 else float("nan"),
        precision=true_pos / (true_pos + false_pos) if true_pos + false_pos else float("nan"),
        recall=true_pos / (true_pos + false_neg) if true_pos + false_neg else float("nan"),
    )


def multiclass_figures(probabilities: np.ndarray, labels: np.ndarray) -> CalibrationFigures:
    """calibration (mean confidence of the argmax / accuracy: 1 when confidence means accuracy), the expected
    calibration error of that confidence (equal-mass bins), macro AUC, and macro precision and recall of the
    argmax."""
    from components.tasks import macro_auc

    p = np.asarray(probabilities, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64).reshape(-1)
    predicted = np.argmax(p, axis=1)
    accuracy = float(np.mean(predicted == y))
    precisions, recalls = [], []
    for c in range(p.shape[1]):
        if np.any(predicted == c):
            precisions.append(float(np.mean(y[predicted == c] == c)))
        if np.any(y == c):
            recalls.append(float(np.mean(predicted[y == c] == c)))
    return CalibrationFigures(
        calibration=float(np.mean(p.max(axis=1)) / accuracy) if accuracy > 0 else float("nan"),
        ece=expected_calibration_error(p.max(axis=1), predicted == y),
        auc=macro_auc(p, y),
        precision=float(np.mean(precisions)) if precisions else float("nan"),
        recall=float(np.mean(recalls)) if recalls else float("nan"),
    )


def resolve_method(options: CalibrationConfig, kind: str, calibration_rows: bool) -> str:
    """The method a run uses: platt (binary), temperature (multiclass) or none (regression, no calibration split,
    or calibration.method=none)."""
    if options.method == "none" or kind == "regression" or not calibration_rows:
        return "none"
    return "platt" if kind == "binary" else "temperature"


def fit(method: str, logits: np.ndarray, labels: np.ndarray) -> Calibration:
    return fit_platt(logits, labels) if method == "platt" else fit_temperature(logits, labels)


def calibration_record(
    calibration: Calibration,
    options: CalibrationConfig,
    fit_logits: np.ndarray,
    fit_labels: np.ndarray,
    measure_logits: np.ndarray,
    measure_labels: np.ndarray,
    fitted_on: str,
    measured_on: str,
) -> CalibrationRecord:
    """The record written beside the model (artifacts.CALIBRATION_REPORT_JSON): the fit, the chosen threshold and
    the figures of the model before (uncalibrated, at 0.5) and after (calibrated, at the threshold) on the
    measurement rows, which neither the model nor the calibration was fitted on."""
    rows = {"fitted_on": fitted_on, "rows": int(len(fit_labels)), "measured_on": measured_on,
            "measured_rows": int(len(measure_labels))}
    if calibration.method == "temperature":
        before, after = softmax(measure_logits), apply(calibration, measure_logits)
        return CalibrationRecord(
            method=calibration.method, **rows, objective="argmax", threshold=None,
            temperature=1.0 / calibration.scale,
            before=multiclass_figures(before, measure_labels), after=multiclass_figures(after, measure_labels),
            reliability_before=_reliability("temperature", before, measure_labels),
            reliability_after=_reliability("temperature", after, measure_labels))
    threshold = choose_threshold(apply(calibration, fit_logits), fit_labels, options.threshold_objective,
                                 options.min_precision)
    calibrated = apply(calibration, measure_logits)
    # TFMA's thresholds are fixed when the pipeline is built, so the report's matrix at this one is counted here.
    true_pos, false_pos, false_neg = _counts(calibrated.reshape(-1), np.asarray(measure_labels).reshape(-1),
                                             threshold)
    return CalibrationRecord(
        method=calibration.method, **rows, objective=options.threshold_objective, threshold=threshold,
        scale=calibration.scale, shift=calibration.shift,
        # Calibration carries a base rate from one split to another: a gap between the two shows here first.
        positive_rate_fitted=float(np.mean(np.asarray(fit_labels) == 1)),
        positive_rate_measured=float(np.mean(np.asarray(measure_labels) == 1)),
        before=binary_figures(sigmoid(measure_logits), measure_labels, 0.5),
        after=binary_figures(calibrated, measure_labels, threshold),
        reliability_before=_reliability("platt", sigmoid(measure_logits), measure_labels),
        reliability_after=_reliability("platt", calibrated, measure_labels),
        confusion_at_threshold=Confusion(tp=true_pos, fp=false_pos, fn=false_neg,
                                         tn=int(len(measure_labels)) - true_pos - false_pos - false_neg),
        min_precision=options.min_precision if options.threshold_objective == "min_precision" else None)


def collect(batches: Iterable[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """(logits, labels) of every batch, concatenated."""
    logits, labels = [], []
    for batch_logits, batch_labels in batches:
        logits.append(np.asarray(batch_logits, dtype=np.float64))
        labels.append(np.asarray(batch_labels).reshape(-1))
    if not labels:
        raise CalibrationError("the calibration split is empty; raise data.calibration_buckets.")
    return np.concatenate(logits), np.concatenate(labels)


def output_dense(model: tf.keras.Model) -> tf.keras.layers.Dense:
    """The model's last layer: a Dense layer with a sigmoid (binary) or softmax (multiclass) activation."""
    layer = model.layers[-1]
    activation = layer.get_config().get("activation") if isinstance(layer, tf.keras.layers.Dense) else None
    if activation not in ("sigmoid", "softmax"):
        raise CalibrationError(f"the model's last layer '{layer.name}' is not a Dense layer with a sigmoid or softmax "
                               "activation, so its logits cannot be calibrated; set calibration.method=none.")
    return layer


def model_logits(model: tf.keras.Model, dataset: tf.data.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """The model's logits (before the sigmoid or softmax, float64: [rows] or [rows, classes]) and the labels of
    every (features, label) batch of the finite `dataset`."""
    # A fresh copy: a layer the pruning wrappers or a clone reused has inbound nodes in other graphs, and
    # `layer.input` would be the first graph's tensor, disconnected from `model.inputs`.
    copy = tf.keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    layer = output_dense(copy)
    hidden = tf.keras.Model(copy.inputs, layer.input)
    kernel, bias = (w.astype(np.float64) for w in layer.get_weights())

    def batches() -> Iterable[tuple[np.ndarray, np.ndarray]]:
        for features, labels in dataset:
            z = hidden(features, training=False).numpy().astype(np.float64) @ kernel + bias
            yield (z.reshape(-1) if z.shape[1] == 1 else z), labels.numpy()

    return collect(batches())


def fold(model: tf.keras.Model, calibration: Calibration) -> tf.keras.Model:
    """A copy of `model` whose output layer computes the calibrated logits (kernel and bias scaled, shift added):
    the same graph, so every converter and runtime handles it as it handled the model."""
    calibrated = tf.keras.models.clone_model(model)
    calibrated.set_weights(model.get_weights())
    layer = output_dense(calibrated)
    kernel, bias = layer.get_weights()
    layer.set_weights([kernel * calibration.scale, bias * calibration.scale + calibration.shift])
    return calibrated


def calibrate(
    model: tf.keras.Model,
    fit_rows: tf.data.Dataset,
    measure_rows: tf.data.Dataset,
    method: str,
    options: CalibrationConfig,
    fitted_on: str,
    measured_on: str,
) -> tuple[tf.keras.Model, CalibrationRecord]:
    """Fits `method` (platt or temperature) on the logits of `fit_rows`, chooses the threshold there, and measures
    the model before and after on `measure_rows`; returns the calibrated copy of the model and the record."""
    fit_logits, fit_labels = model_logits(model, fit_rows)
    measure_logits, measure_labels = model_logits(model, measure_rows)
    calibration = fit(method, fit_logits, fit_labels)
    fitted = calibration_record(calibration, options, fit_logits, fit_labels, measure_logits, measure_labels,
                                fitted_on, measured_on)
    before, after = fitted.before.calibration, fitted.after.calibration
    if _farther_from_one(before, after):
        # A fit that makes the measured probabilities less trustworthy is no calibration: the model keeps its own
        # (a binary model's threshold is still chosen, on those probabilities).
        kept = calibration_record(Calibration(method), options, fit_logits, fit_labels, measure_logits,
                                  measure_labels, fitted_on, measured_on)
        record = dataclasses.replace(
            kept, applied=False, rejected_before=before, rejected_after=after,
            note=f"{method} scaling moved the eval calibration from {before:.4f} to {after:.4f}, further from 1, so "
                 "it is not applied")
        return fold(model, Calibration(method)), record
    return fold(model, calibration), fitted


def _farther_from_one(before: float, after: float) -> bool:
    """Whether the calibration figure (1 when probabilities mean frequencies) got worse; NaN never counts."""
    return bool(np.isfinite(before) and np.isfinite(after) and abs(after - 1.0) > abs(before - 1.0))
