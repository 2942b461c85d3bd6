"""The shipped preprocessing (components/exporter/preprocessing.py) on a taxi-like spec, value by value: missing values,
bucket boundaries, unseen and missing vocabulary entries, and bad requests. test_transform.py checks the same code
bit for bit against a real Transform graph; these tests pin each decision without running TF Transform."""
import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

from components.exporter.preprocessing import SPEC_VERSION, RequestError, load_spec, preprocess, save_spec
from components.exporter.runtimes import node_executable

SPEC = {
    "version": SPEC_VERSION,
    "output_suffix": "_xf",
    "features": [
        {"name": "fare", "kind": "numeric", "dtype": "float", "optional": False, "fill": 11.5, "mean": 12.0,
         "std": 4.0},
        {"name": "trip_seconds", "kind": "numeric", "dtype": "int", "optional": True, "fill": 700.0, "mean": 600.0,
         "std": 200.0},
        {"name": "trip_start_hour", "kind": "numeric", "dtype": "int", "optional": False, "fill": 13.0,
         "mean": 1.0, "std": 2.0},
        # Coordinates vary by hundredths of a degree: a standard deviation below 1 still divides.
        {"name": "dropoff_latitude", "kind": "numeric", "dtype": "float", "optional": True, "fill": 41.9,
         "mean": 41.9, "std": 0.05},
        # A constant column: standard deviation 0, so it is only centred.
        {"name": "fixed_rate", "kind": "numeric", "dtype": "float", "optional": True, "fill": 3.0, "mean": 3.0,
         "std": 0.0},
        {"name": "pickup_latitude", "kind": "bucket", "dtype": "float", "optional": True,
         "boundaries": [41.87, 41.89, 41.92], "missing_id": 4},
        {"name": "trip_start_day", "kind": "bucket", "dtype": "int", "optional": False, "boundaries": [0.0, 3.0],
         "missing_id": 3},
        {"name": "payment_type", "kind": "vocab", "dtype": "string", "optional": True,
         "vocabulary": ["Credit Card", "Cash", "No Charge"], "oov_id": 3},
        {"name": "pickup_community_area", "kind": "vocab", "dtype": "int", "optional": True,
         "vocabulary": ["8", "32", "-1"], "oov_id": 3},
        {"name": "trip_start_month", "kind": "vocab", "dtype": "int", "optional": False,
         "vocabulary": ["6", "-1"], "oov_id": 2},
        {"name": "dropoff_community_area", "kind": "category", "dtype": "int", "optional": True, "max_id": 77,
         "oov_id": 78},
        {"name": "trip_start_weekday", "kind": "category", "dtype": "int", "optional": False, "max_id": 7,
         "oov_id": 8},
    ],
}
ROW = {"fare": [12.0], "trip_seconds": [600], "trip_start_hour": [1], "dropoff_latitude": [41.9], "fixed_rate": [3.0],
       "pickup_latitude": [41.88], "trip_start_day": [1], "payment_type": ["Cash"], "pickup_community_area": [8],
       "trip_start_month": [6], "dropoff_community_area": [8], "trip_start_weekday": [3]}


def one(**changes):
    """The transformed features of ROW with `changes`, as plain scalars."""
    out = preprocess(SPEC, {**ROW, **{k: [v] for k, v in changes.items()}})
    return {name: values.item() for name, values in out.items()}


def test_outputs_are_named_typed_and_shaped_for_the_converted_models():
    out = preprocess(SPEC, {k: v * 3 for k, v in ROW.items()})
    assert sorted(out) == sorted(f"{f['name']}_xf" for f in SPEC["features"])
    for feature in SPEC["features"]:
        values = out[f"{feature['name']}_xf"]
        assert values.shape == (3, 1)
        assert values.dtype == (np.float32 if feature["kind"] == "numeric" else np.int32)


