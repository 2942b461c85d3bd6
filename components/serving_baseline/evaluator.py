"""TFX's Evaluator executor, with ServingBaseline's empty Model (no published version yet) read as no baseline:
the Evaluator then judges on the bounds alone, as on a first run with TFX's resolver."""
from typing import Any

from tfx.components.evaluator import executor as tfx_evaluator
from tfx.types import standard_component_specs

from components.serving_baseline.resolve import RESOLVED_PROPERTY

BASELINE_KEY = standard_component_specs.BASELINE_MODEL_KEY


def without_empty_baseline(input_dict: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """`input_dict` with the baseline left out when ServingBaseline found none."""
    baselines = input_dict.get(BASELINE_KEY) or []
    if baselines and all(b.has_custom_property(RESOLVED_PROPERTY)
                         and b.get_int_custom_property(RESOLVED_PROPERTY) == 0 for b in baselines):
        return {key: value for key, value in input_dict.items() if key != BASELINE_KEY}
    return input_dict


class Executor(tfx_evaluator.Executor):
    def Do(self, input_dict: dict[str, list[Any]], output_dict: dict[str, list[Any]], exec_properties: dict) -> None:
        super().Do(without_empty_baseline(input_dict), output_dict, exec_properties)
