"""Calibration: Platt and temperature fits recover a known miscalibration, the fold into the output layer computes
the calibrated probabilities and keeps the ranking, and the decision threshold follows its objective."""
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from components.calibration import (
    Calibration,
    CalibrationError,
    apply,
    binary_figures,
    calibrate,
    calibration_record,
    choose_threshold,
    fit_platt,
    fit_temperature,
    fold,
    model_logits,
    resolve_method,
    sigmoid,
    softmax,
)
from reports.records import Confusion
from settings.config import CalibrationConfig


def miscalibrated_binary(n=20000, seed=0, scale=0.5, shift=-0.8):
    """Logits z of a model whose true probability is sigmoid(scale * z + shift), and labels drawn from it."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0.5, 2.0, n)
    labels = (rng.random(n) < sigmoid(scale * z + shift)).astype(np.int64)
    return z, labels


def test_platt_recovers_a_known_slope_and_shift():
    z, labels = miscalibrated_binary()
    calibration = fit_platt(z, labels)
    assert calibration.scale == pytest.approx(0.5, abs=0.03)
    assert calibration.shift == pytest.approx(-0.8, abs=0.05)
    raw, fitted = binary_figures(sigmoid(z), labels, 0.5), binary_figures(apply(calibration, z), labels, 0.5)
    assert raw.calibration > 1.2, "the synthetic model is miscalibrated to begin with"
    assert fitted.calibration == pytest.approx(1.0, abs=0.01)
    assert fitted.auc == pytest.approx(raw.auc, abs=1e-12), "an increasing map keeps the ranking"


def test_platt_on_calibrated_scores_is_the_identity():
    z, labels = miscalibrated_binary(scale=1.0, shift=0.0, seed=3)
    calibration = fit_platt(z, labels)
    assert (calibration.scale, calibration.shift) == pytest.approx((1.0, 0.0), abs=0.05)


def test_platt_refuses_one_class_and_a_reversed_ranking():
    with pytest.raises(CalibrationError, match="only one class"):
        fit_platt(np.linspace(-1, 1, 50), np.zeros(50))
    z, labels = miscalibrated_binary(n=2000)
    with pytest.raises(CalibrationError, match="non-positive slope"):
        fit_platt(-z, labels)


def test_temperature_recovers_a_known_temperature():
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 3.0, (20000, 3))
    true = softmax(logits / 2.5)
    labels = np.array([rng.choice(3, p=p) for p in true])
    calibration = fit_temperature(logits, labels)
    assert 1.0 / calibration.scale == pytest.approx(2.5, rel=0.05)
    np.testing.assert_array_equal(np.argmax(apply(calibration, logits), axis=1), np.argmax(logits, axis=1))


def f1_brute_force(p, y, threshold):
    predicted = p > threshold
    tp = np.sum(predicted & (y == 1))
    return 2 * tp / (predicted.sum() + (y == 1).sum())


def test_f1_threshold_is_the_best_cut():
    z, labels = miscalibrated_binary(n=3000, seed=5)
    p = apply(fit_platt(z, labels), z)
    threshold = choose_threshold(p, labels, "f1")
    best = max(f1_brute_force(p, labels, t) for t in np.unique(p))
    assert f1_brute_force(p, labels, threshold) == pytest.approx(best)
    assert not np.any(p == threshold), "the threshold lies between two rows' probabilities"


# Sorted probabilities and labels where the precision of "p > t" is known at each cut: above 0.85 two of two rows
# are positive (precision 1.0, recall 0.5), above 0.65 three of four (0.75, 0.75), above 0.35 four of six
# (0.667, 1.0).
PROBS = np.array([0.1, 0.2, 0.3, 0.4, 0.6, 0.7, 0.8, 0.9, 0.95])
LABELS = np.array([0, 0, 0, 1, 0, 1, 0, 1, 1])


@pytest.mark.parametrize("min_precision, threshold", [
    (0.74, 0.65),   # just inside 0.75: the cut with recall 0.75
    (0.76, 0.85),   # just outside it: only the precision-1.0 cut qualifies
    (0.66, 0.35),   # just inside 0.667: every positive
    (0.67, 0.65),   # just outside it
])
def test_min_precision_threshold_just_inside_and_outside_the_bound(min_precision, threshold):
    chosen = choose_threshold(PROBS, LABELS, "min_precision", min_precision)
    assert chosen == pytest.approx(threshold)
    figures = binary_figures(PROBS, LABELS, chosen)
    assert figures.precision >= min_precision


def test_min_precision_that_no_threshold_reaches_stops_with_the_key_to_change():
    labels = np.array([1, 0, 1, 0, 1, 0])
    probabilities = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    with pytest.raises(CalibrationError, match="lower calibration.min_precision"):
        choose_threshold(probabilities, labels, "min_precision", 0.9)
    with pytest.raises(CalibrationError, match="unknown"):
        choose_threshold(probabilities, labels, "accuracy")


def test_resolve_method_per_task_kind():
    auto, off = CalibrationConfig(), CalibrationConfig(method="none")
    assert resolve_method(auto, "binary", True) == "platt"
    assert resolve_method(auto, "multiclass", True) == "temperature"
    assert resolve_method(auto, "regression", True) == "none"
    assert resolve_method(auto, "binary", False) == "none"
    assert resolve_method(off, "binary", True) == "none"


def keras_classifier(units=1, seed=0):
    tf.keras.utils.set_random_seed(seed)
    inputs = {"x": tf.keras.Input(shape=(1,), name="x"), "w": tf.keras.Input(shape=(1,), name="w")}
    hidden = tf.keras.layers.Dense(4, activation="tanh")(tf.keras.layers.Concatenate()(list(inputs.values())))
    activation = "sigmoid" if units == 1 else "softmax"
    # A bias away from zero, so that folding must scale it too.
    output = tf.keras.layers.Dense(units, activation=activation, name="output",
                                   bias_initializer=tf.keras.initializers.Constant(0.3))
    return tf.keras.Model(inputs, output(hidden))


def rows(n=4000, seed=0):
    """(features, label) batches where the label follows x: a model that scales its logit is miscalibrated."""
    rng = np.random.default_rng(seed)
    x, w = rng.normal(size=(n, 1)).astype(np.float32), rng.normal(size=(n, 1)).astype(np.float32)
    labels = (rng.random(n) < sigmoid(1.5 * x[:, 0] - 0.7)).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices(({"x": x, "w": w}, labels)).batch(500)


def test_fold_puts_the_calibration_inside_the_model():
    model = keras_classifier()
    calibration = Calibration("platt", scale=0.6, shift=-0.4)
    folded = fold(model, calibration)
    logits, _ = model_logits(model, rows(600))
    features = next(iter(rows(600).unbatch().batch(600)))[0]
    np.testing.assert_allclose(folded(features).numpy().reshape(-1), apply(calibration, logits), atol=1e-6)
    np.testing.assert_allclose(model(features).numpy().reshape(-1), sigmoid(logits), atol=1e-6,
                               err_msg="the input model is left as it was")


def test_calibrate_fits_on_one_set_of_rows_and_measures_on_another():
    # A trained-looking model: its output layer pushed to over-confident, shifted logits.
    model = keras_classifier()
    model.compile(optimizer=tf.keras.optimizers.Adam(0.05), loss="binary_crossentropy")
    model.fit(rows(seed=1), epochs=2, verbose=0)
    layer = model.get_layer("output")
    kernel, bias = layer.get_weights()
    layer.set_weights([kernel * 2.0, bias + 1.0])
    options = dataclasses.replace(CalibrationConfig(), threshold_objective="f1")
    calibrated, record = calibrate(model, rows(seed=2), rows(seed=3), "platt", options, "fit rows", "measure rows")
    assert record.fitted_on == "fit rows" and record.rows == 4000 and record.measured_rows == 4000
    fit_labels = np.concatenate([y.numpy() for _, y in rows(seed=2)])
    assert record.positive_rate_fitted == pytest.approx(float(np.mean(fit_labels)))
    assert record.before.calibration > 1.15
    assert record.after.calibration == pytest.approx(1.0, abs=0.05)
    assert record.after.auc == pytest.approx(record.before.auc, abs=1e-6)
    assert 0.0 < record.threshold < 1.0 and record.objective == "f1"
    features = next(iter(rows(seed=3).unbatch().batch(4000)))[0]
    served = calibrated(features).numpy().reshape(-1)
    labels = np.concatenate([y.numpy() for _, y in rows(seed=3)])
    assert binary_figures(served, labels, record.threshold).to_dict() == pytest.approx(record.after.to_dict(), abs=1e-6)
    predicted = served > record.threshold
    assert record.confusion_at_threshold == Confusion(
        tp=int(np.sum(predicted & (labels == 1))), fp=int(np.sum(predicted & (labels == 0))),
        fn=int(np.sum(~predicted & (labels == 1))), tn=int(np.sum(~predicted & (labels == 0))))


def test_temperature_calibration_of_a_softmax_model_folds_too():
    model = keras_classifier(units=3)
    calibration = Calibration("temperature", scale=1 / 3.0)
    features = next(iter(rows(200).unbatch().batch(200)))[0]
    logits, _ = model_logits(model, rows(200))
    np.testing.assert_allclose(fold(model, calibration)(features).numpy(), softmax(logits / 3.0), atol=1e-6)


def test_a_model_without_a_sigmoid_or_softmax_output_is_refused():
    inputs = tf.keras.Input(shape=(1,), name="x")
    regression = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(inputs))
    with pytest.raises(CalibrationError, match="calibration.method=none"):
        fold(regression, Calibration("platt"))


def test_logits_of_a_model_whose_layers_another_graph_also_uses():
    # What strip_pruning hands back: layers with inbound nodes in an earlier graph too.
    original = keras_classifier()
    shared = tf.keras.models.clone_model(original, clone_function=lambda layer: layer)
    logits, labels = model_logits(shared, rows(300))
    np.testing.assert_allclose(sigmoid(logits), np.concatenate([shared(x).numpy().reshape(-1) for x, _ in rows(300)]),
                               atol=1e-6)
    assert len(labels) == 300


def overconfident_multiclass_record(seed):
    """The temperature-scaling record of 3,000 rows whose logits are twice as confident as their labels: fitted on
    the first half, measured on the second."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 3.0, (3000, 3))
    labels = np.array([rng.choice(3, p=p) for p in softmax(logits / 2.0)])
    return calibration_record(fit_temperature(logits[:1500], labels[:1500]), CalibrationConfig(), logits[:1500],
                              labels[:1500], logits[1500:], labels[1500:], "fit rows", "measure rows")


