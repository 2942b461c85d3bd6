"""What the clients send and read: raw feature values converted to a signature's dtypes (None, "" and NaN become
the model's missing markers), the signatures and version states of TF Serving's answers, and outputs as plain rows."""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from serving.clients.errors import InvalidInputError, ServingError
from settings.csv_header import feature_name

FLOAT_DTYPES = frozenset({"DT_FLOAT", "DT_DOUBLE", "DT_HALF", "DT_BFLOAT16"})
INT_DTYPES = frozenset({"DT_INT8", "DT_INT16", "DT_INT32", "DT_INT64", "DT_UINT8", "DT_UINT16"})
NUMPY_DTYPES = {
    "DT_FLOAT": np.float32, "DT_DOUBLE": np.float64, "DT_HALF": np.float16,
    "DT_INT8": np.int8, "DT_INT16": np.int16, "DT_INT32": np.int32, "DT_INT64": np.int64,
    "DT_UINT8": np.uint8, "DT_UINT16": np.uint16, "DT_STRING": object, "DT_BOOL": np.bool_,
}


@dataclass(frozen=True)
class TensorSpec:
    dtype: str  # e.g. "DT_FLOAT"
    shape: tuple[int, ...] | None  # -1 for any size; None for unknown rank


@dataclass(frozen=True)
class SignatureSpec:
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]


@dataclass(frozen=True)
class ModelMetadata:
    name: str
    version: int
    signatures: dict[str, SignatureSpec]


@dataclass(frozen=True)
class VersionStatus:
    version: int
    state: str  # START, LOADING, AVAILABLE, UNLOADING, END
    error_code: str
    error_message: str


def missing_value(dtype: str) -> Any:
    """The marker a model reads as "missing": NaN for floats, -1 for integers, "" for strings."""
    if dtype in FLOAT_DTYPES:
        return math.nan
    if dtype in INT_DTYPES:
        return -1
    if dtype == "DT_STRING":
        return ""
    if dtype == "DT_BOOL":
        return False
    raise InvalidInputError(f"Inputs of type {dtype} are not supported by this client.", "INVALID_ARGUMENT")


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, str) and not value.strip():
        return True
    return isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral) and math.isnan(value)


def _bad_value(value: Any, dtype: str, feature: str) -> InvalidInputError:
    return InvalidInputError(
        f"Feature {feature!r} expects {dtype} but got {value!r} ({type(value).__name__}); fix the value or leave it "
        "empty for missing.",
        "INVALID_ARGUMENT",
    )


def convert_value(value: Any, dtype: str, feature: str) -> Any:
    """One raw feature value as a Python value of `dtype`; raises InvalidInputError naming the feature."""
    if _is_missing(value):
        return missing_value(dtype)
    if isinstance(value, (bool, np.bool_)) and dtype != "DT_BOOL":
        raise _bad_value(value, dtype, feature)
    if dtype in FLOAT_DTYPES:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise _bad_value(value, dtype, feature) from None
    if dtype in INT_DTYPES:
        if isinstance(value, numbers.Integral):
            return int(value)
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise _bad_value(value, dtype, feature) from None
        if not number.is_integer():
            raise _bad_value(value, dtype, feature)
        return int(number)
    if dtype == "DT_STRING":
        if isinstance(value, str):
            return value
        if isinstance(value, bytes):
            return value.decode("utf-8")
        if isinstance(value, numbers.Integral):
            return str(int(value))
        raise _bad_value(value, dtype, feature)
    if dtype == "DT_BOOL":
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        raise _bad_value(value, dtype, feature)
    return missing_value(dtype)  # raises: unsupported dtype


def rows_to_columns(
    rows: list[Mapping[str, Any]], inputs: Mapping[str, TensorSpec], drop_unknown_features: bool = False
) -> dict[str, np.ndarray]:
    """Raw feature dicts as one array per signature input, in the declared dtype and shape.

    A feature absent from a row counts as missing. A key may be the CSV column's own name ("Bill Length (mm)"): it
    goes to the input that column became (`bill_length_mm`, settings/csv_header.py). A key the signature does not take
    is an error unless `drop_unknown_features` (e.g. a label column in evaluation data).
    """
    rows = [_by_feature_name(row, inputs) for row in rows]
    if not drop_unknown_features:
        for index, row in enumerate(rows):
            unknown = sorted(set(row) - set(inputs))
            if unknown:
                raise InvalidInputError(
                    f"Row {index} has features the model does not take: {unknown}; its inputs are {sorted(inputs)} "
                    "(drop the extra keys, or pass drop_unknown_features=True).",
                    "INVALID_ARGUMENT",
                )
    columns = {}
    for name, spec in inputs.items():
        values = [convert_value(row.get(name), spec.dtype, name) for row in rows]
        array = np.array(values, dtype=NUMPY_DTYPES.get(spec.dtype, object))
        if spec.shape is not None and len(spec.shape) == 2 and spec.shape[1] == 1:
            array = array.reshape(-1, 1)  # models exported with [batch, 1] features
        columns[name] = array
    return columns


