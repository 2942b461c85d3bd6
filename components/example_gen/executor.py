"""CsvExampleGen's executor with `data.missing_values`: a cell that holds a marker (`NA`, `?`) becomes an empty cell
before tfx_bsl infers the column types and encodes the tf.Examples, so a numeric column with markers stays numeric
and its gaps are empty lists like any empty cell. Everything else is TFX's own CSV ingestion: its line reader
(quoted multi-line cells), tfx_bsl's parser and type inference, and its tf.Example encoding.

With `data.stratify` (a binary or multiclass label), the rows are split per label class: within each class they are
ordered by the hash of the whole row and cut at the split shares, so every split holds the data's label rates
(a plain hash split of the taxi sample gave eval 24.1% positives against 22.2% in the calibration split, and the
calibration fitted on one missed the other by that much). The same row still lands in the same split on every run.

The markers and the label arrive in ExampleGen's `custom_config` (a google.protobuf.Struct), so the local and the
Kubeflow runs read them alike, and a changed marker list or label is a changed property that re-runs ExampleGen.
"""
from __future__ import annotations

import bisect
import hashlib
import itertools
import math
import os
from typing import Any

import apache_beam as beam
import tensorflow as tf
from absl import logging
from google.protobuf import json_format, struct_pb2
from tfx.components.example_gen import utils as example_gen_utils
from tfx.components.example_gen.base_example_gen_executor import BaseExampleGenExecutor, _GeneratePartitionKey

# TFX's private pieces of its CSV ingestion, reused so that the encoding is exactly CsvExampleGen's (TFX 1.16).
from tfx.components.example_gen.csv_example_gen.executor import _ParsedCsvToTfExample, _ReadCsvRecordsFromTextFile
from tfx.dsl.io import fileio
from tfx.proto import example_gen_pb2
from tfx.types import standard_component_specs
from tfx.utils import proto_utils
from tfx_bsl.coders import csv_decoder

from components import artifacts
from components.label_rule import first_value, label_class
from components.specs import LABEL_COLUMN_KEY, MISSING_VALUES_KEY, STRATIFY_LABEL_KEY
from settings.config import LabelConfig
from settings.csv_header import CsvHeader, header_of_line

# The label fields ExampleGen needs to put a row in its class (settings.config.LabelConfig's names).
STRATIFY_LABEL_FIELDS = ("kind", "column", "threshold", "relative_to", "positive_value")
# Hashes above every row's: the cut of a split that gets no rows of a class.
_PAST_LAST_HASH = 1 << 64
# The exec property through which Executor.Do tells the CSV transform where to count the rows without a label.
_MISSING_LABEL_PATH = "_missing_label_path"


def custom_config(missing_values: list[str], fingerprint: str, stratify_label: LabelConfig | None = None,
                  label_column: str = "") -> example_gen_pb2.CustomConfig:
    """ExampleGen's custom_config holding the markers, the label to stratify by (None: a plain hash split), the
    label's raw column (rows without it are left out; empty: every row is kept) and the fingerprint of this module,
    for TFX's cache."""
    values = struct_pb2.Struct()
    values.update({MISSING_VALUES_KEY: list(missing_values), "code_fingerprint": fingerprint})
    if label_column:
        values.update({LABEL_COLUMN_KEY: label_column})
    if stratify_label is not None:
        values.update({STRATIFY_LABEL_KEY: {key: getattr(stratify_label, key) for key in STRATIFY_LABEL_FIELDS}})
    config = example_gen_pb2.CustomConfig()
    config.custom_config.Pack(values)
    return config


def _custom_values(exec_properties: dict[str, Any]) -> dict[str, Any]:
    raw = exec_properties.get(standard_component_specs.CUSTOM_CONFIG_KEY)
    if not raw:
        return {}
    config = raw if isinstance(raw, example_gen_pb2.CustomConfig) else json_format.Parse(
        raw, example_gen_pb2.CustomConfig())
    values = struct_pb2.Struct()
    if not config.custom_config.Unpack(values):
        raise ValueError(f"ExampleGen's custom_config holds a {config.custom_config.type_url}, not a Struct of "
                         f"{MISSING_VALUES_KEY}; build the pipeline with pipeline.pipeline.create_pipeline.")
    return json_format.MessageToDict(values)


def read_missing_values(exec_properties: dict[str, Any]) -> list[str]:
    """The markers from ExampleGen's exec properties; none when the component got no custom_config."""
    return [str(v) for v in _custom_values(exec_properties).get(MISSING_VALUES_KEY, [])]


def read_stratify_label(exec_properties: dict[str, Any]) -> LabelConfig | None:
    """The label ExampleGen stratifies its split by; None for a plain hash split."""
    fields = _custom_values(exec_properties).get(STRATIFY_LABEL_KEY)
    return None if fields is None else LabelConfig(**{key: fields[key] for key in STRATIFY_LABEL_FIELDS})


