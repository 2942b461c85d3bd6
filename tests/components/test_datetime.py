"""Date and timestamp columns: the Transform graph derives year, month, day of week and hour, and the shipped NumPy
and JavaScript preprocessing (the TFLite, ONNX and TF.js artifacts' step) give the same features bit for bit. The
expected values come from Python's own calendar (datetime), not from the code under test."""
import datetime
import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_transform.beam as tft_beam
from tensorflow_transform.tf_metadata import dataset_metadata, metadata_io, schema_utils

from components.exporter.preprocessing import build_spec, datetime_value, preprocess
from components.exporter.runtimes import node_executable
from components.features import FeatureLayout
from components.transform import preprocessing_fn
from settings.config import ConfigError, datetime_fields, load_config

CUSTOM_CONFIG = {
    "data": {"numeric_features": ["fare"],
             "datetime_features": {"when": "%Y-%m-%d %H:%M", "day": "%d/%m/%Y", "stamp": "%s"}},
    "label": {"name": "big", "column": "fare", "threshold": 10.0, "relative_to": "", "positive_value": ""},
    "transform": {"bucket_count": 2, "vocab_size": 100, "oov_buckets": 1},
}
FEATURE_SPEC = {
    "fare": tf.io.FixedLenFeature([1], tf.float32),
    "when": tf.io.VarLenFeature(tf.string),
    "day": tf.io.FixedLenFeature([1], tf.string),
    "stamp": tf.io.VarLenFeature(tf.int64),
}
# Each cell of `when` with the date and hour Python reads in it (None: missing).
WHEN = [
    ("2024-02-29 13:05", (2024, 2, 29, 13)),            # a leap day
    ("2000-02-29 23:59", (2000, 2, 29, 23)),            # divisible by 400: a leap year
    ("1900-02-29 10:00", None),                         # divisible by 100: no such day
    ("1900-03-01 00:00", (1900, 3, 1, 0)),
    ("2023-13-01 10:00", None),                         # no month 13
    ("2023-04-31 10:00", None),                         # April has 30 days
    ("2023-04-30", (2023, 4, 30, None)),                # a date without its time: the hour is missing
    ("2023-04-30 24:00", (2023, 4, 30, None)),          # no hour 24
    ("2021-12-31T07:30:00.123+05:30", (2021, 12, 31, 7)),  # more fields than the format names: ignored
    ("  2021-1-5 7:03 ", (2021, 1, 5, 7)),              # unpadded fields, blanks around
    (None, None),                                       # an empty cell
    ("junk", None),
    ("21-01-05 10:00", None),                           # a two-digit year
    ("20210-01-05 10:00", None),                        # a five-digit year
    ("2021-001-05 10:00", None),                        # a three-digit month
    ("1970-01-01 00:00", (1970, 1, 1, 0)),
    ("9999-12-31 23:00", (9999, 12, 31, 23)),
    ("0001-01-01 00:00", (1, 1, 1, 0)),
]
DAY = ["31/12/1999", "29/02/2020", "30/02/2020", "1/3/2021", "", "03/04/2005", "12/12/2012", "31/04/2001",
       "7/7/7777", "01/01/1970", "15/08/1947", "28/02/2100", "29/02/2100", "10/10/2010", "5/5/2055", "x/y/z",
       "11/11/1111", "02/01/2024"]
# Seconds since 1970 (None: an empty cell; negative: missing).
STAMP = [0, 86399, 86400, 951782400, 1709208000, -1, None, 4102444799, 253402300799, 1, 3600, 7 * 86400 - 1,
         1_000_000_000, 1_500_000_000, 2**31, 2**31 - 1, 1709251199, 60]
ROWS = [{"fare": [float(i)], "when": [] if when is None else [when.encode()], "day": [day.encode()],
         "stamp": [] if stamp is None else [stamp]}
        for i, ((when, _), day, stamp) in enumerate(zip(WHEN, DAY, STAMP, strict=True))]


def python_reading(cell: str | int | None, fmt: str) -> tuple[int, int, int, int | None] | None:
    """(year, month, day of week, hour) from Python's datetime, None when missing."""
    if cell is None or (isinstance(cell, int) and cell < 0):
        return None
    if fmt == "%s":
        moment = datetime.datetime.fromtimestamp(cell, datetime.timezone.utc)
        return moment.year, moment.month, moment.weekday(), moment.hour
    if fmt == "%d/%m/%Y":
        try:
            moment = datetime.datetime.strptime(cell, fmt)
        except ValueError:
            return None
        return moment.year, moment.month, moment.weekday(), None
    fields = dict(WHEN)[cell]
    if fields is None:
        return None
    year, month, day, hour = fields
    return year, month, datetime.date(year, month, day).weekday(), hour


