"""A loaded signature's model call: straight to the function's flat call, answering as TF's public call does."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from serving.server.errors import ServingRequestError
from serving.server.servable import MAX_ERROR_CHARS, flat_signature_call, kernel_message, load_servable_version
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


def test_a_graph_that_rejects_a_value_answers_with_the_kernels_whole_message(tmp_path):
    """TF Serving returns the failed kernel's message and node; the Python runtime's "Graph execution error:"
    preamble, stack traces and op name say nothing about the inputs and are left out."""
    class Fares(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="fare")])
        def serve(self, fare):
            checked = tf.debugging.assert_non_negative(fare, message="fare must not be negative")
            with tf.control_dependencies([checked]):
                return {"probabilities": tf.sigmoid(fare)}

    module = Fares()
    tf.saved_model.save(module, str(tmp_path / "1"), signatures={"serving_default": module.serve})
    signature = load_servable_version(MODEL, 1, tmp_path / "1").signature("serving_default")
    assert signature.run({"fare": np.array([0.0], np.float32)})["probabilities"] == pytest.approx([0.5])
    with pytest.raises(ServingRequestError) as rejected:
        signature.run({"fare": np.array([2.0, -3.5], np.float32)})
    message = rejected.value.message
    assert rejected.value.http_status == 400
    assert message == ("The model rejected the inputs: assertion failed: [fare must not be negative.  ] "
                       "[Condition x >= 0 did not hold element-wise:] [x (fare:0) = ] [2 -3.5]\n"
                       "\t [[{{node assert_non_negative/assert_less_equal/Assert/AssertGuard/Assert}}]]")
    for runtime_text in ("Graph execution error", "Detected at node", "stack traces", "[Op:", 'File "'):
        assert runtime_text not in message, message


@pytest.mark.parametrize("length, kept", [(MAX_ERROR_CHARS, MAX_ERROR_CHARS), (MAX_ERROR_CHARS + 1, MAX_ERROR_CHARS)])
def test_a_long_message_is_cut_at_its_bound_and_says_how_much_was_left(length, kept):
    message = kernel_message(tf.errors.InvalidArgumentError(None, None, "x" * length))
    assert message[:kept] == "x" * kept
    assert message[kept:] == ("" if length == kept else "... (1 more characters)")
