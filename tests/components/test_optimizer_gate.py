"""The Optimizer's gate, its AUC measurement and the pruning schedule as plain functions: the AUC drop just inside and
just outside optimize.max_degradation, a gain, and sparsity targets other than 0.5 (where `1 - target` would go
unnoticed).
test_optimizer.py drives the same gate through a real pruned model and the executor."""
import numpy as np
import pytest
import tensorflow as tf
from sklearn.metrics import log_loss, roc_auc_score

from components.optimizer.optimize import _pruning_schedule, evaluate, pruning_gate

# Eval AUCs of the taxi model before pruning, as the Optimizer measures them; a non-default allowance.
AUC_BEFORE = 0.9312
MAX_AUC_DROP = 0.015


@pytest.mark.parametrize("auc_after, passes", [
    pytest.param(AUC_BEFORE - 0.0149, True, id="drop-just-inside"),
    pytest.param(AUC_BEFORE - 0.0151, False, id="drop-just-outside"),
    pytest.param(AUC_BEFORE, True, id="no-drop"),
])
def test_pruning_gate_at_max_auc_drop(auc_after, passes):
    drop, passed = pruning_gate(AUC_BEFORE, auc_after, MAX_AUC_DROP)
    assert drop == pytest.approx(AUC_BEFORE - auc_after, abs=1e-12)
    assert passed is passes


def test_pruning_gate_passes_a_drop_exactly_at_the_limit():
    auc_after = 0.9101
    assert pruning_gate(AUC_BEFORE, auc_after, AUC_BEFORE - auc_after) == (AUC_BEFORE - auc_after, True)


def test_pruning_that_gains_auc_passes_a_zero_allowance():
    # A gain is a negative drop: a gate that took the difference the other way round would refuse it.
    drop, passed = pruning_gate(0.9101, 0.9312, 0.0)
    assert drop == pytest.approx(-0.0211)
    assert passed
    assert pruning_gate(0.9312, 0.9101, 0.02) == (pytest.approx(0.0211), False)


@pytest.mark.parametrize("target", [0.3, 0.8])
def test_schedule_ramps_from_dense_to_the_target(target):
    config = _pruning_schedule(target, 400).get_config()["config"]
    assert config["initial_sparsity"] == 0.0
    assert config["final_sparsity"] == target
    assert config["begin_step"] == 0


@pytest.mark.parametrize("steps, frequency, end_step", [
    # Masks update every steps // 20 steps (at least 1); the ramp ends near 70% of the steps, on an update.
    (1, 1, 1), (2, 1, 1), (10, 1, 7), (45, 2, 32), (400, 20, 280), (1000, 50, 700),
])
def test_schedule_ends_on_a_mask_update_within_the_fine_tuning(steps, frequency, end_step):
    schedule = _pruning_schedule(0.3, steps)
    assert (schedule.frequency, schedule.end_step) == (frequency, end_step)
    assert schedule.end_step % schedule.frequency == 0 and schedule.end_step <= steps
    # At the last step the target is reached and the masks are updated.
    should_prune, sparsity = schedule(schedule.end_step)
    assert bool(should_prune) and float(sparsity) == pytest.approx(0.3)


@pytest.fixture(scope="module")
def sigmoid_model():
    """A Keras model whose probability is sigmoid(x) at inference; dropout changes it while training."""
    inputs = {"x": tf.keras.Input(shape=(1,), name="x")}
    dropped = tf.keras.layers.Dropout(0.5, seed=3)(inputs["x"])
    output = tf.keras.layers.Dense(1, activation="sigmoid", kernel_initializer="ones", name="output")(dropped)
    return tf.keras.Model(inputs, output)


def eval_batches(logits, labels, batch_size=4):
    return tf.data.Dataset.from_tensor_slices(
        ({"x": np.array(logits, np.float32)[:, None]}, np.array(labels, np.int64)[:, None])).batch(batch_size)


