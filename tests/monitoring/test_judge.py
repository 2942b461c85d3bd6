"""The gate of `mlops monitor` (monitoring/judge.py) on TFDV statistics of taxi rows: each threshold (categorical and
numeric, skew and drift, a kind's default and a feature's own) just inside, exactly at and just outside the measured
distance; the served data against the training schema; which features a window leaves out; too few requests."""
from __future__ import annotations

import dataclasses

import pytest
import tensorflow_data_validation as tfdv
from tensorflow_metadata.proto.v0 import anomalies_pb2, schema_pb2

from monitoring import judge as gate
from settings.config import DEFAULT_CONFIG, MonitoringConfig, MonitoringFeatureConfig, load_config
from tests.monitoring.request_logs import csv_rows, feature_types, statistics_of

SCHEMA = tfdv.load_schema_text(str(DEFAULT_CONFIG.parent / "taxi_schema.pbtxt"))
EPSILON = 1e-6


@pytest.fixture(scope="module")
def rows(taxi_slice):
    """The slice's rows as requests carry them, every fifth one served, the ones before them served earlier, the
    other 1,200 trained on (the file is ordered by location: cut into blocks, its parts differ)."""
    types = feature_types(SCHEMA, load_config().features)
    everything = csv_rows(taxi_slice / "data.csv", types)
    return {"types": types, "train": [row for i, row in enumerate(everything) if i % 5 < 3],
            "before": everything[3::5], "served": everything[4::5]}


def shifted(rows):
    return [{**r, "fare": None if r["fare"] is None else r["fare"] * 3, "payment_type": b"Bitcoin"} for r in rows]


@pytest.fixture(scope="module")
def statistics(rows):
    types = rows["types"]
    return {name: statistics_of(rows[name], types) for name in ("train", "before", "served")} | {
        "shifted": statistics_of(shifted(rows["served"]), types)}


def verdicts(statistics, monitoring, serving="served", previous=None):
    found = gate.judge(SCHEMA, statistics["train"], statistics[serving],
                       statistics[previous] if previous else None, monitoring)
    return {v.name: v for v in found}


def test_served_rows_like_the_training_rows_cross_nothing(statistics):
    found = verdicts(statistics, MonitoringConfig(), previous="before")
    assert sorted(found) == sorted(load_config().features), "every served feature, and only those, is judged"
    assert gate.crossed(found.values()) == []
    for verdict in found.values():
        assert verdict.skew is not None and verdict.drift is not None, verdict.name
        assert verdict.anomalies == ()
    assert found["company"].skew.measure == "L-infinity distance" and found["company"].kind == gate.CATEGORICAL
    assert found["fare"].skew.measure == "Jensen-Shannon divergence" and found["fare"].kind == gate.NUMERIC


def test_a_shifted_number_and_an_unseen_value_are_flagged_and_nothing_else(statistics):
    found = verdicts(statistics, MonitoringConfig(), serving="shifted", previous="served")
    assert gate.crossed(found.values()) == ["fare", "payment_type"]
    assert found["fare"].skew.crossed and found["fare"].drift.crossed and found["fare"].anomalies == ()
    assert found["payment_type"].skew.value == pytest.approx(1.0) and found["payment_type"].drift.crossed
    [anomaly] = found["payment_type"].anomalies
    assert "Bitcoin" in anomaly


def test_no_previous_window_measures_no_drift(statistics):
    found = verdicts(statistics, MonitoringConfig())
    assert all(v.drift is None for v in found.values())
    assert all(v.skew is not None for v in found.values())


def _measured(statistics, feature, comparison, serving, previous):
    return getattr(verdicts(statistics, MonitoringConfig(), serving, previous)[feature], comparison).value


@pytest.mark.parametrize("feature, comparison, serving, previous, kind", [
    ("fare", "skew", "shifted", None, "numeric"),
    ("trip_miles", "skew", "served", None, "numeric"),
    ("company", "skew", "served", None, "categorical"),
    ("fare", "drift", "shifted", "served", "numeric"),
    ("company", "drift", "served", "before", "categorical"),
])
def test_each_kinds_default_threshold_at_the_measured_distance(statistics, feature, comparison, serving, previous,
                                                               kind):
    value = _measured(statistics, feature, comparison, serving, previous)
    assert 0 < value < 1
    key = f"{kind}_{comparison}"
    # The other comparison out of the way (no distance exceeds 1), so that this one alone decides.
    other = f"{kind}_{'drift' if comparison == 'skew' else 'skew'}"
    for limit, crossed in ((value + EPSILON, False), (value, False), (value - EPSILON, True)):
        monitoring = dataclasses.replace(MonitoringConfig(), **{key: limit, other: 1.0})
        verdict = verdicts(statistics, monitoring, serving, previous)[feature]
        distance = getattr(verdict, comparison)
        assert (distance.threshold, distance.crossed, verdict.flagged) == (limit, crossed, crossed), limit


