"""The status and metadata responses both transports return, built as TF Serving's own protos."""
from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2

from serving.server.model_manager import VersionState
from serving.server.servable import ServableVersion

SIGNATURE_DEF_FIELD = "signature_def"


def model_status_response(states: list[VersionState]) -> get_model_status_pb2.GetModelStatusResponse:
    response = get_model_status_pb2.GetModelStatusResponse()
    for state in states:
        row = response.model_version_status.add()
        row.version = state.version
        row.state = get_model_status_pb2.ModelVersionStatus.State.Value(state.state)
        row.status.error_code = row.status.DESCRIPTOR.fields_by_name["error_code"].enum_type.values_by_name[
            state.error_code
        ].number
        row.status.error_message = state.error_message
    return response


def model_metadata_response(servable: ServableVersion) -> get_model_metadata_pb2.GetModelMetadataResponse:
    response = get_model_metadata_pb2.GetModelMetadataResponse()
    response.model_spec.name = servable.model_name
    response.model_spec.version.value = servable.version
    response.metadata[SIGNATURE_DEF_FIELD].Pack(servable.signature_def_map)
    return response


def message_to_json_dict(message) -> dict[str, Any]:
    """Proto to JSON the way TF Serving prints it: proto field names, default values included."""
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, including_default_value_fields=True
    )


def model_metadata_json(servable: ServableVersion) -> dict[str, Any]:
    """REST metadata body: TF Serving unpacks the Any, giving `metadata.signature_def.signature_def`."""
    return {
        "model_spec": {"name": servable.model_name, "signature_name": "", "version": str(servable.version)},
        "metadata": {SIGNATURE_DEF_FIELD: message_to_json_dict(servable.signature_def_map)},
    }