def read_label_column(exec_properties: dict[str, Any]) -> str:
    """The label's raw column, whose missing rows ExampleGen leaves out; empty when it keeps every row."""
    return str(_custom_values(exec_properties).get(LABEL_COLUMN_KEY, ""))


def has_value(example: tf.train.Example, name: str) -> bool:
    """Whether the row holds a value of the column (an empty cell or a missing-value marker is none)."""
    return first_value(example, name) is not None


def read_missing_label_rows(examples_uri: str) -> int | None:
    """How many rows ExampleGen left out of the Examples at `examples_uri` for a missing label; None when it
    recorded nothing (an older run, or no label column to check)."""
    path = artifacts.join(examples_uri, artifacts.MISSING_LABEL_FILE)
    return int(artifacts.read_json(path)["rows"]) if artifacts.exists(path) else None


def _write_count(count: int, path: str, column: str) -> None:
    artifacts.write_json(path, {"column": column, "rows": int(count)})


def row_hash(example: tf.train.Example, split_config: example_gen_pb2.SplitConfig) -> int:
    """A 64-bit hash of what TFX's hash split hashes (the whole row, or split_config.partition_feature_name)."""
    return int.from_bytes(hashlib.sha256(_GeneratePartitionKey(example, split_config)).digest()[:8], "big")


def split_cuts(hashes: list[int], buckets: list[int]) -> list[int]:
    """The hashes at which one class's rows pass to the next split: the rows ordered by hash, split i takes the
    share buckets[i] / buckets[-1] of them (buckets are cumulative, as TFX's); a split too small for the class gets
    none. Rows with equal hashes (duplicates) stay together."""
    ordered = sorted(hashes)
    total = buckets[-1]
    cuts = []
    for bucket in buckets[:-1]:
        rank = math.ceil(len(ordered) * bucket / total)
        cuts.append(ordered[rank] if rank < len(ordered) else _PAST_LAST_HASH)
    return cuts


def _split_index(keyed: tuple[str, int, bytes], num_splits: int, cuts: dict[str, list[int]]) -> int:
    """beam.Partition's function (it passes num_splits): the split of a (label class, hash, row)."""
    label, hashed, _ = keyed
    return bisect.bisect_right(cuts[label], hashed)


class StratifiedSplit(beam.PTransform):
    """tf.Examples into len(buckets) splits of serialized rows, each label class cut by hash at the split shares.
    Each class's hashes (8 bytes a row) meet on one worker to find its cuts; the rows themselves are not grouped."""

    def __init__(self, buckets: list[int], split_config: example_gen_pb2.SplitConfig, label: LabelConfig):
        super().__init__()
        self._buckets, self._split_config, self._label = buckets, split_config, label

    def expand(self, records: beam.pvalue.PCollection) -> tuple[beam.pvalue.PCollection, ...]:
        label, split_config, buckets = self._label, self._split_config, self._buckets
        # Serialized as TFX's writer would (same bytes as its hash split): bytes cross the stage boundary cheaply.
        keyed = records | "KeyByLabelClass" >> beam.Map(
            lambda record: (label_class(record, label), row_hash(record, split_config), record.SerializeToString()))
        cuts = (keyed
                | "LabelClassHash" >> beam.Map(lambda keyed_record: (keyed_record[0], keyed_record[1]))
                | "GroupByLabelClass" >> beam.GroupByKey()
                | "CutEachClass" >> beam.MapTuple(lambda label_value, hashes: (label_value,
                                                                              split_cuts(list(hashes), buckets))))
        parts = keyed | "SplitEachClass" >> beam.Partition(_split_index, len(buckets), beam.pvalue.AsDict(cuts))
        return tuple(part | f"DropKeys[{index}]" >> beam.Map(lambda keyed_record: keyed_record[2])
                     for index, part in enumerate(parts))


def read_file_header(path: str) -> CsvHeader:
    """The header of a CSV file as `mlops init` and `mlops predict` read it (TFX's own reader splits the first line
    at commas, so R's quoted names would keep their quotes)."""
    with fileio.open(path, "rb") as f:
        return header_of_line(f.readline(), path)


def blank_markers(cells: list[bytes], markers: frozenset[bytes]) -> list[bytes]:
    """The parsed cells of one CSV line with every marker (surrounding blanks ignored) replaced by an empty cell."""
    return [b"" if cell.strip() in markers else cell for cell in cells]