def _by_feature_name(row: Mapping[str, Any], inputs: Mapping[str, TensorSpec]) -> Mapping[str, Any]:
    """`row` with each key the signature does not take, but whose column became one of its inputs, renamed to it."""
    renamed = {key: feature_name(key) for key in row if key not in inputs and feature_name(key) in inputs}
    if not renamed:
        return row
    taken = [key for key, name in renamed.items() if name in row or list(renamed.values()).count(name) > 1]
    if taken:
        raise InvalidInputError(f"The keys {sorted(taken)} name the same input twice; send each input once.",
                                "INVALID_ARGUMENT")
    return {renamed.get(key, key): value for key, value in row.items()}


def parse_signature_defs(signature_defs: Mapping[str, Any]) -> dict[str, SignatureSpec]:
    """SignatureDefMap in TF Serving's JSON form (REST metadata, or a gRPC message turned into a dict)."""

    def tensor_spec(info: Mapping[str, Any]) -> TensorSpec:
        shape_info = info.get("tensor_shape", {})
        if shape_info.get("unknown_rank"):
            return TensorSpec(info.get("dtype", "DT_INVALID"), None)
        shape = tuple(int(d.get("size", -1)) for d in shape_info.get("dim", []))
        return TensorSpec(info.get("dtype", "DT_INVALID"), shape)

    return {
        name: SignatureSpec(
            {k: tensor_spec(v) for k, v in signature.get("inputs", {}).items()},
            {k: tensor_spec(v) for k, v in signature.get("outputs", {}).items()},
        )
        for name, signature in signature_defs.items()
        if not name.startswith("__")
    }


def parse_model_status(body: Mapping[str, Any]) -> list[VersionStatus]:
    return [
        VersionStatus(
            int(row.get("version", 0)),
            row.get("state", "UNKNOWN"),
            row.get("status", {}).get("error_code", "OK"),
            row.get("status", {}).get("error_message", ""),
        )
        for row in body.get("model_version_status", [])
    ]


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.generic):
        return value.item()
    return value


def _rows_of(values: np.ndarray, rows: int, name: str) -> list[Any]:
    """One plain value (a number, a string, or a list of them) per row of an output; batch first."""
    if values.ndim == 0 or values.shape[0] != rows:
        raise ServingError(f"Output {name!r} has shape {list(values.shape)}; expected {rows} rows first.")
    if values.ndim == 1:
        return [_plain(v) for v in values]
    return [[_plain(v) for v in row.reshape(-1)] for row in values]


def numeric_values(outputs: Mapping[str, Any]) -> list[float]:
    """Every number of one row's outputs (the probabilities, or the value), flattened in output-name order."""
    found: list[float] = []
    for name in sorted(outputs):
        values = outputs[name] if isinstance(outputs[name], list) else [outputs[name]]
        found.extend(float(v) for v in values if isinstance(v, numbers.Real))
    return found


def format_prediction(outputs: Mapping[str, Any]) -> str:
    """One row's outputs as a line: the probability (binary), the value (regression), or the predicted class then
    every class's probability (multiclass)."""
    if "class" in outputs and "classes" in outputs and "probabilities" in outputs:
        pairs = " ".join(f"{name}={float(p):.6f}" for name, p in zip(outputs["classes"], outputs["probabilities"],
                                                                      strict=True))
        return f"{outputs['class']}  {pairs}"
    parts = []
    for name in sorted(outputs):
        value = outputs[name]
        if isinstance(value, list):
            value = " ".join(f"{v:.6f}" if isinstance(v, float) else str(v) for v in value)
        elif isinstance(value, float):
            value = f"{value:.6f}"
        parts.append(str(value) if len(outputs) == 1 else f"{name}={value}")
    return "  ".join(parts)
