"""Publisher: replaces TFX's Pusher. A blessed model whose export verified becomes the next integer version of the
model repository (staged, checksummed, then made visible in one step: a rename locally, a MANIFEST.json created last
on gs://); publishing routes no traffic, a rollout does."""
from tfx.dsl.components.base import base_component, executor_spec
from tfx.types import Channel, standard_artifacts
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from components.publisher import executor


class PublisherSpec(ComponentSpec):
    PARAMETERS = {
        "serving_base_dir": ExecutionParameter(type=str),
        "model_name": ExecutionParameter(type=str),
    }
    INPUTS = {
        "model": ChannelParameter(type=standard_artifacts.Model),
        "model_blessing": ChannelParameter(type=standard_artifacts.ModelBlessing),
        # What the model was trained on, copied into the version for `mlops monitor`.
        "schema": ChannelParameter(type=standard_artifacts.Schema, optional=True),
        "statistics": ChannelParameter(type=standard_artifacts.ExampleStatistics, optional=True),
    }
    OUTPUTS = {"pushed_model": ChannelParameter(type=standard_artifacts.PushedModel)}


class Publisher(base_component.BaseComponent):
    """`model` is the Exporter's output (SavedModel at the root of its serving folder, the other formats beside);
    `schema` and `statistics` (its train split), when given, travel with the version."""

    SPEC_CLASS = PublisherSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(self, model: Channel, model_blessing: Channel, serving_base_dir: str, model_name: str,
                 schema: Channel | None = None, statistics: Channel | None = None):
        super().__init__(spec=PublisherSpec(
            model=model,
            model_blessing=model_blessing,
            schema=schema,
            statistics=statistics,
            serving_base_dir=serving_base_dir,
            model_name=model_name,
            pushed_model=Channel(type=standard_artifacts.PushedModel),
        ))
