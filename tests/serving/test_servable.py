"""A loaded signature's model call: straight to the function's flat call, answering as TF's public call does."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from serving.server.servable import flat_signature_call, load_servable_version
from tests.serving.conftest import FEATURES, MODEL, ROW, expected_probability

ROWS = [ROW, {**ROW, "fare": 40.0, "payment_type": "Credit Card"}, {**ROW, "trip_start_hour": 23}]


def columns(rows: list[dict]) -> dict[str, np.ndarray]:
    return {name: np.array([row[name] for row in rows], dtype=object if dtype == tf.string else dtype.as_numpy_dtype)
            for name, dtype in FEATURES.items()}


@pytest.mark.parametrize("signature_name", ["serving_default", "scores"])
def test_a_saved_model_signature_runs_through_its_flat_call_and_answers_as_the_public_call(tiny_exports,
                                                                                           signature_name):
    signature = load_servable_version(MODEL, 2, tiny_exports[2]).signature(signature_name)
    assert signature.flat_call is not None
    order, _ = signature.flat_call
    assert sorted(order) == sorted(FEATURES)
    inputs = columns(ROWS)
    public = signature.function(**{name: tf.constant(value, dtype=FEATURES[name]) for name, value in inputs.items()})
    flat = signature.run(inputs)
    assert sorted(flat) == sorted(public)
    for name, value in public.items():
        np.testing.assert_array_equal(flat[name], value.numpy())
    assert flat["probabilities"] == pytest.approx([expected_probability(row, 2) for row in ROWS])


def test_functions_that_are_not_keyword_tensor_signatures_keep_the_public_call():
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def positional(x):
        return {"y": x + 1}

    @tf.function(input_signature=[{"a": tf.TensorSpec([None], tf.float32), "b": tf.TensorSpec([None], tf.float32)}])
    def nested(features):
        return {"y": features["a"] + features["b"]}

    assert flat_signature_call(positional.get_concrete_function(), ["x"]) is None
    assert flat_signature_call(nested.get_concrete_function(), ["a", "b"]) is None
    assert flat_signature_call(lambda **kwargs: kwargs, ["x"]) is None