@beam.typehints.with_input_types(beam.Pipeline)
@beam.typehints.with_output_types(tf.train.Example)
class _CsvToExample(beam.PTransform):
    """TFX's CSV-to-tf.Example transform for one split, with a marker step between parsing and type inference."""

    def __init__(self, exec_properties: dict[str, Any], split_pattern: str):
        self._csv_pattern = os.path.join(exec_properties[standard_component_specs.INPUT_BASE_KEY], split_pattern)
        self._markers = frozenset(m.strip().encode() for m in read_missing_values(exec_properties) if m.strip())
        self._label_column = read_label_column(exec_properties)
        self._count_path = exec_properties.get(_MISSING_LABEL_PATH, "")

    def expand(self, pipeline: beam.Pipeline) -> beam.pvalue.PCollection:
        csv_files = fileio.glob(self._csv_pattern)
        if not csv_files:
            raise RuntimeError(f"Split pattern {self._csv_pattern} does not match any files.")
        header = read_file_header(csv_files[0])
        for csv_file in csv_files[1:]:
            if read_file_header(csv_file) != header:
                raise RuntimeError(f"Files in same split {self._csv_pattern} have different header.")
        column_names = list(header.names)
        parsed = (pipeline
                  | "CreateFilenames" >> beam.Create(csv_files)
                  | "ReadFromText" >> beam.ParDo(_ReadCsvRecordsFromTextFile())
                  | "ParseCSVLine" >> beam.ParDo(csv_decoder.ParseCSVLine(delimiter=","))
                  | "ExtractParsedCSVLines" >> beam.Keys())
        if header.row_index:
            parsed = parsed | "DropRowIndex" >> beam.Map(header.cells)
        if self._markers:
            parsed = parsed | "BlankMissingValueMarkers" >> beam.Map(blank_markers, self._markers)
        column_infos = beam.pvalue.AsSingleton(
            parsed | "InferColumnTypes" >> beam.CombineGlobally(
                csv_decoder.ColumnTypeInferrer(column_names, skip_blank_lines=True)))
        examples = parsed | "ToTFExample" >> beam.ParDo(_ParsedCsvToTfExample(), column_infos)
        if not self._label_column or self._label_column not in column_names:
            return examples
        column = self._label_column
        # A row without a label teaches nothing and cannot be measured; kept, it would be a NaN or -1 label.
        kept, dropped = examples | "SplitByLabelPresence" >> beam.Partition(
            lambda example, _: 0 if has_value(example, column) else 1, 2)
        if self._count_path:
            _ = (dropped | "CountMissingLabels" >> beam.combiners.Count.Globally()
                 | "WriteMissingLabelCount" >> beam.Map(_write_count, self._count_path, column))
        return kept


class Executor(BaseExampleGenExecutor):
    """CsvExampleGen's executor, reading `data.missing_values` as empty cells, leaving out the rows without a label
    (counted in MISSING_LABEL_FILE) and splitting by label class with `data.stratify`."""

    def Do(self, input_dict: dict[str, list[Any]], output_dict: dict[str, list[Any]],  # noqa: N802  (TFX's name)
           exec_properties: dict[str, Any]) -> None:
        (examples,) = output_dict[standard_component_specs.EXAMPLES_KEY]
        column = read_label_column(exec_properties)
        if column:
            exec_properties[_MISSING_LABEL_PATH] = artifacts.join(examples.uri, artifacts.MISSING_LABEL_FILE)
        super().Do(input_dict, output_dict, exec_properties)
        dropped = read_missing_label_rows(examples.uri) if column else None
        if dropped is not None:
            examples.set_int_custom_property("missing_label_rows", dropped)
            logging.info("left out %d row(s) without a value of the label column %r", dropped, column)

    def GetInputSourceToExamplePTransform(self) -> beam.PTransform:  # noqa: N802  (TFX's method name)
        return _CsvToExample

    def GenerateExamplesByBeam(self, pipeline: beam.Pipeline,  # noqa: N802  (TFX's method name)
                               exec_properties: dict[str, Any]) -> dict[str, beam.pvalue.PCollection]:
        label = read_stratify_label(exec_properties)
        output_config = proto_utils.json_to_proto(exec_properties[standard_component_specs.OUTPUT_CONFIG_KEY],
                                                  example_gen_pb2.Output())
        if label is None or not output_config.split_config.splits:
            return super().GenerateExamplesByBeam(pipeline, exec_properties)
        # TFX's own steps up to its hash partition (base_example_gen_executor, TFX 1.16), then the stratified one.
        input_config = proto_utils.json_to_proto(exec_properties[standard_component_specs.INPUT_CONFIG_KEY],
                                                 example_gen_pb2.Input())
        exec_properties["_beam_pipeline_args"] = self._beam_pipeline_args or []
        buckets = list(itertools.accumulate(split.hash_buckets for split in output_config.split_config.splits))
        splits = (pipeline
                  | "InputToRecord" >> self.GetInputSourceToExamplePTransform()(exec_properties,
                                                                              input_config.splits[0].pattern)
                  | "SplitDataByLabelClass" >> StratifiedSplit(buckets, output_config.split_config, label))
        names = example_gen_utils.generate_output_split_names(input_config, output_config)
        return dict(zip(names, splits, strict=True))

