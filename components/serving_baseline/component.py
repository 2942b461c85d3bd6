"""ServingBaseline: the Evaluator's baseline, read from the model repository the Publisher writes (the version
labelled stable, or the newest blessed one) and handed over as a Model artifact; the first run gets an empty one,
which the Evaluator's executor (components/serving_baseline/evaluator.py) treats as no baseline."""
from tfx.dsl.components.base import base_component, executor_spec
from tfx.types import Channel, standard_artifacts
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from components.serving_baseline import executor
from components.specs import CODE_FINGERPRINT_KEY, MODEL_KEY

SERVING_BASE_DIR_KEY = "serving_base_dir"
MODEL_NAME_KEY = "model_name"
RULE_KEY = "rule"
REPOSITORY_STATE_KEY = "repository_state"


class ServingBaselineSpec(ComponentSpec):
    PARAMETERS = {
        SERVING_BASE_DIR_KEY: ExecutionParameter(type=str),
        MODEL_NAME_KEY: ExecutionParameter(type=str),
        RULE_KEY: ExecutionParameter(type=str),
        # A digest of the repository when the pipeline was built (local runs; empty on a cluster, whose cache is
        # switched off for this step instead): TFX's cache keys on properties.
        REPOSITORY_STATE_KEY: ExecutionParameter(type=str),
        CODE_FINGERPRINT_KEY: ExecutionParameter(type=str),
    }
    INPUTS = {}
    OUTPUTS = {MODEL_KEY: ChannelParameter(type=standard_artifacts.Model)}


class ServingBaseline(base_component.BaseComponent):
    """`rule` is evaluation.baseline (stable or published_blessed); give the Evaluator `outputs["model"]` as its
    baseline_model and components.serving_baseline.evaluator.Executor as its executor."""

    SPEC_CLASS = ServingBaselineSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(self, serving_base_dir: str, model_name: str, rule: str, repository_state: str = "",
                 code_fingerprint: str = ""):
        super().__init__(spec=ServingBaselineSpec(
            serving_base_dir=serving_base_dir,
            model_name=model_name,
            rule=rule,
            repository_state=repository_state,
            code_fingerprint=code_fingerprint,
            **{MODEL_KEY: Channel(type=standard_artifacts.Model)},
        ))
