"""CsvExampleGen's executor with `data.missing_values`: a cell that holds a marker (`NA`, `?`) becomes an empty cell
before tfx_bsl infers the column types and encodes the tf.Examples, so a numeric column with markers stays numeric
and its gaps are empty lists like any empty cell. Everything else is TFX's own CSV ingestion: its line reader
(quoted multi-line cells), tfx_bsl's parser and type inference, and its tf.Example encoding.

The markers arrive in ExampleGen's `custom_config` (a google.protobuf.Struct), so the local and the Kubeflow runs
read them alike, and a changed marker list is a changed property that re-runs ExampleGen.
"""
from __future__ import annotations

import os
from typing import Any

import apache_beam as beam
import tensorflow as tf
from google.protobuf import json_format, struct_pb2
from tfx.components.example_gen.base_example_gen_executor import BaseExampleGenExecutor

# TFX's private pieces of its CSV ingestion, reused so that the encoding is exactly CsvExampleGen's (TFX 1.16).
from tfx.components.example_gen.csv_example_gen.executor import _ParsedCsvToTfExample, _ReadCsvRecordsFromTextFile
from tfx.dsl.io import fileio
from tfx.proto import example_gen_pb2
from tfx.types import standard_component_specs
from tfx.utils import io_utils
from tfx_bsl.coders import csv_decoder

from components.specs import MISSING_VALUES_KEY


def custom_config(missing_values: list[str], fingerprint: str) -> example_gen_pb2.CustomConfig:
    """ExampleGen's custom_config holding the markers (and the fingerprint of this module, for TFX's cache)."""
    values = struct_pb2.Struct()
    values.update({MISSING_VALUES_KEY: list(missing_values), "code_fingerprint": fingerprint})
    config = example_gen_pb2.CustomConfig()
    config.custom_config.Pack(values)
    return config


def read_missing_values(exec_properties: dict[str, Any]) -> list[str]:
    """The markers from ExampleGen's exec properties; none when the component got no custom_config."""
    raw = exec_properties.get(standard_component_specs.CUSTOM_CONFIG_KEY)
    if not raw:
        return []
    config = raw if isinstance(raw, example_gen_pb2.CustomConfig) else json_format.Parse(
        raw, example_gen_pb2.CustomConfig())
    values = struct_pb2.Struct()
    if not config.custom_config.Unpack(values):
        raise ValueError(f"ExampleGen's custom_config holds a {config.custom_config.type_url}, not a Struct of "
                         f"{MISSING_VALUES_KEY}; build the pipeline with pipeline.pipeline.create_pipeline.")
    return [str(v) for v in values[MISSING_VALUES_KEY]] if MISSING_VALUES_KEY in values else []


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

    def expand(self, pipeline: beam.Pipeline) -> beam.pvalue.PCollection:
        csv_files = fileio.glob(self._csv_pattern)
        if not csv_files:
            raise RuntimeError(f"Split pattern {self._csv_pattern} does not match any files.")
        column_names = io_utils.load_csv_column_names(csv_files[0])
        for csv_file in csv_files[1:]:
            if io_utils.load_csv_column_names(csv_file) != column_names:
                raise RuntimeError(f"Files in same split {self._csv_pattern} have different header.")
        parsed = (pipeline
                  | "CreateFilenames" >> beam.Create(csv_files)
                  | "ReadFromText" >> beam.ParDo(_ReadCsvRecordsFromTextFile())
                  | "ParseCSVLine" >> beam.ParDo(csv_decoder.ParseCSVLine(delimiter=","))
                  | "ExtractParsedCSVLines" >> beam.Keys())
        if self._markers:
            parsed = parsed | "BlankMissingValueMarkers" >> beam.Map(blank_markers, self._markers)
        column_infos = beam.pvalue.AsSingleton(
            parsed | "InferColumnTypes" >> beam.CombineGlobally(
                csv_decoder.ColumnTypeInferrer(column_names, skip_blank_lines=True)))
        return parsed | "ToTFExample" >> beam.ParDo(_ParsedCsvToTfExample(), column_infos)


class Executor(BaseExampleGenExecutor):
    """CsvExampleGen's executor, reading `data.missing_values` as empty cells."""

    def GetInputSourceToExamplePTransform(self) -> beam.PTransform:  # noqa: N802  (TFX's method name)
        return _CsvToExample

