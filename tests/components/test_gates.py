"""The data-validation gate: TFDV statistics of small taxi CSVs, judged by TFX's ExampleValidator against the curated
schema, stop the run for an anomaly in any one split or in the dataset as a whole, and only then."""
import json

import pandas as pd
import pytest
import tensorflow_data_validation as tfdv
from tensorflow_metadata.proto.v0 import anomalies_pb2, schema_pb2
from tfx.components.example_validator.executor import Executor as ExampleValidatorExecutor
from tfx.types import artifact_utils, standard_artifacts

from components.gates.anomalies import Anomaly, DataValidationError, check_anomalies, read_anomalies
from components.gates.executor import Executor as GateExecutor
from settings.config import DEFAULT_CONFIG

SCHEMA_PATH = DEFAULT_CONFIG.parent / "taxi_schema.pbtxt"


def write_report(folder, split, anomalies):
    report = anomalies_pb2.Anomalies()
    for feature, description in anomalies.items():
        info = report.anomaly_info[feature]
        info.reason.add(type=anomalies_pb2.AnomalyInfo.ENUM_TYPE_UNEXPECTED_STRING_VALUES, description=description)
    path = folder / f"Split-{split}"
    path.mkdir(parents=True)
    (path / "SchemaDiff.pb").write_bytes(report.SerializeToString())
    return report


def test_clean_report_passes(tmp_path):
    write_report(tmp_path, "train", {})
    write_report(tmp_path, "eval", {})
    assert read_anomalies(str(tmp_path), ["train", "eval"]) == []
    check_anomalies(str(tmp_path), ["train", "eval"])


def test_anomalies_are_named_with_split_and_reason(tmp_path):
    write_report(tmp_path, "train", {"payment_type": "Examples contain values missing from the schema: Bitcoin."})
    write_report(tmp_path, "eval", {})
    with pytest.raises(DataValidationError) as error:
        check_anomalies(str(tmp_path), ["train", "eval"])
    assert [str(a) for a in error.value.anomalies] == [
        "[train] payment_type: Examples contain values missing from the schema: Bitcoin."
    ]
    assert error.value.report_path == str(tmp_path)
    assert str(error.value) == (
        "the data does not match the schema (1 anomalies); fix the data or review the schema:\n"
        "  - [train] payment_type: Examples contain values missing from the schema: Bitcoin.\n"
        f"full report: {tmp_path}"
    )


def test_the_message_lists_every_anomaly_of_every_split(tmp_path):
    write_report(tmp_path, "train", {"fare": "Unexpectedly small value: -1.", "company": "Unexpected data type"})
    write_report(tmp_path, "eval", {"trip_start_hour": "Unexpectedly large value: 24."})
    with pytest.raises(DataValidationError) as error:
        check_anomalies(str(tmp_path), ["train", "eval"])
    assert str(error.value) == (
        "the data does not match the schema (3 anomalies); fix the data or review the schema:\n"
        "  - [train] company: Unexpected data type\n"
        "  - [train] fare: Unexpectedly small value: -1.\n"
        "  - [eval] trip_start_hour: Unexpectedly large value: 24.\n"
        f"full report: {tmp_path}"
    )


def test_every_reason_is_kept_and_short_descriptions_fill_in(tmp_path):
    report = anomalies_pb2.Anomalies()
    fare = report.anomaly_info["fare"]
    fare.reason.add(description="Unexpectedly small value: -1.")
    fare.reason.add(short_description="Unexpected data type")
    report.anomaly_info["company"].description = "described on the feature only"
    report.dataset_anomaly_info.reason.add(description="The dataset has 5 examples, which is fewer than expected.")
    report.dataset_anomaly_info.reason.add(description="second reason")
    (tmp_path / "Split-eval").mkdir()
    (tmp_path / "Split-eval" / "SchemaDiff.pb").write_bytes(report.SerializeToString())
    assert read_anomalies(str(tmp_path), ["eval"]) == [
        Anomaly("eval", "company", "described on the feature only"),
        Anomaly("eval", "fare", "Unexpectedly small value: -1.; Unexpected data type"),
        Anomaly("eval", "(dataset)", "The dataset has 5 examples, which is fewer than expected.; second reason"),
    ]


# --- Realistic anomalies: the taxi sample's rows, TFDV statistics, TFX's ExampleValidator, the gate's executor. ---


@pytest.fixture(scope="module")
def schema():
    return tfdv.load_schema_text(str(SCHEMA_PATH))


