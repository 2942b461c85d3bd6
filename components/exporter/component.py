"""Exporter: the blessed model in every configured format, each verified in its runtime; the gate before the Pusher.

Its output is a Model artifact whose Format-Serving folder holds the SavedModel at its root and tflite/, onnx/,
tfjs/ and the export report beside it, so TFX's standard Pusher copies all of it into one version folder.
"""
from typing import Any

from tfx.dsl.components.base import base_component, executor_spec
from tfx.types import Channel, standard_artifacts
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter
from tfx.utils import json_utils

from components.exporter import executor


class ExporterSpec(ComponentSpec):
    PARAMETERS = {"custom_config": ExecutionParameter(type=str)}
    INPUTS = {
        "model": ChannelParameter(type=standard_artifacts.Model),
        "model_blessing": ChannelParameter(type=standard_artifacts.ModelBlessing),
        "transform_graph": ChannelParameter(type=standard_artifacts.TransformGraph),
        "examples": ChannelParameter(type=standard_artifacts.Examples),
    }
    OUTPUTS = {"exported_model": ChannelParameter(type=standard_artifacts.Model)}


class Exporter(base_component.BaseComponent):
    """`examples` are the raw ExampleGen examples (train and eval splits); `custom_config` the module config with
    its "export" section."""

    SPEC_CLASS = ExporterSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(self, model: Channel, model_blessing: Channel, transform_graph: Channel, examples: Channel,
                 custom_config: dict[str, Any]):
        super().__init__(spec=ExporterSpec(
            model=model,
            model_blessing=model_blessing,
            transform_graph=transform_graph,
            examples=examples,
            custom_config=json_utils.dumps(custom_config),
            exported_model=Channel(type=standard_artifacts.Model),
        ))
