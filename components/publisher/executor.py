"""Executor of the Publisher: artifacts in, publish_model, the PushedModel out (with TFX Pusher's properties)."""
import time
from typing import Any

from absl import logging
from tfx.components.util import model_utils
from tfx.dsl.components.base import base_executor
from tfx.types import artifact_utils
from tfx.utils import path_utils

from components import artifacts
from components.publisher.publish import TrainingData, publish_model

# The split whose statistics the model learnt from.
TRAIN_SPLIT = "train"


def training_data(input_dict: dict[str, list[Any]]) -> TrainingData | None:
    """The schema file and the train split's statistics file of the inputs; None unless both are wired."""
    if not input_dict.get("schema") or not input_dict.get("statistics"):
        return None
    schema = artifact_utils.get_single_instance(input_dict["schema"])
    statistics = artifact_utils.get_single_instance(input_dict["statistics"])
    return TrainingData(
        schema=artifacts.join(schema.uri, artifacts.SCHEMA_FILE),
        statistics=artifacts.join(artifacts.split_uri(statistics.uri, TRAIN_SPLIT), artifacts.STATISTICS_FILE))


class Executor(base_executor.BaseExecutor):
    def Do(self, input_dict: dict[str, list[Any]], output_dict: dict[str, list[Any]], exec_properties: dict) -> None:
        model = artifact_utils.get_single_instance(input_dict["model"])
        blessing = artifact_utils.get_single_instance(input_dict["model_blessing"])
        pushed = artifact_utils.get_single_instance(output_dict["pushed_model"])
        if not model_utils.is_model_blessed(blessing):
            logging.info("the model is not blessed: nothing is published")
            pushed.set_int_custom_property("pushed", 0)
            return
        record = {
            "blessed": True,
            "blessing_uri": blessing.uri,
            "source_uri": model.uri,
            "pipeline_run": self._context.pipeline_run_id if self._context else "",
            "published_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        published = publish_model(path_utils.serving_model_path(model.uri), exec_properties["serving_base_dir"],
                                  exec_properties["model_name"], record, training_data(input_dict))
        logging.info("published version %d at %s (%s)", published.version, published.path,
                     "new" if published.new else "the same model was already published")
        pushed.set_int_custom_property("pushed", 1)
        pushed.set_string_custom_property("pushed_destination", published.path)
        pushed.set_int_custom_property("pushed_version", published.version)
        pushed.set_int_custom_property("pushed_new", int(published.new))