@pytest.mark.parametrize("feature, comparison, serving, previous", [
    ("trip_miles", "skew", "served", None),
    ("company", "skew", "served", None),
    ("dropoff_latitude", "drift", "served", "before"),
    ("company", "drift", "served", "before"),
])
def test_a_features_own_threshold_overrides_its_kinds_and_only_its_own(statistics, feature, comparison, serving,
                                                                       previous):
    value = _measured(statistics, feature, comparison, serving, previous)
    for limit, crossed in ((value + EPSILON, False), (value, False), (value - EPSILON, True)):
        own = MonitoringFeatureConfig(**{comparison: limit})
        # The kinds' defaults at 0: every other feature with any distance crosses; this one keeps its own.
        monitoring = MonitoringConfig(categorical_skew=0.0, numeric_skew=0.0, categorical_drift=0.0, numeric_drift=0.0,
                                      features={feature: own})
        found = verdicts(statistics, monitoring, serving, previous)
        distance = getattr(found[feature], comparison)
        assert (distance.threshold, distance.crossed) == (limit, crossed), limit
        others = [getattr(v, comparison) for name, v in found.items() if name != feature]
        assert all(d.threshold == 0.0 for d in others)


def test_the_other_comparisons_threshold_is_not_the_one_overridden():
    monitoring = MonitoringConfig(numeric_skew=0.2, numeric_drift=0.3, categorical_skew=0.4, categorical_drift=0.5,
                                  features={"fare": MonitoringFeatureConfig(skew=0.01)})
    assert gate.threshold(monitoring, "fare", gate.NUMERIC, "skew") == 0.01
    assert gate.threshold(monitoring, "fare", gate.NUMERIC, "drift") == 0.3
    assert gate.threshold(monitoring, "trip_miles", gate.NUMERIC, "skew") == 0.2
    assert gate.threshold(monitoring, "company", gate.CATEGORICAL, "skew") == 0.4
    assert gate.threshold(monitoring, "company", gate.CATEGORICAL, "drift") == 0.5


def test_kinds_follow_the_schema_types():
    feature = schema_pb2.Feature(name="x", type=schema_pb2.BYTES)
    assert gate.feature_kind(feature) == gate.CATEGORICAL
    feature = schema_pb2.Feature(name="x", type=schema_pb2.INT)
    assert gate.feature_kind(feature) == gate.NUMERIC
    assert gate.feature_kind(schema_pb2.Feature(name="x", type=schema_pb2.FLOAT)) == gate.NUMERIC


def test_an_integer_the_schema_calls_categorical_is_compared_as_a_number(statistics, rows):
    # Its statistics hold a histogram and no value shares, so an L-infinity distance would always read 0.
    schema = schema_pb2.Schema.FromString(SCHEMA.SerializeToString())
    next(f for f in schema.feature if f.name == "trip_start_hour").int_domain.is_categorical = True
    late = [{**r, "trip_start_hour": 23} for r in rows["served"]]
    found = {v.name: v for v in gate.judge(schema, statistics["train"], statistics_of(late, rows["types"]), None,
                                           MonitoringConfig())}
    hour = found["trip_start_hour"]
    assert (hour.kind, hour.skew.measure) == (gate.NUMERIC, "Jensen-Shannon divergence") and hour.skew.crossed


def test_a_feature_sent_as_another_type_keeps_its_schema_kind_and_is_flagged(statistics, rows):
    types = {**rows["types"], "fare": rows["types"]["payment_type"]}
    texts = [{**r, "fare": None if r["fare"] is None else str(r["fare"]).encode()} for r in rows["served"]]
    found = verdicts({**statistics, "texts": statistics_of(texts, types)}, MonitoringConfig(), "texts")
    assert found["fare"].kind == gate.NUMERIC and found["fare"].anomalies
    assert "fare" in gate.crossed(found.values())


