"""TFMA metrics for multiclass and regression models, which the Evaluator loads by name from this module.

TFMA's own metrics need the number of classes when the pipeline is built (binarization options), but a multiclass
label's classes come from the data, known only once Transform ran. These metrics learn the class count from the
predictions. Both accumulate the mergeable sums of components/tasks.py (MulticlassStats, RegressionStats), so the
Evaluator's figures are those the Optimizer and the Exporter compute.

    BinaryMetric(name=...)       log_loss, with the probabilities clipped as everywhere else in the project
    MulticlassMetric(name=...)   macro_auc, accuracy, log_loss; precision and recall per class (sub key class_id)
    RegressionMetric(name=...)   rmse, mae, r2
"""
from __future__ import annotations

from typing import Any

import apache_beam as beam
import numpy as np
from tensorflow_model_analysis.metrics import metric_types, metric_util

from components.tasks import BinaryStats, MulticlassStats, RegressionStats

BINARY_NAMES = ("log_loss",)
MULTICLASS_NAMES = ("macro_auc", "accuracy", "log_loss", "precision", "recall")
REGRESSION_NAMES = ("rmse", "mae", "r2")


class _StatsCombiner(beam.CombineFn):
    """Feeds each example's label, prediction and weight into a stats object; emits its figure(s) under `key`."""

    def __init__(self, key: metric_types.MetricKey, eval_config: Any, example_weighted: bool, stats: type):
        self._key = key
        self._eval_config = eval_config
        self._example_weighted = example_weighted
        self._stats = stats

    def create_accumulator(self) -> Any:
        return self._stats()

    def add_input(self, accumulator: Any, element: metric_types.StandardMetricInputs) -> Any:
        for label, prediction, weight in metric_util.to_label_prediction_example_weight(
            element, eval_config=self._eval_config, model_name=self._key.model_name,
            output_name=self._key.output_name, example_weighted=self._example_weighted, flatten=False,
            require_single_example_weight=True,
        ):
            self._add(accumulator, np.asarray(label).reshape(-1), np.asarray(prediction).reshape(-1), float(weight))
        return accumulator

    def _add(self, accumulator: Any, label: np.ndarray, prediction: np.ndarray, weight: float) -> None:
        if isinstance(accumulator, MulticlassStats):
            accumulator.add(int(label[0]), prediction, weight)
        else:
            accumulator.add(float(label[0]), float(prediction[0]), weight)

    def merge_accumulators(self, accumulators: Any) -> Any:
        accumulators = iter(accumulators)
        result = next(accumulators)
        for accumulator in accumulators:
            result.merge(accumulator)
        return result

    def extract_output(self, accumulator: Any) -> dict[metric_types.MetricKey, Any]:
        figures = accumulator.metrics()
        value = figures[self._key.name]
        if not isinstance(value, list):
            return {self._key: value}
        # Per class: the key with the class id as its sub key, as TFMA's binarized metrics name theirs.
        return {self._key._replace(sub_key=metric_types.SubKey(class_id=i)): v for i, v in enumerate(value)}


def _computations(stats: type, names: tuple[str, ...]):
    def create(name: str = "", eval_config: Any = None, model_name: str = "", output_name: str = "",
               example_weighted: bool = False, sub_key: Any = None, **_: Any) -> metric_types.MetricComputations:
        if name not in names:
            raise ValueError(f"{stats.__name__} computes {', '.join(names)}, not {name!r}.")
        key = metric_types.MetricKey(name=name, model_name=model_name, output_name=output_name, sub_key=sub_key,
                                     example_weighted=example_weighted)
        return [metric_types.MetricComputation(
            keys=[key], preprocessors=None,
            combiner=_StatsCombiner(key, eval_config, example_weighted, stats))]

    return metric_util.merge_per_key_computations(create)


class BinaryMetric(metric_types.Metric):
    """The log loss of a sigmoid model with 0/1 labels."""

    def __init__(self, name: str = "log_loss", **kwargs: Any):
        super().__init__(_computations(BinaryStats, BINARY_NAMES), name=name, **kwargs)


class MulticlassMetric(metric_types.Metric):
    """One figure of a softmax model with integer labels (0 .. classes - 1): macro_auc (one-vs-rest AUC per class,
    averaged), accuracy (argmax), log_loss, or precision / recall per class."""

    def __init__(self, name: str = "macro_auc", **kwargs: Any):
        super().__init__(_computations(MulticlassStats, MULTICLASS_NAMES), name=name, **kwargs)


class RegressionMetric(metric_types.Metric):
    """One figure of a regression model: rmse, mae or r2 (the coefficient of determination)."""

    def __init__(self, name: str = "rmse", **kwargs: Any):
        super().__init__(_computations(RegressionStats, REGRESSION_NAMES), name=name, **kwargs)
