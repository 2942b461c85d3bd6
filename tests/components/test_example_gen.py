"""ExampleGen with data.missing_values: markers become empty cells before the CSV is typed and encoded."""
import apache_beam as beam
import tensorflow as tf
from google.protobuf import json_format
from tfx.types import standard_component_specs

from components.example_gen.executor import _CsvToExample, blank_markers, custom_config, read_missing_values

CSV = ("distance,count,city,label\n"
       "1.5,3,Paris,yes\n"
       "NA,?,N/A,no\n"
       ",4, NA ,yes\n"
       "2.25,-,Rome,no\n")


def _examples(folder, markers: list[str]) -> list[tf.train.Example]:
    """The tf.Examples ExampleGen's transform makes of CSV, read with `markers` as missing."""
    (folder / "data.csv").write_text(CSV)
    properties = {standard_component_specs.INPUT_BASE_KEY: str(folder),
                  standard_component_specs.CUSTOM_CONFIG_KEY: json_format.MessageToJson(custom_config(markers, "x"))}
    with beam.Pipeline() as pipeline:
        _ = (pipeline | _CsvToExample(properties, "*.csv") | beam.Map(lambda e: e.SerializeToString())
             | beam.io.WriteToTFRecord(str(folder / "examples"), shard_name_template=""))
    return [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(folder / "examples"))]


def _column(examples: list[tf.train.Example], name: str) -> list[tuple[str, list]]:
    values = []
    for example in examples:
        feature = example.features.feature[name]
        kind = feature.WhichOneof("kind")
        values.append((kind, list(getattr(feature, kind).value) if kind else []))
    return values


def test_blank_markers_replaces_whole_cells_only():
    cells = [b"NA", b" NA ", b"NAN", b"?", b"", b"1.5", b"N/A"]
    assert blank_markers(cells, frozenset({b"NA", b"?"})) == [b"", b"", b"NAN", b"", b"", b"1.5", b"N/A"]


def test_markers_travel_in_the_custom_config_as_the_executor_reads_it():
    as_json = json_format.MessageToJson(custom_config(["NA", "?", "null"], "abc"))
    assert read_missing_values({standard_component_specs.CUSTOM_CONFIG_KEY: as_json}) == ["NA", "?", "null"]
    assert read_missing_values({standard_component_specs.CUSTOM_CONFIG_KEY: custom_config([], "abc")}) == []
    assert read_missing_values({}) == []


def test_numeric_columns_with_markers_stay_numeric_and_their_gaps_are_empty(tmp_path):
    examples = _examples(tmp_path, ["NA", "N/A", "?", "-"])
    distance = sorted(_column(examples, "distance"), key=str)
    assert {kind for kind, _ in distance} == {"float_list"}
    assert sorted(v for _, values in distance for v in values) == [1.5, 2.25]
    assert sum(1 for _, values in distance if not values) == 2, "NA and the empty cell are both missing"
    count = _column(examples, "count")
    assert {kind for kind, _ in count} == {"int64_list"}
    assert sorted(v for _, values in count for v in values) == [3, 4]
    city = _column(examples, "city")
    assert {kind for kind, _ in city} == {"bytes_list"}
    assert sorted(v for _, values in city for v in values) == [b"Paris", b"Rome"], "' NA ' is a marker too"


def test_without_markers_the_same_columns_are_strings(tmp_path):
    examples = _examples(tmp_path, [])
    assert {kind for kind, _ in _column(examples, "distance")} == {"bytes_list"}
    assert {kind for kind, _ in _column(examples, "count")} == {"bytes_list"}
    assert sorted(v for _, values in _column(examples, "distance") for v in values) == [b"1.5", b"2.25", b"NA"]
