"""The gate of `mlops monitor`: every served feature's distance from its training distribution (skew) and from the
window before (drift), measured by TFDV's comparators and held to the feature's threshold, and the served data checked
against the training schema in its SERVING environment.

A categorical feature (strings) is measured by the L-infinity distance between its value shares, a numeric one
(integers too) by the approximate Jensen-Shannon divergence between its quantile histograms; each distance lies in
[0, 1] and crosses its threshold when it is above it, as TFDV reports an anomaly.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tensorflow_metadata.proto.v0 import anomalies_pb2, schema_pb2, statistics_pb2

from settings.config import CATEGORICAL, NUMERIC, MonitoringConfig, feature_kind

MEASURES = {CATEGORICAL: "L-infinity distance", NUMERIC: "Jensen-Shannon divergence"}
SERVING = "SERVING"
# Where dataset-wide anomalies (too few examples, ...) are listed among the features.
DATASET = "(dataset)"
_MEASUREMENT_TYPES = {CATEGORICAL: anomalies_pb2.DriftSkewInfo.Measurement.L_INFTY,
                      NUMERIC: anomalies_pb2.DriftSkewInfo.Measurement.JENSEN_SHANNON_DIVERGENCE}
_MEASUREMENTS = {"skew": "skew_measurements", "drift": "drift_measurements"}
# The reasons TFDV gives for a comparator's distance; every other reason is the schema's.
_COMPARATOR_REASONS = {
    anomalies_pb2.AnomalyInfo.COMPARATOR_L_INFTY_HIGH,
    anomalies_pb2.AnomalyInfo.COMPARATOR_JENSEN_SHANNON_DIVERGENCE_HIGH,
    anomalies_pb2.AnomalyInfo.COMPARATOR_NORMALIZED_ABSOLUTE_DIFFERENCE_HIGH,
    anomalies_pb2.AnomalyInfo.COMPARATOR_LOW_NUM_EXAMPLES,
    anomalies_pb2.AnomalyInfo.COMPARATOR_HIGH_NUM_EXAMPLES,
}


def threshold(monitoring: MonitoringConfig, name: str, kind: str, comparison: str) -> float:
    """The threshold of `comparison` (skew or drift) for feature `name`: its own, else its kind's default."""
    own = monitoring.features.get(name)
    value = getattr(own, comparison) if own is not None else None
    return value if value is not None else getattr(monitoring, f"{kind}_{comparison}")


def serving_schema(schema: schema_pb2.Schema, served: Iterable[str], monitoring: MonitoringConfig
                   ) -> tuple[schema_pb2.Schema, dict[str, str]]:
    """The training schema for the served features, and each served feature's kind: the features the requests do
    not carry (the label, columns the model does not take) are left out of the SERVING environment, and each served
    one gets its kind's skew and drift comparators at its thresholds."""
    schema = schema_pb2.Schema.FromString(schema.SerializeToString())
    served = set(served)
    if SERVING not in schema.default_environment:
        schema.default_environment.append(SERVING)
    kinds = {}
    for feature in schema.feature:
        if feature.name not in served:
            if SERVING not in feature.not_in_environment:
                feature.not_in_environment.append(SERVING)
            continue
        kind = kinds[feature.name] = feature_kind(feature)
        for comparison, comparator in (("skew", feature.skew_comparator), ("drift", feature.drift_comparator)):
            comparator.Clear()
            value = threshold(monitoring, feature.name, kind, comparison)
            if kind == CATEGORICAL:
                comparator.infinity_norm.threshold = value
            else:
                comparator.jensen_shannon_divergence.threshold = value
                # Equal-width buckets stretched by outliers put two samples of the same taxi data 0.7 apart.
                comparator.jensen_shannon_divergence.source.type = schema_pb2.HistogramSelection.QUANTILES
    return schema, kinds


@dataclass(frozen=True)
class Distance:
    measure: str
    value: float
    threshold: float

    @property
    def crossed(self) -> bool:
        return self.value > self.threshold


@dataclass(frozen=True)
class FeatureVerdict:
    name: str
    kind: str
    skew: Distance | None
    drift: Distance | None
    # What the served data breaks of the training schema (values outside its domain, missing required values).
    anomalies: tuple[str, ...] = ()

    @property
    def flagged(self) -> bool:
        return bool(self.anomalies) or any(d is not None and d.crossed for d in (self.skew, self.drift))


