"""The plain function behind the data-validation gate: read ExampleValidator's anomalies."""
from __future__ import annotations

from dataclasses import dataclass

from tensorflow_metadata.proto.v0 import anomalies_pb2

from settings.errors import UserError


@dataclass(frozen=True)
class Anomaly:
    split: str
    feature: str
    reason: str

    def __str__(self) -> str:
        return f"[{self.split}] {self.feature}: {self.reason}"


class DataValidationError(UserError, RuntimeError):
    """The data broke the schema; carries each anomaly and where the full report is."""

    exit_code = 3
    prefix = "stopped by the data-validation gate"

    def __init__(self, anomalies: list[Anomaly], report_path: str):
        self.anomalies = anomalies
        self.report_path = report_path
        lines = "\n".join(f"  - {a}" for a in anomalies)
        super().__init__(
            f"the data does not match the schema ({len(anomalies)} anomalies); fix the data or review the schema:\n"
            f"{lines}\nfull report: {report_path}"
        )

    def __reduce__(self) -> tuple[type, tuple[list[Anomaly], str]]:
        # A gate run in a stage worker sends its verdict back pickled: it must arrive as itself, not as a crash.
        return type(self), (self.anomalies, self.report_path)


def read_anomalies(anomalies_uri: str, split_names: list[str]) -> list[Anomaly]:
    """Every anomaly ExampleValidator wrote under `anomalies_uri`, one entry per split and feature."""
    # Imported here: artifacts imports TensorFlow, and the CLI imports this module before a run diverts fd 2.
    from components import artifacts

    found = []
    for split in split_names:
        path = artifacts.join(artifacts.split_uri(anomalies_uri, split), artifacts.SCHEMA_DIFF_FILE)
        report = anomalies_pb2.Anomalies.FromString(artifacts.read_bytes(path))
        for feature, info in sorted(report.anomaly_info.items()):
            reasons = "; ".join(r.description or r.short_description for r in info.reason)
            found.append(Anomaly(split, feature, reasons or info.description))
        if report.HasField("dataset_anomaly_info"):
            reasons = "; ".join(r.description for r in report.dataset_anomaly_info.reason)
            found.append(Anomaly(split, "(dataset)", reasons))
    return found


def check_anomalies(anomalies_uri: str, split_names: list[str]) -> None:
    """Raises DataValidationError when ExampleValidator found anything."""
    found = read_anomalies(anomalies_uri, split_names)
    if found:
        raise DataValidationError(found, anomalies_uri)