def test_the_serving_schema_leaves_out_what_requests_do_not_carry_and_compares_the_rest():
    monitoring = MonitoringConfig(numeric_skew=0.2, numeric_drift=0.3, categorical_skew=0.4, categorical_drift=0.5)
    schema, kinds = gate.serving_schema(SCHEMA, ["fare", "payment_type"], monitoring)
    assert kinds == {"fare": gate.NUMERIC, "payment_type": gate.CATEGORICAL}
    features = {f.name: f for f in schema.feature}
    assert list(features["tips"].not_in_environment) == ["SERVING"], "already out of SERVING: listed once"
    assert list(features["company"].not_in_environment) == ["SERVING"]
    assert list(features["fare"].not_in_environment) == []
    fare = features["fare"]
    assert fare.skew_comparator.jensen_shannon_divergence.threshold == 0.2
    assert fare.drift_comparator.jensen_shannon_divergence.threshold == 0.3
    assert fare.skew_comparator.jensen_shannon_divergence.source.type == schema_pb2.HistogramSelection.QUANTILES
    assert not fare.skew_comparator.HasField("infinity_norm")
    payment = features["payment_type"]
    assert payment.skew_comparator.infinity_norm.threshold == 0.4
    assert payment.drift_comparator.infinity_norm.threshold == 0.5
    assert not payment.skew_comparator.HasField("jensen_shannon_divergence")
    assert not any(f.HasField("skew_comparator") for f in SCHEMA.feature), "the training schema stays as it was"
    assert list(SCHEMA.feature[0].not_in_environment) == []


def test_a_schema_without_environments_gets_serving_and_old_comparators_are_replaced():
    schema = schema_pb2.Schema()
    feature = schema.feature.add(name="fare", type=schema_pb2.FLOAT)
    feature.skew_comparator.infinity_norm.threshold = 0.9
    schema.feature.add(name="tips", type=schema_pb2.FLOAT)
    served, kinds = gate.serving_schema(schema, ["fare"], MonitoringConfig())
    assert list(served.default_environment) == ["SERVING"]
    assert not served.feature[0].skew_comparator.HasField("infinity_norm")
    assert served.feature[0].skew_comparator.jensen_shannon_divergence.threshold == 0.25
    assert list(served.feature[1].not_in_environment) == ["SERVING"]
    again, _ = gate.serving_schema(served, ["fare"], MonitoringConfig())
    assert list(again.default_environment) == ["SERVING"]


def test_schema_anomalies_leave_the_comparators_reasons_out():
    anomalies = anomalies_pb2.Anomalies()
    info = anomalies.anomaly_info["payment_type"]
    info.reason.add(type=anomalies_pb2.AnomalyInfo.ENUM_TYPE_UNEXPECTED_STRING_VALUES, description="Bitcoin")
    info.reason.add(type=anomalies_pb2.AnomalyInfo.COMPARATOR_L_INFTY_HIGH, description="far")
    anomalies.anomaly_info["fare"].reason.add(type=anomalies_pb2.AnomalyInfo.COMPARATOR_JENSEN_SHANNON_DIVERGENCE_HIGH,
                                              description="far")
    anomalies.anomaly_info["company"].reason.add(type=anomalies_pb2.AnomalyInfo.SCHEMA_NEW_COLUMN,
                                                 short_description="New column")
    anomalies.anomaly_info["trip_miles"].reason.add(type=anomalies_pb2.AnomalyInfo.FLOAT_TYPE_SMALL_FLOAT)
    anomalies.dataset_anomaly_info.reason.add(type=anomalies_pb2.AnomalyInfo.DATASET_LOW_NUM_EXAMPLES,
                                              description="few")
    anomalies.dataset_anomaly_info.reason.add(type=anomalies_pb2.AnomalyInfo.COMPARATOR_LOW_NUM_EXAMPLES,
                                              description="fewer than before")
    assert gate.schema_anomalies(anomalies) == {"company": ["New column"], "payment_type": ["Bitcoin"],
                                                "trip_miles": ["FLOAT_TYPE_SMALL_FLOAT"], gate.DATASET: ["few"]}


def test_a_served_value_outside_the_schema_flags_its_feature_without_any_distance(statistics, rows):
    odd = [{**r, "trip_start_hour": 24} if i < 4 else r for i, r in enumerate(rows["served"])]
    found = verdicts({**statistics, "odd": statistics_of(odd, rows["types"])}, MonitoringConfig(), "odd")
    assert gate.crossed(found.values()) == ["trip_start_hour"]
    hour = found["trip_start_hour"]
    assert hour.anomalies and not hour.skew.crossed, "flagged by the schema, not by a distance"


