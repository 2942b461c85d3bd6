"""preprocessing_fn on a handful of rows through TFT's Beam implementation, against expected outputs."""
import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_transform.beam as tft_beam
from tensorflow_transform.tf_metadata import dataset_metadata, metadata_io, schema_utils

from components.exporter.preprocessing import RequestError, build_spec, preprocess
from components.features import FeatureLayout
from components.transform import preprocessing_fn

CUSTOM_CONFIG = {
    "data": {"numeric_features": ["fare", "trip_miles"], "bucket_features": ["lat"],
             "vocab_features": ["payment_type", "hour"], "category_features": ["area", "day"]},
    "label": {"name": "big_tipper", "column": "tips", "threshold": 0.2, "relative_to": "fare", "positive_value": ""},
    "transform": {"bucket_count": 2, "vocab_size": 100, "oov_buckets": 1},
}
FEATURE_SPEC = {
    "fare": tf.io.FixedLenFeature([1], tf.float32),
    "trip_miles": tf.io.VarLenFeature(tf.float32),
    "lat": tf.io.VarLenFeature(tf.float32),
    "payment_type": tf.io.VarLenFeature(tf.string),
    "hour": tf.io.FixedLenFeature([1], tf.int64),
    "area": tf.io.VarLenFeature(tf.int64),
    "day": tf.io.FixedLenFeature([1], tf.int64),
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
# Integer categories: area (optional) reaches 5 on these rows, with a missing and a negative value; day 7.
for row, area, day in zip(ROWS, [[3], [0], [], [5], [-2], [1]], [1, 7, 2, 7, 3, 1], strict=True):
    row.update(area=area, day=[day])


# Both of TF Transform's graph modes (transform.tf_compat_v1): the pipeline's default TF1 mode and TF2 mode.
@pytest.fixture(scope="module", params=[True, False], ids=["tf1_mode", "tf2_mode"])
def transform_run(tmp_path_factory, request):
    """The transformed rows, and the folder of the transform output as the Transform component writes it."""
    metadata = dataset_metadata.DatasetMetadata(schema_utils.schema_from_feature_spec(FEATURE_SPEC))
    output_dir = str(tmp_path_factory.mktemp("transform_output"))
    with tft_beam.Context(temp_dir=str(tmp_path_factory.mktemp("tft")), force_tf_compat_v1=request.param):
        (rows, _), transform_fn = (ROWS, metadata) | tft_beam.AnalyzeAndTransformDataset(
            lambda inputs: preprocessing_fn(inputs, CUSTOM_CONFIG)
        )
        _ = transform_fn | tft_beam.WriteTransformFn(output_dir)
    metadata_io.write_metadata(metadata, f"{output_dir}/metadata")
    return {key: np.array([row[key] for row in rows]) for key in rows[0]}, output_dir


@pytest.fixture(scope="module")
def transformed(transform_run):
    return transform_run[0]


@pytest.fixture(scope="module")
def spec(transform_run):
    return build_spec(transform_run[1], FeatureLayout.from_properties(CUSTOM_CONFIG))


def request_columns(rows):
    """ROWS as a serving request: NaN for a missing float, '' for a missing string."""
    def value(row, key, missing):
        return row[key][0] if row[key] else missing

    return {
        "fare": [value(r, "fare", math.nan) for r in rows],
        "trip_miles": [value(r, "trip_miles", math.nan) for r in rows],
        "lat": [value(r, "lat", None) for r in rows],
        "payment_type": [value(r, "payment_type", "") for r in rows],
        "hour": [value(r, "hour", -1) for r in rows],
        "area": [value(r, "area", -1) for r in rows],
        "day": [value(r, "day", -1) for r in rows],
    }


def test_outputs(transformed):
    assert sorted(transformed) == sorted(
        ["fare_xf", "trip_miles_xf", "lat_xf", "payment_type_xf", "hour_xf", "area_xf", "day_xf", "big_tipper"]
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
    # Cash x3 -> 0, Credit Card x2 -> 1, '' (missing) -> 2, the OOV id: vocabularies leave '' out.
    np.testing.assert_array_equal(transformed["payment_type_xf"], [0, 0, 1, 2, 0, 1])
    # Integer ids get a vocabulary too: '1' x3 -> 0, '2' x2 -> 1, '3' x1 -> 2.
    np.testing.assert_array_equal(transformed["hour_xf"], [0, 0, 1, 2, 0, 1])


def test_integer_categories_are_their_own_ids_up_to_the_training_maximum(transformed):
    # area: 0 to 5 as they are; the missing value and -2 get 6, the one out-of-range id. day: 0 to 7, 8 for others.
    np.testing.assert_array_equal(transformed["area_xf"], [3, 0, 6, 5, 6, 1])
    np.testing.assert_array_equal(transformed["day_xf"], [1, 7, 2, 7, 3, 1])


# Raw rows after training, at the edges of the id range: 0, the training maximum, one above it, -1, missing (None:
# area is optional, so a request sends -1 for it), and a value beyond int32 that must not wrap around.
EDGES = {"area": [0, 5, 6, -1, None, 2**40], "day": [0, 7, 8, -1, -5, 2**40]}
EDGE_IDS = {"area_xf": [0, 5, 6, 6, 6, 6], "day_xf": [0, 7, 8, 8, 8, 8]}


def edge_request():
    columns = request_columns(ROWS[:1] * len(EDGES["area"]))
    return {**columns, "area": [-1 if v is None else v for v in EDGES["area"]], "day": EDGES["day"]}


def test_the_transform_graph_maps_category_edges_to_the_out_of_range_id(transform_run):
    import tensorflow_transform as tft

    from components.model import raw_tensors_to_parsed

    tft_output = tft.TFTransformOutput(transform_run[1])
    dtypes = {key: spec.dtype for key, spec in FEATURE_SPEC.items()}
    request = {**edge_request(), "tips": [1.0] * len(EDGES["area"])}
    tensors = {key: tf.constant([math.nan if v is None else v for v in values], dtypes[key])
               for key, values in request.items()}
    outputs = tft_output.transform_features_layer()(raw_tensors_to_parsed(tensors, tft_output))
    for name, ids in EDGE_IDS.items():
        assert outputs[name].numpy().ravel().tolist() == ids, name


def test_shipped_preprocessing_maps_category_edges_like_the_transform_graph(spec):
    by_name = {f["name"]: f for f in spec["features"]}
    assert by_name["area"] == {"name": "area", "kind": "category", "dtype": "int", "optional": True, "max_id": 5,
                               "oov_id": 6}
    assert by_name["day"]["optional"] is False and (by_name["day"]["max_id"], by_name["day"]["oov_id"]) == (7, 8)
    outputs = preprocess(spec, {**edge_request(), "area": EDGES["area"]})
    for name, ids in EDGE_IDS.items():
        assert outputs[name].ravel().tolist() == ids, name


def test_label_is_big_tipper(transformed):
    # tips > 0.2 * fare: 3>2, 1>4, 10>6, 0>8, 11>10, 12>12.
    np.testing.assert_array_equal(transformed["big_tipper"], [1, 0, 1, 0, 1, 0])


def test_shipped_preprocessing_equals_the_transform_graph(transformed, spec):
    outputs = preprocess(spec, request_columns(ROWS))
    assert sorted(outputs) == sorted(k for k in transformed if k != "big_tipper")
    for name, values in outputs.items():
        assert values.shape == (len(ROWS), 1)
        # Bit for bit: the same float32 operations on the same constants.
        np.testing.assert_array_equal(values.ravel(), transformed[name].astype(values.dtype), err_msg=name)


def test_preprocessing_spec_holds_the_analyzer_results(spec):
    by_name = {f["name"]: f for f in spec["features"]}
    fare = by_name["fare"]
    assert fare["fill"] == pytest.approx(35.0) and fare["mean"] == pytest.approx(35.0)
    assert fare["std"] == pytest.approx(np.std([10, 20, 30, 40, 50, 60]), rel=1e-6)
    # TF Transform leaves '' (missing) out of vocabularies: it gets the OOV id.
    assert by_name["payment_type"]["vocabulary"] == ["Cash", "Credit Card"]
    assert by_name["hour"]["vocabulary"] == ["1", "2", "3"] and by_name["hour"]["oov_id"] == 3
    assert by_name["lat"]["missing_id"] == 2 and len(by_name["lat"]["boundaries"]) == 1


def test_unseen_values_boundaries_and_missing(spec):
    boundary = spec["features"][2]["boundaries"][0]
    columns = {"fare": [None], "trip_miles": [1.0], "lat": [boundary], "payment_type": ["Bitcoin"], "hour": [23],
               "area": [9], "day": [4]}
    outputs = preprocess(spec, columns)
    assert outputs["fare_xf"][0, 0] == 0.0  # missing -> the mean -> 0
    assert outputs["lat_xf"][0, 0] == 1  # a value on a boundary belongs to the bucket above it
    assert outputs["payment_type_xf"][0, 0] == 2 and outputs["hour_xf"][0, 0] == 3  # the one OOV id
    assert outputs["area_xf"][0, 0] == 6 and outputs["day_xf"][0, 0] == 4


def test_preprocessing_rejects_a_bad_request(spec):
    columns = request_columns(ROWS)
    del columns["hour"]
    with pytest.raises(RequestError, match="lacks feature 'hour'"):
        preprocess(spec, columns)
    with pytest.raises(RequestError, match="'fare' must hold float"):
        preprocess(spec, {**request_columns(ROWS), "fare": ["ten"] * len(ROWS)})


def transform_with_label(tmp_path_factory, label: dict) -> tuple[dict[str, np.ndarray], str]:
    """ROWS through preprocessing_fn with `label` as the label section and fare, lat as the only features."""
    config = {**CUSTOM_CONFIG, "label": {"name": "target", "threshold": 0.5, "relative_to": "", "positive_value": "",
                                         **label},
              "data": {"numeric_features": ["fare"], "bucket_features": ["lat"], "vocab_features": []}}
    metadata = dataset_metadata.DatasetMetadata(schema_utils.schema_from_feature_spec(FEATURE_SPEC))
    output_dir = str(tmp_path_factory.mktemp("transform_output"))
    with tft_beam.Context(temp_dir=str(tmp_path_factory.mktemp("tft")), force_tf_compat_v1=False):
        (rows, _), transform_fn = (ROWS, metadata) | tft_beam.AnalyzeAndTransformDataset(
            lambda inputs: preprocessing_fn(inputs, config)
        )
        _ = transform_fn | tft_beam.WriteTransformFn(output_dir)
    metadata_io.write_metadata(metadata, f"{output_dir}/metadata")
    return {key: np.array([row[key] for row in rows]) for key in rows[0]}, output_dir


def test_a_multiclass_label_is_a_class_id_and_a_missing_label_is_no_class(tmp_path_factory):
    import tensorflow_transform as tft

    from components.tasks import task_from_transform
    from settings.config import LabelConfig

    rows, output_dir = transform_with_label(tmp_path_factory, {"kind": "multiclass", "column": "payment_type"})
    task = task_from_transform(LabelConfig(kind="multiclass", column="payment_type"), tft.TFTransformOutput(output_dir))
    # The classes are the values seen, never the empty marker of the row without one.
    assert sorted(task.classes) == ["Cash", "Credit Card"] and task.units == 2
    names = [task.classes[i] if i >= 0 else None for i in rows["target"]]
    assert names == ["Cash", "Cash", "Credit Card", None, "Cash", "Credit Card"]
    assert build_spec(output_dir, FeatureLayout.from_properties({**CUSTOM_CONFIG, "label": {
        "kind": "multiclass", "name": "target", "column": "payment_type"}, "data": {
        "numeric_features": ["fare"], "bucket_features": ["lat"], "vocab_features": []}}))["task"] == {
        "kind": "multiclass", "output": "probabilities", "classes": list(task.classes)}


def test_a_regression_label_is_the_number_and_its_mean_and_std_are_recorded(tmp_path_factory):
    import tensorflow_transform as tft

    from components.tasks import task_from_transform
    from settings.config import LabelConfig

    rows, output_dir = transform_with_label(tmp_path_factory, {"kind": "regression", "column": "tips"})
    tips = np.array([row["tips"][0] for row in ROWS])
    np.testing.assert_allclose(rows["target"], tips)
    task = task_from_transform(LabelConfig(kind="regression", column="tips"), tft.TFTransformOutput(output_dir))
    assert task.kind == "regression" and task.output_name == "value"
    assert task.label_mean == pytest.approx(tips.mean(), rel=1e-6)
    assert task.label_std == pytest.approx(tips.std(), rel=1e-5)


def constants_with_batches(tmp_path_factory, rows: list[dict], batch_size: int) -> dict[str, list[float]]:
    """The recorded constants of a regression run on `rows` when TF Transform analyses them `batch_size` at a time."""
    import tensorflow_transform as tft

    from components.transform import read_constants

    config = {**CUSTOM_CONFIG, "label": {"name": "target", "kind": "regression", "column": "tips", "threshold": 0.5,
                                         "relative_to": "", "positive_value": ""},
              "data": {"numeric_features": ["fare", "trip_miles"], "bucket_features": [], "vocab_features": []}}
    spec = {key: FEATURE_SPEC[key] for key in ("fare", "trip_miles", "tips")}
    metadata = dataset_metadata.DatasetMetadata(schema_utils.schema_from_feature_spec(spec))
    output_dir = str(tmp_path_factory.mktemp("transform_output"))
    with tft_beam.Context(temp_dir=str(tmp_path_factory.mktemp("tft")), desired_batch_size=batch_size,
                          force_tf_compat_v1=False):
        transform_fn = (rows, metadata) | tft_beam.AnalyzeDataset(lambda inputs: preprocessing_fn(inputs, config))
        _ = transform_fn | tft_beam.WriteTransformFn(output_dir)
    return read_constants(tft.TFTransformOutput(output_dir))


def test_the_constants_do_not_depend_on_how_rows_are_batched(tmp_path_factory):
    """Beam sizes TF Transform's batches by timing: a re-run of the same data must still make the same model bytes,
    so each mean and deviation is the float64 figure rounded once to float32, whatever the batches."""
    generator = np.random.default_rng(7)
    # House prices: a mean far from zero, where float32 sums lose the last bits first.
    prices = generator.normal(591_525.0, 166_142.5, 300).astype(np.float32)
    fares = generator.uniform(3.0, 90.0, 300).astype(np.float32)
    rows = [{"fare": [fare], "trip_miles": [] if i % 4 == 0 else [fare / 3], "tips": [price]}
            for i, (fare, price) in enumerate(zip(fares, prices, strict=True))]
    by_batch = [constants_with_batches(tmp_path_factory, rows, size) for size in (7, 64, 300)]
    assert by_batch[0] == by_batch[1] == by_batch[2]
    prices64, miles64 = prices.astype(np.float64), np.array([r["trip_miles"][0] for r in rows if r["trip_miles"]])
    constants = by_batch[0]
    assert constants["__label__"] == [np.float32(prices64.mean()), np.float32(prices64.std())]
    assert constants["trip_miles"] == [np.float32(miles64.mean())] * 2 + [np.float32(miles64.std() * math.sqrt(0.75))]
