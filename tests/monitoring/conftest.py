"""A real small pipeline run's data artifacts (ExampleGen, StatisticsGen and the curated schema on the 2,000-row taxi
slice, about 12 s), and a model repository whose version 1 carries them as the Publisher copies them."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tensorflow as tf
from tensorflow_metadata.proto.v0 import schema_pb2

from components import artifacts
from components.publisher.publish import TrainingData, publish_model
from settings.config import PipelineConfig
from tests.conftest import small_config, small_overrides
from tests.monitoring.request_logs import feature_types
from tests.serving.conftest import save_tiny_model

MODEL = "taxi"


@dataclass(frozen=True)
class TaxiRun:
    root: Path
    overrides: list[str]
    config: PipelineConfig
    schema: schema_pb2.Schema
    training: TrainingData
    # Rows of each split as a client sends them: the features only, None where the CSV cell was empty.
    splits: dict[str, list[dict[str, Any]]]
    types: dict[str, Any]
    version: int


def _rows(split_folder: str, features: list[str]) -> list[dict[str, Any]]:
    rows = []
    for record in artifacts.read_records(split_folder):
        example = tf.train.Example.FromString(record)
        row = {}
        for name in features:
            feature = example.features.feature.get(name)
            kind = feature.WhichOneof("kind") if feature is not None else None
            values = list(getattr(feature, kind).value) if kind else []
            row[name] = values[0] if values else None
        rows.append(row)
    return rows


def _only(pattern: str) -> str:
    [path] = tf.io.gfile.glob(pattern)
    return path


@pytest.fixture(scope="session")
def taxi_run(taxi_slice, tmp_path_factory) -> TaxiRun:
    from tfx.components import StatisticsGen
    from tfx.components.schema_gen.import_schema_gen.component import ImportSchemaGen
    from tfx.orchestration.local.local_dag_runner import LocalDagRunner
    from tfx.orchestration.metadata import sqlite_metadata_connection_config
    from tfx.orchestration.pipeline import Pipeline

    from pipeline.pipeline import beam_args, csv_example_gen, staged_schema

    root = tmp_path_factory.mktemp("monitor_run")
    overrides = small_overrides(taxi_slice, root)
    config = small_config(taxi_slice, root)
    example_gen = csv_example_gen(config)
    statistics_gen = StatisticsGen(examples=example_gen.outputs["examples"])
    schema_gen = ImportSchemaGen(schema_file=staged_schema(config))
    LocalDagRunner().run(Pipeline(
        pipeline_name=config.name, pipeline_root=str(Path(config.pipeline_root).resolve()),
        components=[example_gen, statistics_gen, schema_gen], enable_cache=False,
        metadata_connection_config=sqlite_metadata_connection_config(str(Path(config.metadata_path).resolve())),
        beam_pipeline_args=beam_args(config)))
    pipeline_root = Path(config.pipeline_root).resolve()
    training = TrainingData(
        schema=_only(f"{pipeline_root}/ImportSchemaGen/schema/*/{artifacts.SCHEMA_FILE}"),
        statistics=_only(f"{pipeline_root}/StatisticsGen/statistics/*/Split-train/{artifacts.STATISTICS_FILE}"))
    examples = _only(f"{pipeline_root}/CsvExampleGen/examples/*")
    splits = {split: _rows(artifacts.split_uri(examples, split), config.features)
              for split in ("train", "eval", "calibration")}
    schema = schema_pb2.Schema()
    from google.protobuf import text_format

    text_format.Parse(Path(training.schema).read_text(), schema)
    export = save_tiny_model(root / "export", 1.0)
    (export / "export_report.json").write_text(json.dumps({"passed": True}))
    published = publish_model(str(export), config.serving_base_dir, MODEL, {"blessed": True}, training)
    return TaxiRun(root, overrides, config, schema, training, splits, feature_types(schema, config.features),
                   published.version)
