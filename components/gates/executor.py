"""Executor of the data-validation gate: anomalies artifact in, check_anomalies, nothing out."""
from typing import Any

from tfx.dsl.components.base import base_executor
from tfx.types import artifact_utils

from components.gates.anomalies import check_anomalies
from components.specs import ANOMALIES_KEY


class Executor(base_executor.BaseExecutor):
    def Do(self, input_dict: dict[str, list[Any]], output_dict: dict[str, list[Any]], exec_properties: dict) -> None:
        anomalies = artifact_utils.get_single_instance(input_dict[ANOMALIES_KEY])
        check_anomalies(anomalies.uri, artifact_utils.decode_split_names(anomalies.split_names))
