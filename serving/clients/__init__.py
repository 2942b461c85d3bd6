"""Python clients for TF Serving over REST or gRPC, and the values they send and read."""
from __future__ import annotations

from serving.clients.base import DEFAULT_TIMEOUT_S, ServingClient
from serving.clients.errors import (
    InvalidInputError,
    ModelNotFoundError,
    ServingError,
    ServingTimeoutError,
    ServingUnavailableError,
    error_for,
)
from serving.clients.transports import HTTP_STATUS_TO_CODE, GrpcClient, RestClient, connect
from serving.clients.values import (
    FLOAT_DTYPES,
    INT_DTYPES,
    NUMPY_DTYPES,
    ModelMetadata,
    SignatureSpec,
    TensorSpec,
    VersionStatus,
    convert_value,
    format_prediction,
    missing_value,
    numeric_values,
    parse_model_status,
    parse_signature_defs,
    rows_to_columns,
)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "FLOAT_DTYPES",
    "GrpcClient",
    "HTTP_STATUS_TO_CODE",
    "INT_DTYPES",
    "InvalidInputError",
    "ModelMetadata",
    "ModelNotFoundError",
    "NUMPY_DTYPES",
    "RestClient",
    "ServingClient",
    "ServingError",
    "ServingTimeoutError",
    "ServingUnavailableError",
    "SignatureSpec",
    "TensorSpec",
    "VersionStatus",
    "connect",
    "convert_value",
    "error_for",
    "format_prediction",
    "missing_value",
    "numeric_values",
    "parse_model_status",
    "parse_signature_defs",
    "rows_to_columns",
]
