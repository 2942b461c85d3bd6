"""Executor of the Exporter: artifacts in, export_and_verify, the exported model out."""
import json
import os
from typing import Any

from absl import logging
from tfx.components.util import model_utils
from tfx.dsl.components.base import base_executor
from tfx.types import artifact_utils
from tfx.utils import io_utils, json_utils, path_utils

from components.exporter import report
from components.exporter.data import load_eval_data
from components.exporter.export import export_and_verify
from components.exporter.preprocessing import build_spec
from components.features import FeatureLayout
from components.model import load_keras_model
from components.optimizer.executor import REPORT_FILE as OPTIMIZATION_REPORT


class Executor(base_executor.BaseExecutor):
    def Do(self, input_dict: dict[str, list[Any]], output_dict: dict[str, list[Any]], exec_properties: dict) -> None:
        import tensorflow_transform as tft

        model = artifact_utils.get_single_instance(input_dict["model"])
        blessing = artifact_utils.get_single_instance(input_dict["model_blessing"])
        transform_graph = artifact_utils.get_single_instance(input_dict["transform_graph"])
        examples = input_dict["examples"]
        output = artifact_utils.get_single_instance(output_dict["exported_model"])
        config = json_utils.loads(exec_properties["custom_config"])
        options = config["export"]
        output_dir = path_utils.serving_model_path(output.uri)

        if not model_utils.is_model_blessed(blessing):
            # The Pusher pushes nothing for an unblessed model, so there is nothing to convert.
            logging.info("the model is not blessed: nothing is exported")
            io_utils.write_string_file(os.path.join(output.uri, "NOT_EXPORTED"), "the model was not blessed\n")
            return

        layout = FeatureLayout(config)
        serving_model_dir = path_utils.serving_model_path(model.uri)
        tft_output = tft.TFTransformOutput(transform_graph.uri)
        data = load_eval_data(
            artifact_utils.get_split_uri(examples, "eval"),
            artifact_utils.get_split_uri(examples, "train"),
            serving_model_dir,
            tft_output.raw_feature_spec(),
            layout.raw_features,
            layout.label_key,
            options,
        )
        optimization_path = os.path.join(model.uri, OPTIMIZATION_REPORT)
        optimization = json.loads(io_utils.read_string_file(optimization_path)) if os.path.exists(
            optimization_path) else None
        result = export_and_verify(
            serving_model_dir,
            load_keras_model(model.uri),
            build_spec(transform_graph.uri, config),
            data,
            output_dir,
            options,
            optimization,
        )
        for line in report.table_lines(result):
            logging.info("%s", line)
