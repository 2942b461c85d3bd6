"""Optimizer: the Trainer's model distilled and/or pruned (optimize.* settings), exported like the Trainer's.

Its output is a Model artifact with the same layout as the Trainer's (components/artifacts.py: Format-Serving/ and
the Keras model) plus the optimization report, so the Evaluator, Exporter and Pusher read it in place of the
Trainer's model.
"""
from __future__ import annotations

from typing import Any

from tfx.dsl.components.base import base_component, executor_spec
from tfx.types import Channel, standard_artifacts
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter
from tfx.utils import json_utils

from components.optimizer import executor
from components.specs import (
    CODE_FINGERPRINT_KEY,
    EXAMPLES_KEY,
    MODEL_KEY,
    OPTIMIZED_MODEL_KEY,
    OPTIMIZER_SECTIONS,
    TRANSFORM_GRAPH_KEY,
)


class OptimizerSpec(ComponentSpec):
    # One JSON property per config section it reads (data, label, transform, training, optimize, evaluation,
    # calibration).
    PARAMETERS = {
        **{key: ExecutionParameter(type=str) for key in OPTIMIZER_SECTIONS},
        CODE_FINGERPRINT_KEY: ExecutionParameter(type=str),
    }
    INPUTS = {
        MODEL_KEY: ChannelParameter(type=standard_artifacts.Model),
        TRANSFORM_GRAPH_KEY: ChannelParameter(type=standard_artifacts.TransformGraph),
        # The Transform's transformed_examples, with train and eval splits (and calibration, when configured).
        EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples),
    }
    OUTPUTS = {OPTIMIZED_MODEL_KEY: ChannelParameter(type=standard_artifacts.Model)}


class Optimizer(base_component.BaseComponent):
    """Place it after the Trainer; feed `outputs["optimized_model"]` to the Evaluator, Exporter and Pusher.

    `sections` is `PipelineConfig.sections(*OPTIMIZER_SECTIONS)`.
    """

    SPEC_CLASS = OptimizerSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(self, model: Channel, transform_graph: Channel, examples: Channel, sections: dict[str, Any],
                 code_fingerprint: str = ""):
        super().__init__(spec=OptimizerSpec(
            model=model,
            transform_graph=transform_graph,
            examples=examples,
            code_fingerprint=code_fingerprint,
            optimized_model=Channel(type=standard_artifacts.Model),
            **{key: json_utils.dumps(sections[key]) for key in OPTIMIZER_SECTIONS},
        ))