def test_a_served_feature_the_schema_lacks_is_flagged_as_new(statistics, rows):
    types = {**rows["types"], "surge": rows["types"]["payment_type"]}
    extra = [{**r, "surge": b"yes"} for r in rows["served"]]
    found = verdicts({**statistics, "extra": statistics_of(extra, types)}, MonitoringConfig(), "extra")
    assert gate.crossed(found.values()) == ["surge"]
    assert found["surge"].kind == gate.CATEGORICAL and found["surge"].skew is None
    assert found["surge"].anomalies


@pytest.mark.parametrize("verdict, flagged", [
    (gate.FeatureVerdict("x", gate.NUMERIC, None, None), False),
    (gate.FeatureVerdict("x", gate.NUMERIC, gate.Distance("m", 0.2, 0.2), gate.Distance("m", 0.2, 0.2)), False),
    (gate.FeatureVerdict("x", gate.NUMERIC, gate.Distance("m", 0.3, 0.2), None), True),
    (gate.FeatureVerdict("x", gate.NUMERIC, None, gate.Distance("m", 0.3, 0.2)), True),
    (gate.FeatureVerdict("x", gate.NUMERIC, gate.Distance("m", 0.1, 0.2), None, ("out of range",)), True),
])
def test_what_flags_a_feature(verdict, flagged):
    assert verdict.flagged is flagged
    assert gate.crossed([verdict]) == (["x"] if flagged else [])


def test_a_window_needs_min_requests_to_be_judged():
    assert gate.enough(1000, 1000)
    assert gate.enough(1001, 1000)
    assert not gate.enough(999, 1000)


@pytest.mark.parametrize("previous, judged, problem", [
    (999, 1000, "fewer than monitoring.min_requests (1,000) to judge drift"),
    (1000, 2000, ""),
    (1000, 2001, "under 50% of the judged window's 2,001 requests: too few to judge drift against"),
    (1000, 1000, ""),
    (5000, 1000, ""),
])
def test_drift_needs_a_window_before_of_min_requests_and_half_the_judged_ones(previous, judged, problem):
    assert gate.previous_window_problem(previous, judged, 1000) == problem


def _info(anomalies, path, comparison, *measurements):
    info = anomalies.drift_skew_info.add()
    info.path.step.extend(path)
    for kind, value, limit in measurements:
        target = info.skew_measurements if comparison == "skew" else info.drift_measurements
        target.add(type=kind, value=value, threshold=limit)


def test_measured_distances_are_the_kinds_own_measure_per_feature_and_comparison():
    measurement = anomalies_pb2.DriftSkewInfo.Measurement
    anomalies = anomalies_pb2.Anomalies()
    _info(anomalies, ["unknown"], "skew", (measurement.L_INFTY, 0.9, 0.1))
    _info(anomalies, ["company"], "skew", (measurement.JENSEN_SHANNON_DIVERGENCE, 0.7, 0.2),
          (measurement.L_INFTY, 0.3, 0.1))
    _info(anomalies, ["fare"], "drift", (measurement.JENSEN_SHANNON_DIVERGENCE, 0.4, 0.25))
    _info(anomalies, ["trip", "miles"], "skew", (measurement.NORMALIZED_ABSOLUTE_DIFFERENCE, 0.5, 0.1),
          (measurement.JENSEN_SHANNON_DIVERGENCE, 0.05, 0.25))
    kinds = {"company": gate.CATEGORICAL, "fare": gate.NUMERIC, "trip.miles": gate.NUMERIC}
    assert gate.measured(anomalies, kinds, "skew") == {
        "company": gate.Distance("L-infinity distance", 0.3, 0.1),
        "trip.miles": gate.Distance("Jensen-Shannon divergence", 0.05, 0.25)}
    assert gate.measured(anomalies, kinds, "drift") == {"fare": gate.Distance("Jensen-Shannon divergence", 0.4, 0.25)}


def test_a_dataset_anomaly_and_an_unknown_numeric_column_get_their_own_verdicts(statistics, rows):
    schema = schema_pb2.Schema.FromString(SCHEMA.SerializeToString())
    schema.dataset_constraints.min_examples_count = 10_000
    types = {**rows["types"], "surge": rows["types"]["fare"]}
    extra = [{**r, "surge": 1.5} for r in rows["served"]]
    found = {v.name: v for v in gate.judge(schema, statistics["train"], statistics_of(extra, types), None,
                                           MonitoringConfig())}
    assert gate.crossed(found.values()) == [gate.DATASET, "surge"]
    assert (found[gate.DATASET].kind, found[gate.DATASET].skew) == ("", None) and found[gate.DATASET].anomalies
    assert found["surge"].kind == gate.NUMERIC and found["surge"].skew is None
