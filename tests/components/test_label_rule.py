"""The label rule's two forms (components/label_rule.py) agree: compute_label in TensorFlow, as Transform runs it,
and label_class in Python over the tf.Example, as ExampleGen runs it, give every row the same class."""
import pytest
import tensorflow as tf

from components.label_rule import class_texts, compute_label, label_class
from settings.config import LabelConfig

TAXI_LABEL = LabelConfig(kind="binary", column="tips", threshold=0.2, relative_to="fare")


def example(**values) -> tf.train.Example:
    """A tf.Example as ExampleGen writes it: None is a missing cell (the feature present, with no value)."""
    row = tf.train.Example()
    for name, value in values.items():
        feature = row.features.feature[name]
        if isinstance(value, str):
            feature.bytes_list.value.append(value.encode())
        elif isinstance(value, int):
            feature.int64_list.value.append(value)
        elif isinstance(value, float):
            feature.float_list.value.append(value)
        else:
            feature.float_list.SetInParent()
    return row


def column(values: list, dtype: tf.DType) -> tf.SparseTensor:
    """One column as Transform gets it: a [batch, 1] SparseTensor with no entry for a missing cell."""
    kept = [(row, value) for row, value in enumerate(values) if value is not None]
    return tf.SparseTensor([[row, 0] for row, _ in kept] or tf.zeros([0, 2], tf.int64),
                           tf.constant([value for _, value in kept], dtype), [len(values), 1])


def test_a_threshold_relative_to_another_column_on_edge_rows():
    # (tips, fare): above and at the boundary, zero fares, missing cells, integer cells, a float32 rounding edge.
    rows = [(2.01, 10.0), (2.0, 10.0), (0.0, 0.0), (0.1, 0.0), (None, 5.0), (3.0, None), (7, 10), (0.30000001, 1.5)]
    in_python = [label_class(example(tips=tips, fare=fare), TAXI_LABEL) for tips, fare in rows]
    in_tensorflow = compute_label({"tips": column([None if t is None else float(t) for t, _ in rows], tf.float32),
                                   "fare": column([None if f is None else float(f) for _, f in rows], tf.float32)},
                                  TAXI_LABEL).numpy().tolist()
    assert in_python == [str(value) for value in in_tensorflow]
    assert in_python == ["1", "0", "0", "1", "0", "0", "1", "0"], "0.30000001 > 0.2 * 1.5 in float64, not in float32"
    assert label_class(example(fare=3.0), TAXI_LABEL) == "0", "a row without the label column is negative"


@pytest.mark.parametrize("threshold", [0.5, 2.0])
def test_a_plain_threshold_just_inside_and_outside(threshold):
    label = LabelConfig(kind="binary", column="score", threshold=threshold)
    values = [threshold - 1e-3, threshold, threshold + 1e-3, None]
    in_python = [label_class(example(score=value), label) for value in values]
    in_tensorflow = compute_label({"score": column(values, tf.float32)}, label).numpy().tolist()
    assert in_python == [str(value) for value in in_tensorflow] == ["0", "0", "1", "0"]


def test_a_positive_value_of_a_string_column():
    label = LabelConfig(kind="binary", column="payment", positive_value="Card")
    values = ["Card", "Cash", "card", None]
    in_python = [label_class(example(payment=value), label) for value in values]
    in_tensorflow = compute_label({"payment": column(values, tf.string)}, label).numpy().tolist()
    assert in_python == [str(value) for value in in_tensorflow] == ["1", "0", "0", "0"]


def test_a_multiclass_label_is_the_columns_text():
    label = LabelConfig(kind="multiclass", column="species")
    texts = ["setosa", "virginica", None]
    in_python = [label_class(example(species=value), label) for value in texts]
    text, present = class_texts(column(texts, tf.string))
    assert in_python == [t.decode() if p else "" for t, p in zip(text.numpy(), present.numpy(), strict=True)]
    assert in_python == ["setosa", "virginica", ""]
    ids = [2, 7]
    in_python = [label_class(example(species=value), label) for value in ids]
    text, _ = class_texts(column(ids, tf.int64))
    assert in_python == [t.decode() for t in text.numpy()] == ["2", "7"]
