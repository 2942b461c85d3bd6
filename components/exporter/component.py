"""Exporter: the model in every configured format, each verified in its runtime; with the Evaluator's blessing, the
gate before the Publisher. It needs no blessing itself, so it runs while the Evaluator does.

Its output is a Model artifact whose Format-Serving folder holds the SavedModel at its root and tflite/, onnx/,
tfjs/ and the export report beside it (components/artifacts.py), so TFX's standard Pusher copies all of it into one
version folder.
"""
from __future__ import annotations

from typing import Any

from tfx.dsl.components.base import base_component, executor_spec
from tfx.types import Channel, standard_artifacts
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter
from tfx.utils import json_utils

from components.exporter import executor
from components.specs import (
    CODE_FINGERPRINT_KEY,
    EXAMPLES_KEY,
    EXPORTED_MODEL_KEY,
    EXPORTER_SECTIONS,
    MODEL_KEY,
    TRANSFORM_GRAPH_KEY,
)


class ExporterSpec(ComponentSpec):
    # One JSON property per config section it reads (data, label, transform, export).
    PARAMETERS = {
        **{key: ExecutionParameter(type=str) for key in EXPORTER_SECTIONS},
        CODE_FINGERPRINT_KEY: ExecutionParameter(type=str),
    }
    INPUTS = {
        MODEL_KEY: ChannelParameter(type=standard_artifacts.Model),
        TRANSFORM_GRAPH_KEY: ChannelParameter(type=standard_artifacts.TransformGraph),
        EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples),
    }
    OUTPUTS = {EXPORTED_MODEL_KEY: ChannelParameter(type=standard_artifacts.Model)}


class Exporter(base_component.BaseComponent):
    """`examples` are the raw ExampleGen examples (train and eval splits); `sections` is
    `PipelineConfig.sections(*EXPORTER_SECTIONS)`."""

    SPEC_CLASS = ExporterSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(self, model: Channel, transform_graph: Channel, examples: Channel,
                 sections: dict[str, Any], code_fingerprint: str = ""):
        super().__init__(spec=ExporterSpec(
            model=model,
            transform_graph=transform_graph,
            examples=examples,
            code_fingerprint=code_fingerprint,
            exported_model=Channel(type=standard_artifacts.Model),
            **{key: json_utils.dumps(sections[key]) for key in EXPORTER_SECTIONS},
        ))
