import pytest
from tensorflow_metadata.proto.v0 import anomalies_pb2

from components.gates.anomalies import DataValidationError, check_anomalies, read_anomalies


def write_report(folder, split, anomalies):
    report = anomalies_pb2.Anomalies()
    for feature, description in anomalies.items():
        info = report.anomaly_info[feature]
        info.reason.add(type=anomalies_pb2.AnomalyInfo.ENUM_TYPE_UNEXPECTED_STRING_VALUES, description=description)
    path = folder / f"Split-{split}"
    path.mkdir(parents=True)
    (path / "SchemaDiff.pb").write_bytes(report.SerializeToString())


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
    assert "payment_type" in str(error.value) and str(tmp_path) in str(error.value)
