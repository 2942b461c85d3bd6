"""The built model reflects each training choice from the config, and it trains."""
import base64
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from components.features import FeatureLayout
from components.model import (
    MAX_CATEGORY_IDS,
    FiniteLossCheck,
    NonFiniteLoss,
    apply_hyperparameters,
    build_model,
    categorical_cardinalities,
    class_weights,
)
from components.tasks import Task
from components.transform import CONSTANTS_VOCABULARY
from settings.config import TrainingConfig

NUMERIC = ["fare_xf", "trip_miles_xf"]
CARDINALITIES = {"payment_type_xf": 12, "lat_xf": 11}


def training(**changes):
    return dataclasses.replace(TrainingConfig(), **changes)


def layers_of(model, kind):
    return [layer for layer in model.layers if isinstance(layer, kind)]


def random_batch(n=64, seed=0):
    rng = np.random.default_rng(seed)
    features = {name: rng.normal(size=(n, 1)).astype("float32") for name in NUMERIC}
    features.update({name: rng.integers(0, size, size=(n, 1)) for name, size in CARDINALITIES.items()})
    labels = (features["fare_xf"][:, 0] > 0).astype("int64")
    return features, labels


def test_default_is_adam_constant_rate():
    model = build_model(NUMERIC, CARDINALITIES, training())
    assert isinstance(model.optimizer, tf.keras.optimizers.Adam)
    assert float(model.optimizer.learning_rate) == pytest.approx(0.001)
    assert not layers_of(model, tf.keras.layers.Dropout)
    assert not layers_of(model, tf.keras.layers.BatchNormalization)
    assert [layer.units for layer in layers_of(model, tf.keras.layers.Dense)] == [64, 32, 1]


def test_sgd_with_momentum():
    model = build_model(NUMERIC, CARDINALITIES, training(optimizer="sgd", momentum=0.8))
    assert isinstance(model.optimizer, tf.keras.optimizers.SGD)
    assert float(model.optimizer.momentum) == pytest.approx(0.8)


@pytest.mark.parametrize("schedule, kind", [("exponential", "ExponentialDecay"), ("cosine", "CosineDecay")])
def test_learning_rate_schedules(schedule, kind):
    model = build_model(NUMERIC, CARDINALITIES, training(lr_schedule=schedule, decay_steps=10))
    learning_rate = model.optimizer.get_config()["learning_rate"]
    assert learning_rate["class_name"] == kind
    assert learning_rate["config"]["decay_steps"] == 10


def test_gradient_clipping_by_norm():
    model = build_model(NUMERIC, CARDINALITIES, training(clipnorm=0.5))
    assert model.optimizer.clipnorm == pytest.approx(0.5)
    assert build_model(NUMERIC, CARDINALITIES, training()).optimizer.clipnorm is None


def test_dropout_batch_norm_and_l2():
    model = build_model(
        NUMERIC, CARDINALITIES, training(dropout=0.3, batch_norm=True, l2=0.01, hidden_units=[16, 8, 4])
    )
    assert [layer.rate for layer in layers_of(model, tf.keras.layers.Dropout)] == [0.3, 0.3, 0.3]
    assert len(layers_of(model, tf.keras.layers.BatchNormalization)) == 3
    hidden = [layer for layer in layers_of(model, tf.keras.layers.Dense) if layer.name != "output"]
    assert [float(layer.kernel_regularizer.l2) for layer in hidden] == pytest.approx([0.01] * 3)


def test_xla():
    assert build_model(NUMERIC, CARDINALITIES, training(jit_compile=True)).jit_compile is True
    assert build_model(NUMERIC, CARDINALITIES, training()).jit_compile is False


def test_mixed_precision_keeps_the_output_float32():
    model = build_model(NUMERIC, CARDINALITIES, training(mixed_precision="mixed_bfloat16"))
    assert model.get_layer("dense_0").dtype_policy.name == "mixed_bfloat16"
    assert model.get_layer("output").dtype_policy.name == "float32"
    assert tf.keras.mixed_precision.global_policy().name == "float32"
    loss_scaled = build_model(NUMERIC, CARDINALITIES, training(mixed_precision="mixed_float16"))
    assert isinstance(loss_scaled.optimizer, tf.keras.mixed_precision.LossScaleOptimizer)