def test_a_multiclass_record_has_no_threshold_and_keeps_the_argmax_figures():
    record = overconfident_multiclass_record(seed=2)
    assert record.method == "temperature" and record.threshold is None and record.objective == "argmax"
    assert record.temperature == pytest.approx(2.0, rel=0.1)
    assert record.before.calibration > 1.1, "over-confident before"
    assert record.after.calibration == pytest.approx(1.0, abs=0.05)
    # Temperature keeps every argmax.
    assert (record.after.precision, record.after.recall) == pytest.approx((record.before.precision,
                                                                           record.before.recall))


def shifted_rows(n=4000, seed=0):
    """Rows whose label follows a rule with a lower base rate than rows(): a fit there misleads on rows()."""
    rng = np.random.default_rng(seed)
    x, w = rng.normal(size=(n, 1)).astype(np.float32), rng.normal(size=(n, 1)).astype(np.float32)
    labels = (rng.random(n) < sigmoid(1.5 * x[:, 0] - 2.5)).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices(({"x": x, "w": w}, labels)).batch(500)


def test_a_fit_that_worsens_the_measured_calibration_is_not_applied():
    model = keras_classifier()
    model.compile(optimizer=tf.keras.optimizers.Adam(0.05), loss="binary_crossentropy")
    model.fit(rows(seed=1), epochs=3, verbose=0)
    calibrated, record = calibrate(model, shifted_rows(seed=2), rows(seed=3), "platt", CalibrationConfig(),
                                   "fit rows", "measure rows")
    assert record.applied is False
    assert abs(record.rejected_after - 1) > abs(record.rejected_before - 1)
    assert record.note.startswith("platt scaling moved the eval calibration from ")
    assert record.note.endswith("further from 1, so it is not applied")
    assert record.after.calibration == pytest.approx(record.before.calibration)
    assert 0.0 < record.threshold < 1.0, "the threshold is still chosen, on the model's own probabilities"
    features = next(iter(rows(seed=3).unbatch().batch(4000)))[0]
    np.testing.assert_allclose(calibrated(features).numpy(), model(features).numpy(), atol=1e-6)
    _, kept = calibrate(model, rows(seed=2), rows(seed=3), "platt", CalibrationConfig(), "fit rows", "measure rows")
    assert kept.applied is True


