"""ExampleGen with data.missing_values: markers become empty cells before the CSV is typed and encoded."""
import dataclasses

import apache_beam as beam
import tensorflow as tf
from google.protobuf import json_format
from tfx.components.example_gen.base_example_gen_executor import _PartitionFn
from tfx.components.example_gen.write_split import MaybeSerialize
from tfx.proto import example_gen_pb2
from tfx.types import standard_component_specs

from components.example_gen.executor import (
    Executor,
    _CsvToExample,
    blank_markers,
    custom_config,
    read_label_column,
    read_missing_label_rows,
    read_missing_values,
    read_stratify_label,
    split_cuts,
)
from components.label_rule import label_class
from settings.config import LabelConfig

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


# --- data.stratify: each label class split by the split shares ---

TAXI_LABEL = LabelConfig(kind="binary", column="tips", threshold=0.2, relative_to="fare")


def test_the_stratify_label_travels_in_the_custom_config_as_the_executor_reads_it():
    named = dataclasses.replace(TAXI_LABEL, name="big_tipper")
    as_json = json_format.MessageToJson(custom_config(["NA"], "abc", named))
    assert read_stratify_label({standard_component_specs.CUSTOM_CONFIG_KEY: as_json}) == TAXI_LABEL
    assert read_missing_values({standard_component_specs.CUSTOM_CONFIG_KEY: as_json}) == ["NA"]
    assert read_stratify_label({standard_component_specs.CUSTOM_CONFIG_KEY: custom_config([], "abc")}) is None


def test_split_cuts_give_each_split_its_share_of_a_class():
    hashes = list(range(100, 1300, 100))  # 12 rows
    assert split_cuts(hashes[::-1], [4, 5, 6]) == [900, 1100]  # ranks 8 and 10: 8 train, 2 eval, 2 calibration
    assert split_cuts([7, 3], [4, 5, 6]) == [1 << 64, 1 << 64], "two rows: both go to the largest share"
    assert split_cuts([5, 5, 5, 9], [1, 2]) == [5], "duplicates stay together"


def _run_split(folder, csv: str, label: LabelConfig | None) -> dict[str, list[bytes]]:
    """The train, eval and calibration splits (4, 1 and 1 buckets) the ExampleGen executor's Beam graph makes, as
    the bytes TFX's writer writes (write_split.MaybeSerialize)."""
    (folder / "in").mkdir(parents=True)
    (folder / "in" / "data.csv").write_text(csv)
    buckets = {"train": 4, "eval": 1, "calibration": 1}
    output = example_gen_pb2.Output(split_config=example_gen_pb2.SplitConfig(splits=[
        example_gen_pb2.SplitConfig.Split(name=name, hash_buckets=count) for name, count in buckets.items()]))
    properties = {
        standard_component_specs.INPUT_BASE_KEY: str(folder / "in"),
        standard_component_specs.INPUT_CONFIG_KEY: json_format.MessageToJson(example_gen_pb2.Input(
            splits=[example_gen_pb2.Input.Split(name="single_split", pattern="*.csv")])),
        standard_component_specs.OUTPUT_CONFIG_KEY: json_format.MessageToJson(output),
        standard_component_specs.CUSTOM_CONFIG_KEY: json_format.MessageToJson(custom_config([], "x", label)),
    }
    with beam.Pipeline() as pipeline:
        for name, split in Executor().GenerateExamplesByBeam(pipeline, properties).items():
            _ = (split | f"Serialize[{name}]" >> beam.ParDo(MaybeSerialize())
                 | f"Write[{name}]" >> beam.io.WriteToTFRecord(str(folder / name), shard_name_template=""))
    return {name: [r.numpy() for r in tf.data.TFRecordDataset(str(folder / name))] for name in buckets}


def _parsed(splits: dict[str, list[bytes]]) -> dict[str, list[tf.train.Example]]:
    return {name: [tf.train.Example.FromString(r) for r in records] for name, records in splits.items()}