def test_numeric_features_are_z_scored_in_float32():
    out = one(fare=20.0, trip_seconds=1000, trip_start_hour=5)
    assert out["fare_xf"] == (np.float32(20.0) - np.float32(12.0)) / np.float32(4.0) == 2.0
    assert out["trip_seconds_xf"] == 2.0 and out["trip_start_hour_xf"] == 2.0
    assert one(fare=12.1)["fare_xf"] == (np.float32(12.1) - np.float32(12.0)) / np.float32(4.0)


@pytest.mark.parametrize("missing", [math.nan, None])
def test_a_missing_float_gets_the_fill_value(missing):
    assert one(fare=missing)["fare_xf"] == (11.5 - 12.0) / 4.0


def test_minus_one_is_missing_only_for_optional_integer_features():
    assert one(trip_seconds=-1)["trip_seconds_xf"] == (700.0 - 600.0) / 200.0
    assert one(trip_seconds=None)["trip_seconds_xf"] == (700.0 - 600.0) / 200.0
    # trip_start_hour is required: -1 is a value like any other.
    assert one(trip_start_hour=-1)["trip_start_hour_xf"] == (-1.0 - 1.0) / 2.0


def test_a_standard_deviation_below_one_still_scales():
    assert one(dropoff_latitude=42.0)["dropoff_latitude_xf"] == (np.float32(42.0) - np.float32(41.9)) / np.float32(0.05)


def test_a_constant_feature_is_only_centred():
    assert one(fixed_rate=5.0)["fixed_rate_xf"] == 2.0
    assert one(fixed_rate=math.nan)["fixed_rate_xf"] == 0.0


@pytest.mark.parametrize("latitude, bucket", [
    (41.80, 0), (np.nextafter(np.float32(41.87), np.float32(0)), 0), (41.87, 1), (41.8901, 2), (41.92, 3),
    (42.10, 3), (math.nan, 4), (None, 4),
])
def test_bucket_boundaries_belong_to_the_bucket_above_and_missing_gets_its_own(latitude, bucket):
    assert one(pickup_latitude=latitude)["pickup_latitude_xf"] == bucket


def test_integer_bucket_values_are_compared_in_float32_like_the_transform_graph():
    # 2**26 + 7 is below the boundary 2**26 + 8, but float32 rounds it onto the boundary, as tf.cast does.
    spec = {**SPEC, "features": [{"name": "tract", "kind": "bucket", "dtype": "int", "optional": False,
                                  "boundaries": [2.0**26 + 8], "missing_id": 2}]}
    assert preprocess(spec, {"tract": [2**26 + 7, 2**26 - 8]})["tract_xf"].ravel().tolist() == [1, 0]


def test_an_integer_bucket_feature_that_is_required_keeps_minus_one():
    assert one(trip_start_day=-1)["trip_start_day_xf"] == 0
    assert one(trip_start_day=0)["trip_start_day_xf"] == 1
    assert one(trip_start_day=3)["trip_start_day_xf"] == 2


@pytest.mark.parametrize("payment, token_id", [
    ("Credit Card", 0), ("Cash", 1), ("No Charge", 2), ("Bitcoin", 3), ("cash", 3), ("", 3), (None, 3),
    (b"Cash", 1),
])
def test_vocabulary_ids_with_one_id_for_unseen_and_missing_strings(payment, token_id):
    assert one(payment_type=payment)["payment_type_xf"] == token_id


def test_a_missing_string_is_unseen_even_when_the_vocabulary_holds_the_text_none():
    spec = {**SPEC, "features": [{"name": "company", "kind": "vocab", "dtype": "string", "optional": True,
                                  "vocabulary": ["Flash Cab", "None"], "oov_id": 2}]}
    assert preprocess(spec, {"company": [None, "None", "", "Flash Cab"]})["company_xf"].ravel().tolist() == [2, 1, 2, 0]


def test_integer_vocabularies_match_the_text_of_the_value():
    assert one(pickup_community_area=32)["pickup_community_area_xf"] == 1
    assert one(pickup_community_area=77)["pickup_community_area_xf"] == 3
    # Optional: -1 means missing, which vocabularies leave out, even where "-1" happens to be listed.
    assert one(pickup_community_area=-1)["pickup_community_area_xf"] == 3
    assert one(pickup_community_area=None)["pickup_community_area_xf"] == 3
    # Required: -1 is the value "-1".
    assert one(trip_start_month=-1)["trip_start_month_xf"] == 1
    assert one(trip_start_month=7)["trip_start_month_xf"] == 2