def test_expected_calibration_error_over_equal_mass_bins():
    from components.calibration import expected_calibration_error

    # Each probability means the frequency of its bin: no error.
    confidence = np.repeat([0.1, 0.5, 0.9], 10)
    outcome = np.concatenate([[1] + [0] * 9, [1] * 5 + [0] * 5, [1] * 9 + [0]])
    assert expected_calibration_error(confidence, outcome, bins=3) == pytest.approx(0.0)
    # Over-confident by 0.3 everywhere.
    assert expected_calibration_error(np.full(20, 0.9), np.array([1] * 12 + [0] * 8)) == pytest.approx(0.3)
    assert np.isnan(expected_calibration_error(np.array([]), np.array([])))
    figures = binary_figures(np.full(20, 0.9), np.array([1] * 12 + [0] * 8), 0.5)
    assert figures.ece == pytest.approx(0.3)


def test_the_record_holds_a_reliability_diagram_before_and_after():
    record = overconfident_multiclass_record(seed=4)
    for key in ("before", "after"):
        points = getattr(record, f"reliability_{key}")
        assert len(points) == 10 and sum(rows for _, _, rows in points) == 1500
        assert all(0 <= confidence <= 1 and 0 <= right <= 1 for confidence, right, _ in points)
    # Over-confident before (each bin right less often than it claims), close to the diagonal after.
    gap = {key: np.mean([c - r for c, r, _ in getattr(record, f"reliability_{key}")]) for key in ("before", "after")}
    assert gap["before"] > 0.05 and abs(gap["after"]) < gap["before"]
    from reports.run_page import _calibration

    assert "data-chart='reliability'" in _calibration({"calibration": record.to_dict()})