def _labelled_csv(rows: int, positive_every: int) -> str:
    # As many columns as the taxi data: a protobuf map's serialized order can change when a row is re-encoded.
    extra = [f"c{i}" for i in range(15)]
    lines = [",".join(["trip", "fare", "tips", *extra])]
    lines += [",".join([str(i), "10.0", "3.0" if i % positive_every == 0 else "1.0", *(str(i % 7) for _ in extra)])
              for i in range(rows)]
    return "\n".join(lines) + "\n"


def test_stratified_splits_hold_the_datas_label_rate_and_every_row_once(tmp_path):
    written = _run_split(tmp_path / "a", _labelled_csv(600, 4), TAXI_LABEL)
    splits = _parsed(written)
    trips = {name: sorted(e.features.feature["trip"].int64_list.value[0] for e in examples)
             for name, examples in splits.items()}
    assert sorted(t for ts in trips.values() for t in ts) == list(range(600))
    for name, share in (("train", 4 / 6), ("eval", 1 / 6), ("calibration", 1 / 6)):
        positives = sum(label_class(e, TAXI_LABEL) == "1" for e in splits[name])
        assert positives == round(150 * share), name  # 150 positive rows of 600, cut at exactly the shares
        assert len(splits[name]) == round(600 * share), name
    again = _run_split(tmp_path / "b", _labelled_csv(600, 4), TAXI_LABEL)
    assert {name: sorted(e.features.feature["trip"].int64_list.value[0] for e in examples)
            for name, examples in _parsed(again).items()} == trips, "a row lands in the same split on every run"
    plain = _run_split(tmp_path / "c", _labelled_csv(600, 4), None)
    assert sorted(r for records in written.values() for r in records) == \
        sorted(r for records in plain.values() for r in records), "the same bytes as TFX's hash split writes"


def test_without_a_stratify_label_the_split_is_tfxs_hash_split(tmp_path):
    splits = _parsed(_run_split(tmp_path, _labelled_csv(600, 4), None))
    assert sum(len(examples) for examples in splits.values()) == 600
    split_config = example_gen_pb2.SplitConfig()
    for index, name in enumerate(("train", "eval", "calibration")):
        assert all(_PartitionFn(e, 3, [4, 5, 6], split_config) == index for e in splits[name]), name


def test_rows_without_a_label_are_left_out_and_counted(tmp_path):
    # A numeric label with gaps: an NA marker and an empty cell.
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "data.csv").write_text("x,grams\n1,3500\n2,NA\n3,\n4,4100\n5,3900\n")
    config = json_format.MessageToJson(custom_config(["NA"], "x", None, "grams"))
    assert read_label_column({standard_component_specs.CUSTOM_CONFIG_KEY: config}) == "grams"
    count = tmp_path / "out" / "count.json"
    count.parent.mkdir()
    properties = {standard_component_specs.INPUT_BASE_KEY: str(tmp_path / "in"),
                  standard_component_specs.CUSTOM_CONFIG_KEY: config, "_missing_label_path": str(count)}
    with beam.Pipeline() as pipeline:
        _ = (pipeline | _CsvToExample(properties, "*.csv") | beam.Map(lambda e: e.SerializeToString())
             | beam.io.WriteToTFRecord(str(tmp_path / "examples"), shard_name_template=""))
    kept = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(tmp_path / "examples"))]
    assert sorted(e.features.feature["x"].int64_list.value[0] for e in kept) == [1, 4, 5]
    assert read_missing_label_rows(str(count.parent)) is None, "read from the artifact's own file name"
    count.rename(count.parent / "missing_label_rows.json")
    assert read_missing_label_rows(str(count.parent)) == 2
    assert read_label_column({standard_component_specs.CUSTOM_CONFIG_KEY: json_format.MessageToJson(
        custom_config([], "x"))}) == "", "no label column: every row is kept"