@pytest.mark.parametrize("area, area_id", [
    (0, 0), (1, 1), (77, 77), (78, 78), (79, 78), (-1, 78), (None, 78), (-5, 78), (2**31 + 3, 78), (2**40, 78),
])
def test_category_values_are_their_ids_and_everything_else_the_out_of_range_id(area, area_id):
    assert one(dropoff_community_area=area)["dropoff_community_area_xf"] == area_id


@pytest.mark.parametrize("weekday, weekday_id", [(0, 0), (7, 7), (8, 8), (9, 8), (-1, 8), (None, 8)])
def test_a_required_category_treats_minus_one_and_none_as_out_of_range_too(weekday, weekday_id):
    assert one(trip_start_weekday=weekday)["trip_start_weekday_xf"] == weekday_id


def test_javascript_maps_categories_at_the_edges_like_python(tmp_path):
    areas = [0, 77, 78, -1, None, 2**40]
    columns = {k: v * len(areas) for k, v in ROW.items()}
    columns.update(dropoff_community_area=areas, trip_start_weekday=[0, 7, 8, -1, None, -2**40])
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    (tmp_path / "request.json").write_text(json.dumps(columns))
    module = Path(__file__).parents[2] / "components" / "exporter" / "node" / "preprocessing.mjs"
    script = (f"import {{ preprocess }} from '{module}'; import {{ readFileSync }} from 'node:fs';"
              f"const read = (name) => JSON.parse(readFileSync('{tmp_path}/' + name, 'utf8'));"
              "const out = preprocess(read('spec.json'), read('request.json'));"
              "const arrays = Object.entries(out).map(([k, v]) => [k, Array.from(v.values)]);"
              "console.log(JSON.stringify(Object.fromEntries(arrays)));")
    result = subprocess.run([node_executable(), "--input-type=module", "-e", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    javascript, python = json.loads(result.stdout), preprocess(SPEC, columns)
    assert javascript["dropoff_community_area_xf"] == [0, 77, 78, 78, 78, 78]
    assert javascript["trip_start_weekday_xf"] == [0, 7, 8, 8, 8, 8]
    for name in ("dropoff_community_area_xf", "trip_start_weekday_xf"):
        assert python[name].ravel().tolist() == javascript[name], name


def test_a_request_without_a_feature_is_refused():
    request = dict(ROW)
    del request["trip_start_hour"]
    with pytest.raises(RequestError) as error:
        preprocess(SPEC, request)
    assert str(error.value) == "the request lacks feature 'trip_start_hour'; send one value per row (int)."


@pytest.mark.parametrize("feature, value, dtype", [
    ("fare", "ten", "float"), ("trip_seconds", "long", "int"), ("trip_seconds", 2**70, "int"),
])
def test_a_value_of_the_wrong_type_is_refused(feature, value, dtype):
    with pytest.raises(RequestError) as error:
        preprocess(SPEC, {**ROW, feature: [value]})
    assert str(error.value).startswith(f"feature '{feature}' must hold {dtype} values: ")


def test_every_feature_needs_one_value_per_row():
    with pytest.raises(RequestError) as error:
        preprocess(SPEC, {**ROW, "payment_type": ["Cash", "Cash"]})
    assert str(error.value) == ("feature 'payment_type' has 2 values, others 1; send one value per row for every "
                                "feature.")


def test_spec_round_trips_and_refuses_another_version(tmp_path):
    path = tmp_path / "preprocessing.json"
    save_spec(SPEC, str(path))
    assert load_spec(str(path)) == SPEC
    path.write_text('{"version": 2, "features": []}')
    with pytest.raises(ValueError) as error:
        load_spec(str(path))
    assert str(error.value) == f"{path} is preprocessing spec version 2; this code reads version {SPEC_VERSION}."