def expected_features(column: str, cells: list, fmt: str) -> dict[str, list]:
    readings = [python_reading(cell, fmt) for cell in cells]
    years = np.array([r[0] for r in readings if r], dtype=np.float32)
    mean = np.float32(years.mean(dtype=np.float64))
    expected = {f"{column}_month_xf": [r[1] - 1 if r else 12 for r in readings],
                f"{column}_day_of_week_xf": [r[2] if r else 7 for r in readings],
                "years": [r[0] if r else None for r in readings], "mean": mean}
    if fmt != "%d/%m/%Y":
        expected[f"{column}_hour_xf"] = [r[3] if r and r[3] is not None else 24 for r in readings]
    return expected


CELLS = {"when": ("%Y-%m-%d %H:%M", [w for w, _ in WHEN]), "day": ("%d/%m/%Y", DAY), "stamp": ("%s", STAMP)}


@pytest.fixture(scope="module", params=[True, False], ids=["tf1_mode", "tf2_mode"])
def transform_run(tmp_path_factory, request):
    metadata = dataset_metadata.DatasetMetadata(schema_utils.schema_from_feature_spec(FEATURE_SPEC))
    output_dir = str(tmp_path_factory.mktemp("transform_output"))
    with tft_beam.Context(temp_dir=str(tmp_path_factory.mktemp("tft")), force_tf_compat_v1=request.param):
        (rows, _), transform_fn = (ROWS, metadata) | tft_beam.AnalyzeAndTransformDataset(
            lambda inputs: preprocessing_fn(inputs, CUSTOM_CONFIG)
        )
        _ = transform_fn | tft_beam.WriteTransformFn(output_dir)
    metadata_io.write_metadata(metadata, f"{output_dir}/metadata")
    transformed = {key: np.array([row[key] for row in rows]).ravel() for key in rows[0]}
    return transformed, build_spec(output_dir, FeatureLayout.from_properties(CUSTOM_CONFIG))


def same_as_the_graph(shipped: np.ndarray, graph: np.ndarray, name: str) -> None:
    """Ids exactly; z-scores within one unit in the last place: in TF1 mode the graph optimizer computes the division
    by the standard deviation, a constant by then, its own way (TF2 mode gives the same bits)."""
    if graph.dtype.kind == "f":
        np.testing.assert_array_max_ulp(shipped.astype(np.float32), graph.astype(np.float32), maxulp=1)
    else:
        np.testing.assert_array_equal(shipped, graph.astype(shipped.dtype), err_msg=name)


def request() -> dict[str, list]:
    """ROWS as a serving request: '' for a missing string, -1 for a missing integer."""
    return {"fare": [row["fare"][0] for row in ROWS], "when": [w or "" for w, _ in WHEN], "day": DAY,
            "stamp": [-1 if s is None else s for s in STAMP]}


@pytest.mark.parametrize("column", sorted(CELLS))
def test_the_transform_graph_reads_dates_as_pythons_calendar_does(transform_run, column):
    transformed, _ = transform_run
    fmt, cells = CELLS[column]
    expected = expected_features(column, cells, fmt)
    for name in [k for k in expected if k.endswith("_xf")]:
        assert transformed[name].tolist() == expected[name], name
    # The year is a number: z-scored over the training rows, a missing year filled with their mean.
    present = [y for y in expected["years"] if y is not None]
    std = np.float32(np.std(present) * math.sqrt(len(present) / len(cells)))
    years = np.array([expected["mean"] if y is None else y for y in expected["years"]], dtype=np.float32)
    np.testing.assert_allclose(transformed[f"{column}_year_xf"], (years - expected["mean"]) / std, rtol=1e-5,
                               atol=1e-5)
    assert sorted(k for k in transformed if k.startswith(column + "_")) == sorted(
        [f"{column}_year_xf"] + [k for k in expected if k.endswith("_xf")])