def _name(path: Any) -> str:
    return ".".join(path.step)


def measured(anomalies: anomalies_pb2.Anomalies, kinds: dict[str, str], comparison: str) -> dict[str, Distance]:
    """The distances TFDV measured (drift_skew_info), per feature of a known kind, with their thresholds."""
    distances = {}
    for info in anomalies.drift_skew_info:
        name = _name(info.path)
        if name not in kinds:
            continue
        for measurement in getattr(info, _MEASUREMENTS[comparison]):
            if measurement.type == _MEASUREMENT_TYPES[kinds[name]]:
                distances[name] = Distance(MEASURES[kinds[name]], measurement.value, measurement.threshold)
    return distances


def _description(reason: anomalies_pb2.AnomalyInfo.Reason) -> str:
    return reason.description or reason.short_description or anomalies_pb2.AnomalyInfo.Type.Name(reason.type)


def schema_anomalies(anomalies: anomalies_pb2.Anomalies) -> dict[str, list[str]]:
    """Per feature (and DATASET), the reasons the data breaks the schema, the comparators' reasons left out."""
    found = {}
    for name, info in sorted(anomalies.anomaly_info.items()):
        reasons = [_description(r) for r in info.reason if r.type not in _COMPARATOR_REASONS]
        if reasons:
            found[name] = reasons
    dataset = [_description(r) for r in anomalies.dataset_anomaly_info.reason if r.type not in _COMPARATOR_REASONS]
    if dataset:
        found[DATASET] = dataset
    return found


def enough(requests: int, min_requests: int) -> bool:
    """Whether a window holds requests enough for its distances to mean more than sampling noise."""
    return requests >= min_requests


# The window before must hold at least this share of the judged window's requests: a drift distance's sampling
# noise grows with 1/n of the smaller window, and the thresholds are set for windows of the judged size.
COMPARABLE_SHARE = 0.5


def previous_window_problem(previous_requests: int, requests: int, min_requests: int) -> str:
    """Why drift cannot be judged against the window before ('' when it can): fewer than `min_requests`, or under
    COMPARABLE_SHARE of the judged window's `requests`."""
    if not enough(previous_requests, min_requests):
        return f"fewer than monitoring.min_requests ({min_requests:,}) to judge drift"
    if previous_requests < COMPARABLE_SHARE * requests:
        return (f"under {COMPARABLE_SHARE:.0%} of the judged window's {requests:,} requests: too few to judge drift "
                "against")
    return ""


def judge(schema: schema_pb2.Schema, training: Any, serving: Any, previous: Any | None,
          monitoring: MonitoringConfig) -> list[FeatureVerdict]:
    """A verdict per served feature (and one per anomaly outside any), from TFDV statistics: the training split's,
    the window's and, when given, the previous window's (None: no drift measured)."""
    import tensorflow_data_validation as tfdv

    served = [_name(f.path) or f.name for f in serving.datasets[0].features]
    comparing, kinds = serving_schema(schema, served, monitoring)
    checked = tfdv.validate_statistics(serving, comparing, environment=SERVING, previous_statistics=previous)
    skewed = tfdv.validate_statistics(training, comparing, serving_statistics=serving)
    # Without previous statistics TFDV measures no drift.
    skew, drift = measured(skewed, kinds, "skew"), measured(checked, kinds, "drift")
    problems = schema_anomalies(checked)
    # A served feature the schema lacks has no comparator; its statistics' type still names its kind.
    types = {(_name(f.path) or f.name): f.type for f in serving.datasets[0].features}
    verdicts = []
    for name in sorted(set(kinds) | set(problems)):
        kind = kinds.get(name) or (CATEGORICAL if types.get(name) == statistics_pb2.FeatureNameStatistics.STRING
                                   else NUMERIC if name in types else "")
        verdicts.append(FeatureVerdict(name, kind, skew.get(name), drift.get(name), tuple(problems.get(name, ()))))
    return verdicts


def crossed(verdicts: Iterable[FeatureVerdict]) -> list[str]:
    """The features (or DATASET) a verdict flags: a distance above its threshold or a schema anomaly."""
    return [v.name for v in verdicts if v.flagged]
