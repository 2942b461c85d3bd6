"""Executor of the Exporter: artifacts in, export_and_verify, the exported model out."""
from __future__ import annotations

from typing import Any

from absl import logging
from tfx.dsl.components.base import base_executor
from tfx.types import artifact_utils

from components import artifacts
from components.exporter.data import load_eval_data
from components.exporter.export import export_and_verify
from components.exporter.preprocessing import build_spec
from components.features import FeatureLayout
from components.model import load_keras_model
from components.specs import (
    EVALUATION_KEY,
    EXAMPLES_KEY,
    EXPORT_KEY,
    EXPORTED_MODEL_KEY,
    MODEL_KEY,
    TRANSFORM_GRAPH_KEY,
)
from reports.model_reports import table_lines
from reports.records import RequestEncoding
from settings.config import EvaluationConfig, ExportConfig, read_section


class Executor(base_executor.BaseExecutor):
    def Do(self, input_dict: dict[str, list[Any]], output_dict: dict[str, list[Any]], exec_properties: dict) -> None:
        import tensorflow_transform as tft

        model_uri = artifact_utils.get_single_uri(input_dict[MODEL_KEY])
        transform_graph_uri = artifact_utils.get_single_uri(input_dict[TRANSFORM_GRAPH_KEY])
        examples_uri = artifact_utils.get_single_uri(input_dict[EXAMPLES_KEY])
        output_uri = artifact_utils.get_single_uri(output_dict[EXPORTED_MODEL_KEY])
        options = read_section(exec_properties, EXPORT_KEY, ExportConfig)

        layout = FeatureLayout.from_properties(exec_properties)
        serving_model_dir = artifacts.serving_model_dir(model_uri)
        tft_output = tft.TFTransformOutput(transform_graph_uri)
        data = load_eval_data(
            artifacts.split_uri(examples_uri, "eval"),
            artifacts.split_uri(examples_uri, "train"),
            serving_model_dir,
            tft_output.raw_feature_spec(),
            layout.raw_features,
            layout.label_key,
            options,
        )
        result = export_and_verify(
            serving_model_dir,
            load_keras_model(model_uri),
            build_spec(transform_graph_uri, layout),
            data,
            artifacts.serving_model_dir(output_uri),
            options,
            artifacts.read_optimization_report(model_uri),
            read_section(exec_properties, EVALUATION_KEY, EvaluationConfig).metric,
            artifacts.read_calibration_record(model_uri),
            RequestEncoding(tuple(layout.data.missing_values), tuple(layout.label_columns)),
            # Beside the output artifact's folder, which TFX removes when the component fails.
            failure_dir=output_uri.rstrip("/") + "-failed-export",
        )
        for line in table_lines(result):
            logging.info("%s", line)