def test_the_shipped_numpy_preprocessing_equals_the_transform_graph(transform_run):
    transformed, spec = transform_run
    outputs = preprocess(spec, request())
    assert sorted(outputs) == sorted(k for k in transformed if k != "big")
    for name, values in outputs.items():
        assert values.shape == (len(ROWS), 1)
        same_as_the_graph(values.ravel(), transformed[name], name)


def test_the_shipped_javascript_preprocessing_equals_the_transform_graph(transform_run, tmp_path):
    transformed, spec = transform_run
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "request.json").write_text(json.dumps(request()))
    module = Path(__file__).parents[2] / "components" / "exporter" / "node" / "preprocessing.mjs"
    script = (f"import {{ preprocess }} from '{module}'; import {{ readFileSync }} from 'node:fs';"
              f"const read = (name) => JSON.parse(readFileSync('{tmp_path}/' + name, 'utf8'));"
              "const out = preprocess(read('spec.json'), read('request.json'));"
              "const arrays = Object.entries(out).map(([k, v]) => [k, Array.from(v.values)]);"
              "console.log(JSON.stringify(Object.fromEntries(arrays)));")
    result = subprocess.run([node_executable(), "--input-type=module", "-e", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    javascript = json.loads(result.stdout)
    assert sorted(javascript) == sorted(k for k in transformed if k != "big")
    for name, values in javascript.items():
        # JSON carries float32 values as their shortest decimal: read back as float32 they are the same bits.
        same_as_the_graph(np.array(values, dtype=transformed[name].dtype), transformed[name], name)


def test_the_spec_records_each_dates_fields_and_its_years_constants(transform_run):
    _, spec = transform_run
    by_name = {f["name"]: f for f in spec["features"]}
    assert by_name["when"]["fields"] == ["year", "month", "day", "hour", "minute"]
    assert by_name["stamp"]["fields"] == ["epoch"] and by_name["stamp"]["dtype"] == "int"
    assert set(by_name["day"]["parts"]) == {"year", "month", "day_of_week"}, "a date without %H has no hour"
    assert by_name["when"]["parts"]["hour"] == {"missing_id": 24}
    year = by_name["when"]["parts"]["year"]
    assert year["fill"] == year["mean"] and year["std"] > 0


@pytest.mark.parametrize("cell, reading", [
    ("2024-02-29 13:05", ((2024, 2, 3, 13), True)), ("2024-02-30 13:05", (None, False)),
    ("2024-02-28", ((2024, 2, 2, 0), False)), ("", (None, False)),
])
def test_one_cell_is_read_with_its_day_of_week_from_monday(cell, reading):
    assert datetime_value(cell, ["year", "month", "day", "hour"]) == reading


@pytest.mark.parametrize("fmt, message", [
    ("%Y%m%d", "must separate its fields with characters other than digits"),
    ("%Y-%m", "must name the year, the month and the day"),
    ("%Y-%m-%d %I:%M %p", "uses %I; a format is built from %Y, %m, %d, %H, %M, %S"),
    ("%Y-%m-%d %d", "names %d twice"),
    ("2000-%m-%d", "must separate its fields with characters other than digits"),
])
def test_a_format_the_graph_cannot_read_is_refused_with_what_to_write(fmt, message):
    with pytest.raises(ConfigError) as refused:
        datetime_fields(fmt, "data.datetime_features.when")
    assert str(refused.value).startswith(f"data.datetime_features.when '{fmt}' ") and message in str(refused.value)


def test_a_date_column_is_set_from_the_command_line_and_its_derived_names_must_be_free():
    # A value starting with % is no YAML: the override takes it as the text typed.
    config = load_config(None, ["data.datetime_features.pickup=%Y-%m-%d %H:%M"])
    assert config.data.datetime_features == {"pickup": "%Y-%m-%d %H:%M"} and "pickup" in config.features
    with pytest.raises(ConfigError, match="data.datetime_features.trip_start derives the feature 'trip_start_month', "
                                          "which is also listed in data.category_features; rename or remove"):
        load_config(None, ["data.datetime_features={trip_start: '%Y-%m-%d %H:%M'}"])
    with pytest.raises(ConfigError, match="data.datetime_features.dropoff '%d.%m' must name the year"):
        load_config(None, ["data.datetime_features.dropoff=%d.%m"])
    with pytest.raises(ConfigError, match="config key 'data.datetime_features.dropoff' must be a string, got 3"):
        load_config(None, ["data.datetime_features.dropoff=3"])