@pytest.fixture(scope="module")
def taxi_rows(taxi_slice, schema):
    """The first 400 rows of the taxi sample, typed as the schema says (INT columns keep their empty cells)."""
    rows = pd.read_csv(taxi_slice / "data.csv", nrows=400)
    for feature in schema.feature:
        if feature.type == schema_pb2.INT:
            rows[feature.name] = rows[feature.name].astype("Int64")
    return rows


def validate(folder, splits, schema):
    """StatisticsGen's and ExampleValidator's outputs for `splits` (name -> rows): the anomalies artifact."""
    statistics = standard_artifacts.ExampleStatistics()
    statistics.uri = str(folder / "statistics")
    statistics.split_names = artifact_utils.encode_split_names(list(splits))
    for split, rows in splits.items():
        path = folder / "statistics" / f"Split-{split}"
        path.mkdir(parents=True)
        (path / "FeatureStats.pb").write_bytes(tfdv.generate_statistics_from_dataframe(rows).SerializeToString())
    schema_artifact = standard_artifacts.Schema()
    schema_artifact.uri = str(folder / "schema")
    (folder / "schema").mkdir()
    tfdv.write_schema_text(schema, str(folder / "schema" / "schema.pbtxt"))
    anomalies = standard_artifacts.ExampleAnomalies()
    anomalies.uri = str(folder / "anomalies")
    ExampleValidatorExecutor().Do({"statistics": [statistics], "schema": [schema_artifact]},
                                  {"anomalies": [anomalies]}, {"exclude_splits": json.dumps([])})
    return anomalies


def run_gate(anomalies):
    """The DataValidationGate's executor on ExampleValidator's output, as the pipeline runs it."""
    GateExecutor().Do({"anomalies": [anomalies]}, {}, {})


def gate_failure(anomalies):
    with pytest.raises(DataValidationError) as error:
        run_gate(anomalies)
    assert error.value.report_path == anomalies.uri
    return error.value.anomalies


def with_value(rows, row, column, value):
    changed = rows.copy()
    changed.loc[row, column] = value
    return changed


def test_clean_taxi_splits_pass_the_gate(tmp_path, taxi_rows, schema):
    anomalies = validate(tmp_path, {"train": taxi_rows[:300], "eval": taxi_rows[300:]}, schema)
    run_gate(anomalies)
    assert read_anomalies(anomalies.uri, ["train", "eval"]) == []


def test_an_anomaly_only_in_the_eval_split_stops_the_run(tmp_path, taxi_rows, schema):
    evaluation = with_value(taxi_rows[300:], 350, "payment_type", "Bitcoin")
    anomalies = validate(tmp_path, {"train": taxi_rows[:300], "eval": evaluation}, schema)
    [anomaly] = gate_failure(anomalies)
    assert (anomaly.split, anomaly.feature) == ("eval", "payment_type")
    assert "Bitcoin" in anomaly.reason


@pytest.mark.parametrize("hour, passes", [(23, True), (24, False)])
def test_an_anomaly_only_in_the_train_split_stops_the_run(tmp_path, taxi_rows, schema, hour, passes):
    # The schema's trip_start_hour domain is [0, 23]: 23 is just inside, 24 just outside.
    train = with_value(taxi_rows[:300], 10, "trip_start_hour", hour)
    anomalies = validate(tmp_path, {"train": train, "eval": taxi_rows[300:]}, schema)
    if passes:
        run_gate(anomalies)
        return
    [anomaly] = gate_failure(anomalies)
    assert (anomaly.split, anomaly.feature) == ("train", "trip_start_hour")
    assert "24" in anomaly.reason


@pytest.mark.parametrize("eval_rows, passes", [(100, True), (99, False)])
def test_too_few_examples_is_a_dataset_anomaly(tmp_path, taxi_rows, schema, eval_rows, passes):
    # A data contract that wants at least 100 examples per split: 100 are just enough, 99 are too few.
    contract = schema_pb2.Schema()
    contract.CopyFrom(schema)
    contract.dataset_constraints.min_examples_count = 100
    anomalies = validate(tmp_path, {"train": taxi_rows[:300], "eval": taxi_rows[300:300 + eval_rows]}, contract)
    if passes:
        run_gate(anomalies)
        return
    assert gate_failure(anomalies) == [
        Anomaly("eval", "(dataset)", "The dataset has 99 examples, which is fewer than expected.")
    ]