def test_evaluate_scores_every_row_in_inference_mode_and_counts_one_half_as_negative(sigmoid_model):
    logits = [-3.0, -1.0, 0.0, 0.5, 2.0, -0.5, 1.5, 3.0, -2.0, -0.2]
    labels = [0, 0, 1, 1, 1, 1, 0, 1, 0, 0]
    probabilities = 1 / (1 + np.exp(-np.array(logits)))
    metrics = evaluate(sigmoid_model, eval_batches(logits, labels))
    assert metrics["rows"] == 10
    assert metrics["auc"] == pytest.approx(roc_auc_score(labels, probabilities))
    # Right: 3 positives and 4 negatives whose logits are on their side of 0. p = 0.5 exactly (logit 0, a positive)
    # is a negative prediction, as for Keras' binary accuracy.
    assert metrics["accuracy"] == pytest.approx(7 / 10)
    first_two = evaluate(sigmoid_model, eval_batches(logits, labels), steps=2)
    assert first_two["rows"] == 8
    assert first_two["auc"] == pytest.approx(roc_auc_score(labels[:8], probabilities[:8]))


def test_evaluate_refuses_data_that_cannot_give_an_auc(sigmoid_model):
    with pytest.raises(ValueError) as error:
        evaluate(sigmoid_model, eval_batches([1.0, 2.0], [1, 1]))
    assert str(error.value) == ("the evaluation data holds only one class (2 positives of 2 rows), so AUC is "
                                "undefined; check the eval split and the label settings.")
    with pytest.raises(ValueError) as error:
        evaluate(sigmoid_model, eval_batches([1.0, 2.0], [1, 0]).take(0))
    assert str(error.value) == ("the evaluation data is empty; check the eval split of the transformed examples.")


@pytest.fixture(scope="module")
def softmax_model():
    """Three classes whose probabilities are softmax(x) of a three-value input."""
    inputs = {"x": tf.keras.Input(shape=(3,), name="x")}
    output = tf.keras.layers.Dense(3, activation="softmax", use_bias=False, kernel_initializer="identity")(inputs["x"])
    return tf.keras.Model(inputs, output)


def class_batches(logits, labels, batch_size=4):
    return tf.data.Dataset.from_tensor_slices(
        ({"x": np.array(logits, np.float32)}, np.array(labels, np.int64)[:, None])).batch(batch_size)


def test_evaluate_gives_the_multiclass_figures_of_every_row(softmax_model):
    logits = [[2, 0, 0], [0, 2, 0], [0, 0, 2], [1, 0.5, 0], [0, 1, 1.5], [0.2, 0.1, 0], [0, 0.5, 0.4]]
    labels = [0, 1, 2, 1, 2, 0, 2]
    probabilities = tf.nn.softmax(np.array(logits, np.float32)).numpy()
    metrics = evaluate(softmax_model, class_batches(logits, labels), kind="multiclass")
    assert metrics["rows"] == 7
    assert metrics["macro_auc"] == pytest.approx(roc_auc_score(labels, probabilities, multi_class="ovr"), abs=1e-6)
    assert metrics["accuracy"] == pytest.approx(5 / 7)
    assert metrics["log_loss"] == pytest.approx(log_loss(labels, probabilities), abs=1e-6)


def test_evaluate_takes_two_of_three_classes_and_refuses_one(softmax_model):
    # Two classes present still give a macro AUC (over the classes present) ...
    metrics = evaluate(softmax_model, class_batches([[2, 0, 0], [0, 2, 0], [1, 0, 0]], [0, 1, 1]), kind="multiclass")
    assert metrics["macro_auc"] == pytest.approx(0.5 * (1.0 + 1.0))
    # ... one class gives none.
    with pytest.raises(ValueError) as error:
        evaluate(softmax_model, class_batches([[0, 0, 2]], [2]), kind="multiclass")
    assert str(error.value) == ("the evaluation data holds only one class (id 2), so the macro AUC is undefined; "
                                "check the eval split and the label settings.")


def test_evaluate_scores_a_regression_even_on_a_constant_label():
    inputs = {"x": tf.keras.Input(shape=(1,), name="x")}
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1, kernel_initializer="ones")(inputs["x"]))
    data = tf.data.Dataset.from_tensor_slices(
        ({"x": np.array([[1.0], [3.0]], np.float32)}, np.array([[2.0], [2.0]], np.float32))).batch(2)
    metrics = evaluate(model, data, kind="regression")
    assert (metrics["rmse"], metrics["mae"], metrics["rows"]) == (1.0, 1.0, 2) and np.isnan(metrics["r2"])
