"""preprocessing_fn on a handful of rows through TFT's Beam implementation, against expected outputs."""
import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_transform.beam as tft_beam
from tensorflow_transform.tf_metadata import dataset_metadata, schema_utils

from components.transform import preprocessing_fn

CUSTOM_CONFIG = {
    "features": {"numeric": ["fare", "trip_miles"], "bucket": ["lat"], "vocab": ["payment_type", "hour"]},
    "label": {"name": "big_tipper", "column": "tips", "threshold": 0.2, "relative_to": "fare", "positive_value": ""},
    "transform": {"bucket_count": 2, "vocab_size": 100, "oov_buckets": 1},
}
FEATURE_SPEC = {
    "fare": tf.io.FixedLenFeature([1], tf.float32),
    "trip_miles": tf.io.VarLenFeature(tf.float32),
    "lat": tf.io.VarLenFeature(tf.float32),
    "payment_type": tf.io.VarLenFeature(tf.string),
    "hour": tf.io.FixedLenFeature([1], tf.int64),
    "tips": tf.io.FixedLenFeature([1], tf.float32),
}
ROWS = [
    {"fare": [10.0], "trip_miles": [1.0], "lat": [41.8], "payment_type": [b"Cash"], "hour": [1], "tips": [3.0]},
    {"fare": [20.0], "trip_miles": [], "lat": [41.9], "payment_type": [b"Cash"], "hour": [1], "tips": [1.0]},
    {"fare": [30.0], "trip_miles": [3.0], "lat": [], "payment_type": [b"Credit Card"], "hour": [2], "tips": [10.0]},
    {"fare": [40.0], "trip_miles": [], "lat": [42.0], "payment_type": [], "hour": [3], "tips": [0.0]},
    {"fare": [50.0], "trip_miles": [5.0], "lat": [41.7], "payment_type": [b"Cash"], "hour": [1], "tips": [11.0]},
    {"fare": [60.0], "trip_miles": [], "lat": [], "payment_type": [b"Credit Card"], "hour": [2], "tips": [12.0]},
]


@pytest.fixture(scope="module")
def transformed(tmp_path_factory):
    metadata = dataset_metadata.DatasetMetadata(schema_utils.schema_from_feature_spec(FEATURE_SPEC))
    with tft_beam.Context(temp_dir=str(tmp_path_factory.mktemp("tft")), force_tf_compat_v1=False):
        (rows, _), _ = (ROWS, metadata) | tft_beam.AnalyzeAndTransformDataset(
            lambda inputs: preprocessing_fn(inputs, CUSTOM_CONFIG)
        )
    return {key: np.array([row[key] for row in rows]) for key in rows[0]}


def test_outputs(transformed):
    assert sorted(transformed) == sorted(
        ["fare_xf", "trip_miles_xf", "lat_xf", "payment_type_xf", "hour_xf", "big_tipper"]
    )


def test_numeric_is_z_scored(transformed):
    fares = np.array([10, 20, 30, 40, 50, 60], dtype=np.float64)
    expected = (fares - fares.mean()) / fares.std()
    np.testing.assert_allclose(transformed["fare_xf"], expected, rtol=1e-5)


def test_missing_numeric_is_filled_with_the_mean(transformed):
    # Present values 1, 3, 5 (mean 3); filled: 1 3 3 3 5 3 -> mean 3, std sqrt(8/6).
    std = math.sqrt(8 / 6)
    np.testing.assert_allclose(transformed["trip_miles_xf"], [-2 / std, 0, 0, 0, 2 / std, 0], rtol=1e-5, atol=1e-6)


def test_coordinates_are_bucketized_with_a_bucket_for_missing(transformed):
    buckets = transformed["lat_xf"]
    assert buckets[2] == 2 and buckets[5] == 2
    present = buckets[[0, 1, 3, 4]]
    assert set(present) <= {0, 1}
    # Ordered by value: 41.7 <= 41.8 <= 41.9 <= 42.0, and both buckets are used.
    assert buckets[4] <= buckets[0] <= buckets[1] <= buckets[3]
    assert buckets[4] == 0 and buckets[3] == 1


def test_vocabulary_by_frequency_with_missing_as_a_token(transformed):
    # Cash x3 -> 0, Credit Card x2 -> 1, '' (missing) x1 -> 2.
    np.testing.assert_array_equal(transformed["payment_type_xf"], [0, 0, 1, 2, 0, 1])
    # Integer ids get a vocabulary too: '1' x3 -> 0, '2' x2 -> 1, '3' x1 -> 2.
    np.testing.assert_array_equal(transformed["hour_xf"], [0, 0, 1, 2, 0, 1])


def test_label_is_big_tipper(transformed):
    # tips > 0.2 * fare: 3>2, 1>4, 10>6, 0>8, 11>10, 12>12.
    np.testing.assert_array_equal(transformed["big_tipper"], [1, 0, 1, 0, 1, 0])