@pytest.mark.parametrize("changes", [{}, {"batch_norm": True, "dropout": 0.2, "optimizer": "sgd", "clipnorm": 1.0}])
def test_trains_a_few_steps(changes):
    model = build_model(NUMERIC, CARDINALITIES, training(learning_rate=0.05, **changes))
    features, labels = random_batch()
    before = model.evaluate(features, labels, verbose=0, return_dict=True)["loss"]
    history = model.fit(features, labels, epochs=15, batch_size=16, verbose=0)
    after = model.evaluate(features, labels, verbose=0, return_dict=True)["loss"]
    assert np.isfinite(history.history["loss"]).all()
    assert after < before
    probabilities = model.predict(features, verbose=0)
    assert probabilities.shape == (64, 1) and ((probabilities >= 0) & (probabilities <= 1)).all()


def test_a_nan_loss_stops_training_with_one_sentence_naming_the_cause():
    # A regression label with a gap, as the Transform made it before ExampleGen left such rows out: NaN.
    task = Task("regression", label_mean=0.0, label_std=1.0)
    model = build_model(NUMERIC, CARDINALITIES, training(), task)
    features, _ = random_batch(16)
    labels = np.arange(16, dtype="float32")
    labels[3] = np.nan
    with pytest.raises(NonFiniteLoss, match=r"training loss is nan after epoch 1.*missing or infinite label") as e:
        model.fit(features, labels, epochs=3, batch_size=8, verbose=0, callbacks=[FiniteLossCheck(task)])
    assert str(e.value).count(". ") == 0 and str(e.value).endswith(".")


def test_class_weights_balance_the_classes():
    labels = tf.constant([[1], [0], [0], [0]], tf.int64)
    dataset = tf.data.Dataset.from_tensor_slices(({"x": tf.zeros([4, 1])}, labels)).batch(3)
    assert class_weights(dataset) == pytest.approx({0: 4 / 6, 1: 2.0})


def test_class_weights_refuse_a_single_class():
    dataset = tf.data.Dataset.from_tensor_slices(({"x": tf.zeros([2, 1])}, tf.zeros([2, 1], tf.int64))).batch(2)
    with pytest.raises(ValueError, match="only one class"):
        class_weights(dataset)


def test_tuned_hyperparameters_replace_width_depth_and_rate():
    from components.tuner import search_space

    space = search_space()
    space.values.update({"units": 32, "depth": 3, "learning_rate": 0.005})
    tuned = apply_hyperparameters(training(), space.get_config())
    assert tuned.hidden_units == [32, 16, 8]
    assert tuned.learning_rate == pytest.approx(0.005)
    assert apply_hyperparameters(training(), None) == training()


@pytest.mark.parametrize("numeric", [["fare_xf"], []])
def test_one_or_no_numeric_feature_builds_and_clones_as_the_optimizer_does(numeric):
    model = build_model(numeric, CARDINALITIES, training())
    clone = tf.keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    features, _ = random_batch(8)
    batch = {name: features[name] for name in [*numeric, *CARDINALITIES]}
    np.testing.assert_allclose(clone.predict(batch, verbose=0), model.predict(batch, verbose=0), rtol=1e-6)


class RecordedConstants:
    """A Transform output holding only what record_constants writes: the largest id of category feature 'area'."""

    def __init__(self, largest_id: int):
        def encode(data: bytes) -> bytes:
            return base64.urlsafe_b64encode(data).rstrip(b"=")

        value = tf.io.serialize_tensor(tf.constant([largest_id], tf.float32)).numpy()
        self.token = encode(b"area") + b"=" + encode(value)

    def vocabulary_by_name(self, name):
        assert name == CONSTANTS_VOCABULARY
        return [self.token]


def test_a_category_input_has_an_id_per_value_up_to_the_largest_plus_the_out_of_range_id():
    layout = FeatureLayout.from_properties({"data": {"category_features": ["area"]}, "label": {"column": "tips"},
                                            "transform": {}})
    assert categorical_cardinalities(layout, RecordedConstants(77)) == {"area_xf": 79}
    assert categorical_cardinalities(layout, RecordedConstants(-1)) == {"area_xf": 1}
    largest = MAX_CATEGORY_IDS - 1
    assert categorical_cardinalities(layout, RecordedConstants(largest)) == {"area_xf": MAX_CATEGORY_IDS + 1}
    with pytest.raises(ValueError) as error:
        categorical_cardinalities(layout, RecordedConstants(MAX_CATEGORY_IDS))
    assert str(error.value) == (f"category feature 'area' reaches {MAX_CATEGORY_IDS} on the training split, too large "
                                f"for ids (at most {largest}); list it under data.vocab_features.")
