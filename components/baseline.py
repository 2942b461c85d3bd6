"""Which model the Evaluator compares a candidate against."""
from __future__ import annotations

from typing import Any

from tfx import types
from tfx.dsl.components.common import resolver

# Custom properties that the Evaluator writes on each ModelBlessing.
_BLESSED = "blessed"
_CURRENT_MODEL_ID = "current_model_id"


class PreviousBlessedModelStrategy(resolver.ResolverStrategy):
    """The newest blessed model other than the candidate itself.

    TFX's LatestBlessedModelStrategy hands a re-run its own (cached) model as the baseline, which
    changes the Evaluator's inputs, defeats the cache and pushes the same model twice.
    """

    def resolve_artifacts(
        self, store: Any, input_dict: dict[str, list[types.Artifact]]
    ) -> dict[str, list[types.Artifact]] | None:
        candidates = {a.id for a in input_dict.get("candidate", [])}
        blessings = {
            b.get_int_custom_property(_CURRENT_MODEL_ID): b
            for b in input_dict["model_blessing"]
            if b.get_int_custom_property(_BLESSED) == 1
        }
        result = {key: [] for key in input_dict}
        for model in sorted(input_dict["model"], key=lambda a: a.id, reverse=True):
            if model.id in blessings and model.id not in candidates:
                result["model"], result["model_blessing"] = [model], [blessings[model.id]]
                break
        return result
