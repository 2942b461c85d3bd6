"""Exporter: the blessed model in every configured format, each verified in its runtime; the gate before the Pusher.

Its output is a Model artifact whose Format-Serving folder holds the SavedModel at its root and tflite/, onnx/,
tfjs/ and the export report beside it, so TFX's standard Pusher copies all of it into one version folder.
"""
from tfx.dsl.components.base import base_component, executor_spec
from tfx.types import channel_utils, standard_artifacts
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

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
    """`examples` are the raw ExampleGen examples (train and eval splits); `custom_config` the JSON of
    PipelineConfig.module_config()."""

    SPEC_CLASS = ExporterSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(self, model, model_blessing, transform_graph, examples, custom_config: str):
        super().__init__(spec=ExporterSpec(
            model=model,
            model_blessing=model_blessing,
            transform_graph=transform_graph,
            examples=examples,
            custom_config=custom_config,
            exported_model=channel_utils.as_channel([standard_artifacts.Model()]),
        ))
