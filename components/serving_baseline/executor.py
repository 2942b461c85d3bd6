"""Executor of ServingBaseline: resolve_baseline into the output Model, its version recorded on the artifact."""
from typing import Any

from tfx.dsl.components.base import base_executor
from tfx.types import artifact_utils

from components.serving_baseline.resolve import (
    RESOLVED_PROPERTY,
    SOURCE_PROPERTY,
    VERSION_PROPERTY,
    resolve_baseline,
)
from components.specs import MODEL_KEY


class Executor(base_executor.BaseExecutor):
    def Do(self, input_dict: dict[str, list[Any]], output_dict: dict[str, list[Any]], exec_properties: dict) -> None:
        model = artifact_utils.get_single_instance(output_dict[MODEL_KEY])
        baseline = resolve_baseline(exec_properties["serving_base_dir"], exec_properties["model_name"],
                                    exec_properties["rule"], model.uri)
        model.set_int_custom_property(RESOLVED_PROPERTY, int(baseline is not None))
        if baseline is not None:
            model.set_int_custom_property(VERSION_PROPERTY, baseline.version)
            model.set_string_custom_property(SOURCE_PROPERTY, baseline.source)
