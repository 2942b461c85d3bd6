"""Optimizer: the Trainer's model distilled and/or pruned (optimize.* settings), exported like the Trainer's.

Its output is a Model artifact with the same layout as the Trainer's (Format-Serving/ and keras/model.keras) plus
optimization_report.json, so the Evaluator, Pusher and Exporter read it in place of the Trainer's model.
"""
from typing import Any

from tfx.dsl.components.base import base_component, executor_spec
from tfx.types import Channel, standard_artifacts
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter
from tfx.utils import json_utils

from components.optimizer import executor


class OptimizerSpec(ComponentSpec):
    # JSON of the whole module config, like the Trainer's custom_config: "optimize", "training", "features", ...
    PARAMETERS = {"custom_config": ExecutionParameter(type=str)}
    INPUTS = {
        "model": ChannelParameter(type=standard_artifacts.Model),
        "transform_graph": ChannelParameter(type=standard_artifacts.TransformGraph),
        # The Transform's transformed_examples, with train and eval splits.
        "examples": ChannelParameter(type=standard_artifacts.Examples),
    }
    # TFX wants argument names unique across inputs and outputs, hence not "model".
    OUTPUTS = {"optimized_model": ChannelParameter(type=standard_artifacts.Model)}


class Optimizer(base_component.BaseComponent):
    """Place it after the Trainer; feed `outputs["optimized_model"]` to the Evaluator, Pusher and Exporter."""

    SPEC_CLASS = OptimizerSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(self, model: Channel, transform_graph: Channel, examples: Channel, custom_config: dict[str, Any]):
        super().__init__(spec=OptimizerSpec(
            model=model,
            transform_graph=transform_graph,
            examples=examples,
            custom_config=json_utils.dumps(custom_config),
            optimized_model=Channel(type=standard_artifacts.Model),
        ))
