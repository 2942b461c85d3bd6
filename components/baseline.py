"""Which model the Evaluator compares a candidate against (config `evaluation.baseline`).

Both baselines that resolve a model take the same two channels, a Model and a ModelBlessing, which is the form TFX's
Kubeflow V2 compiler accepts (it compiles only LatestBlessedModelStrategy and LatestArtifactStrategy, and the former
with exactly those two channels):

- previous_blessed (`PreviousBlessedModelStrategy`, local runs): the newest blessed model other than the candidate.
  TFX's LatestBlessedModelStrategy hands a re-run its own (cached) model as the baseline, which changes the
  Evaluator's inputs, defeats the cache and pushes the same model twice.
- latest_blessed (TFX's `LatestBlessedModelStrategy`): what Vertex AI Pipelines runs.
- none: no resolver and no comparison; open-source Kubeflow Pipelines v2 runs no resolver node at all.
"""
from __future__ import annotations

from typing import Any

from ml_metadata.proto import metadata_store_pb2
from tfx import types
from tfx.dsl.components.common import resolver
from tfx.dsl.input_resolution.strategies.latest_blessed_model_strategy import LatestBlessedModelStrategy
from tfx.types import standard_artifacts
from tfx.types.channel import Channel

from components.specs import MODEL_BLESSING_KEY, MODEL_KEY

# Custom properties that the Evaluator writes on each ModelBlessing.
_BLESSED = "blessed"
_CURRENT_MODEL_ID = "current_model_id"
_OUTPUT_EVENTS = (metadata_store_pb2.Event.OUTPUT, metadata_store_pb2.Event.DECLARED_OUTPUT)
RESOLVER_ID = "BaselineModelResolver"


def candidate_ids(store: Any, model_ids: list[int]) -> set[int]:
    """The models written, or reused from the cache, by the newest execution that output any of `model_ids`.

    The resolver runs as the Evaluator's input resolution, right after the candidate's producer ran in this run,
    so that execution is the newest one: cached executions record their reused outputs too.
    """
    events = [e for e in store.get_events_by_artifact_ids(model_ids) if e.type in _OUTPUT_EVENTS]
    if not events:
        return set()
    newest = max(e.execution_id for e in events)
    return {e.artifact_id for e in events if e.execution_id == newest}


class PreviousBlessedModelStrategy(resolver.ResolverStrategy):
    """The newest blessed model other than the candidate, from a Model and a ModelBlessing channel."""

    def resolve_artifacts(
        self, store: Any, input_dict: dict[str, list[types.Artifact]]
    ) -> dict[str, list[types.Artifact]] | None:
        models, blessings = input_dict.get(MODEL_KEY, []), input_dict.get(MODEL_BLESSING_KEY, [])
        result: dict[str, list[types.Artifact]] = {key: [] for key in input_dict}
        if not models or not blessings:
            return result
        candidates = candidate_ids(store, [m.id for m in models])
        blessed = {
            b.get_int_custom_property(_CURRENT_MODEL_ID): b
            for b in blessings
            if b.get_int_custom_property(_BLESSED) == 1
        }
        for model in sorted(models, key=lambda a: a.id, reverse=True):
            if model.id in blessed and model.id not in candidates:
                result[MODEL_KEY], result[MODEL_BLESSING_KEY] = [model], [blessed[model.id]]
                break
        return result


def baseline_resolver(kind: str, model_producer: str, model_key: str, evaluator: str,
                      blessing_key: str = "blessing") -> resolver.Resolver | None:
    """The resolver node for `evaluation.baseline` over the models `model_producer` wrote under `model_key` and the
    blessings `evaluator` wrote; None for "none"."""
    if kind == "none":
        return None
    strategies = {"previous_blessed": PreviousBlessedModelStrategy,
                  "latest_blessed": LatestBlessedModelStrategy}
    if kind not in strategies:
        raise ValueError(f"evaluation.baseline must be previous_blessed, latest_blessed or none; got {kind!r}.")
    return resolver.Resolver(
        strategy_class=strategies[kind],
        # Every run's output of the producer (not just this run's): earlier runs' models are the baselines.
        **{MODEL_KEY: Channel(type=standard_artifacts.Model, producer_component_id=model_producer,
                              output_key=model_key),
           MODEL_BLESSING_KEY: Channel(type=standard_artifacts.ModelBlessing, producer_component_id=evaluator,
                                       output_key=blessing_key)},
    ).with_id(RESOLVER_ID)
