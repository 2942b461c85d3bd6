"""DataValidationGate: fails the run when ExampleValidator reports anomalies, so nothing downstream runs."""
from tfx.dsl.components.base import base_component, executor_spec
from tfx.types import standard_artifacts
from tfx.types.component_spec import ChannelParameter, ComponentSpec

from components.gates import executor
from components.specs import ANOMALIES_KEY


class DataValidationGateSpec(ComponentSpec):
    PARAMETERS = {}
    INPUTS = {ANOMALIES_KEY: ChannelParameter(type=standard_artifacts.ExampleAnomalies)}
    OUTPUTS = {}


class DataValidationGate(base_component.BaseComponent):
    """Place it after ExampleValidator and make Transform depend on it (`add_upstream_node`)."""

    SPEC_CLASS = DataValidationGateSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(self, anomalies):
        super().__init__(spec=DataValidationGateSpec(anomalies=anomalies))
