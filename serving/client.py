"""Python clients for TF Serving over REST or gRPC: the same calls work against the real server and the local one.

    with connect(rest="http://127.0.0.1:8501") as client:        # or connect(grpc="127.0.0.1:8500")
        client.predict({"fare": 12.5, "company": ""}, model="taxi", label="canary")  # -> [0.37]
        client.predict_outputs(rows, model="iris")   # -> [{"class": "setosa", "probabilities": [...], ...}]

Rows are raw feature dicts. The client asks the server for the signature's inputs and converts each value to
the declared dtype; None, "" and NaN become the model's missing markers (NaN, -1, "").
"""
from __future__ import annotations

import http.client
import json
import math
import numbers
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import numpy as np

from serving import DEFAULT_MAX_BATCH_SIZE

T = TypeVar("T")

FLOAT_DTYPES = frozenset({"DT_FLOAT", "DT_DOUBLE", "DT_HALF", "DT_BFLOAT16"})
INT_DTYPES = frozenset({"DT_INT8", "DT_INT16", "DT_INT32", "DT_INT64", "DT_UINT8", "DT_UINT16"})
NUMPY_DTYPES = {
    "DT_FLOAT": np.float32, "DT_DOUBLE": np.float64, "DT_HALF": np.float16,
    "DT_INT8": np.int8, "DT_INT16": np.int16, "DT_INT32": np.int32, "DT_INT64": np.int64,
    "DT_UINT8": np.uint8, "DT_UINT16": np.uint16, "DT_STRING": object, "DT_BOOL": np.bool_,
}
DEFAULT_TIMEOUT_S = 10.0
HTTP_STATUS_TO_CODE = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED", 409: "ABORTED", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED",
    431: "INVALID_ARGUMENT", 499: "CANCELLED",
    501: "UNIMPLEMENTED", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
}


class ServingError(Exception):
    """A request TF Serving did not answer successfully; `code` is the canonical status name."""

    def __init__(self, message: str, code: str = "UNKNOWN") -> None:
        super().__init__(message)
        self.code = code


class ModelNotFoundError(ServingError):
    """The model, version or label is not served."""


class InvalidInputError(ServingError):
    """The rows do not fit the model's signature (unknown feature, wrong type, too many rows...)."""


class ServingTimeoutError(ServingError):
    """No answer within the timeout."""


class ServingUnavailableError(ServingError):
    """The server could not be reached or said it is unavailable, after all retries."""


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


def error_for(code: str, message: str) -> ServingError:
    """The typed exception for a canonical status code and the server's message."""
    if code == "NOT_FOUND" or (code == "INVALID_ARGUMENT" and "version label" in message):
        return ModelNotFoundError(message, code)
    if code == "INVALID_ARGUMENT":
        return InvalidInputError(message, code)
    if code == "DEADLINE_EXCEEDED":
        return ServingTimeoutError(message, code)
    if code == "UNAVAILABLE":
        return ServingUnavailableError(message, code)
    return ServingError(message, code)


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

    A feature absent from a row counts as missing. A key the signature does not take is an error unless
    `drop_unknown_features` (e.g. a label column in evaluation data).
    """
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


def _describe(model: str, version: int | None, label: str | None) -> str:
    if version is not None:
        return f"model {model!r} version {version}"
    if label:
        return f"model {model!r} label {label!r}"
    return f"model {model!r}"


class ServingClient(ABC):
    """One API over both transports. Retries, with exponential backoff, only when the server is unavailable."""

    def __init__(self, retries: int = 3, backoff_s: float = 0.1, metadata_ttl_s: float = 30.0) -> None:
        self.retries = retries
        self.backoff_s = backoff_s
        self.metadata_ttl_s = metadata_ttl_s
        self._metadata_cache: dict[tuple, tuple[float, ModelMetadata]] = {}
        self._cache_lock = threading.Lock()

    @property
    @abstractmethod
    def address(self) -> str:
        """Where the server is, for messages."""

    def predict(
        self,
        rows: Mapping[str, Any] | Iterable[Mapping[str, Any]],
        model: str,
        version: int | None = None,
        label: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        signature_name: str = "serving_default",
        output_name: str = "probabilities",
        drop_unknown_features: bool = False,
        rows_per_request: int = DEFAULT_MAX_BATCH_SIZE,
    ) -> list[float]:
        """Probabilities for one raw feature dict or many, from the version, label or (default) latest version;
        more than `rows_per_request` rows go as several requests."""
        _check_choice(version, label)
        rows = [rows] if isinstance(rows, Mapping) else list(rows)
        if not rows:
            return []
        outputs = self._outputs(rows, model, version, label, timeout, signature_name, drop_unknown_features,
                                rows_per_request)
        if output_name in outputs:
            values = outputs[output_name]
        elif len(outputs) == 1:
            values = next(iter(outputs.values()))
        else:
            raise ServingError(
                f"{_describe(model, version, label)} returned outputs {sorted(outputs)}, not {output_name!r}; "
                "pass output_name.",
            )
        values = np.asarray(values, dtype=np.float64).reshape(len(rows), -1)
        if values.shape[1] != 1:
            raise ServingError(f"Output {output_name!r} has {values.shape[1]} values per row; expected one "
                               "(a multiclass model: use predict_outputs).")
        return [float(v) for v in values[:, 0]]

    def predict_outputs(
        self,
        rows: Mapping[str, Any] | Iterable[Mapping[str, Any]],
        model: str,
        version: int | None = None,
        label: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        signature_name: str = "serving_default",
        drop_unknown_features: bool = False,
        rows_per_request: int = DEFAULT_MAX_BATCH_SIZE,
    ) -> list[dict[str, Any]]:
        """Every output for one raw feature dict or many, one dict per row: a number, a string, or a list of them
        per output (a multiclass model: `probabilities` and `classes` lists, the predicted `class`); more than
        `rows_per_request` rows go as several requests."""
        _check_choice(version, label)
        rows = [rows] if isinstance(rows, Mapping) else list(rows)
        if not rows:
            return []
        outputs = self._outputs(rows, model, version, label, timeout, signature_name, drop_unknown_features,
                                rows_per_request)
        per_row = {name: _rows_of(np.asarray(values), len(rows), name) for name, values in outputs.items()}
        return [{name: values[i] for name, values in per_row.items()} for i in range(len(rows))]

    def _outputs(
        self, rows: list[Mapping[str, Any]], model: str, version: int | None, label: str | None, timeout: float,
        signature_name: str, drop_unknown_features: bool, rows_per_request: int,
    ) -> dict[str, np.ndarray]:
        if rows_per_request < 1:
            raise ValueError(f"rows_per_request must be at least 1, got {rows_per_request}.")
        if len(rows) > rows_per_request:
            # Each request within the server's batch limit, the outputs joined in row order.
            parts = [self._outputs(rows[start:start + rows_per_request], model, version, label, timeout,
                                   signature_name, drop_unknown_features, rows_per_request)
                     for start in range(0, len(rows), rows_per_request)]
            return {name: np.concatenate([np.asarray(part[name]) for part in parts]) for name in parts[0]}
        key = (model, version, label)
        with self._cache_lock:
            was_cached = key in self._metadata_cache

        def attempt() -> dict[str, np.ndarray]:
            signature = self._signature(model, version, label, signature_name, timeout)
            columns = rows_to_columns(rows, signature.inputs, drop_unknown_features)
            return self._retrying(
                lambda: self._predict(model, version, label, signature_name, columns, signature, timeout)
            )

        try:
            return attempt()
        except InvalidInputError:
            if version is not None or not was_cached:
                raise
            # A rollout may have moved the label (or the latest version) to a version with another signature
            # since it was cached: ask again once.
            with self._cache_lock:
                self._metadata_cache.pop(key, None)
            return attempt()

    def metadata(
        self, model: str, version: int | None = None, label: str | None = None, timeout: float = DEFAULT_TIMEOUT_S
    ) -> ModelMetadata:
        """The model's signatures (inputs and outputs with dtypes and shapes) and the version that answered."""
        _check_choice(version, label)
        result = self._retrying(lambda: self._metadata(model, version, label, timeout))
        with self._cache_lock:
            self._metadata_cache[(model, version, label)] = (time.monotonic(), result)
        return result

    def status(
        self, model: str, version: int | None = None, label: str | None = None, timeout: float = DEFAULT_TIMEOUT_S
    ) -> list[VersionStatus]:
        """The state of every version of the model (or of one version / label)."""
        _check_choice(version, label)
        return self._retrying(lambda: self._status(model, version, label, timeout))

    @abstractmethod
    def close(self) -> None:
        """Releases connections."""

    def __enter__(self) -> ServingClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _signature(
        self, model: str, version: int | None, label: str | None, signature_name: str, timeout: float
    ) -> SignatureSpec:
        with self._cache_lock:
            cached = self._metadata_cache.get((model, version, label))
        if cached and time.monotonic() - cached[0] < self.metadata_ttl_s:
            metadata = cached[1]
        else:
            metadata = self.metadata(model, version, label, timeout)
        signature = metadata.signatures.get(signature_name)
        if signature is None:
            raise InvalidInputError(
                f"{_describe(model, version, label)} has no signature {signature_name!r}; "
                f"it has {sorted(metadata.signatures)}.",
                "INVALID_ARGUMENT",
            )
        return signature

    def _retrying(self, call: Callable[[], T]) -> T:
        for attempt in range(self.retries + 1):
            try:
                return call()
            except ServingUnavailableError:
                if attempt == self.retries:
                    raise
                time.sleep(self.backoff_s * 2**attempt)
        raise AssertionError("unreachable")

    @abstractmethod
    def _predict(
        self, model: str, version: int | None, label: str | None, signature_name: str,
        columns: dict[str, np.ndarray], signature: SignatureSpec, timeout: float,
    ) -> dict[str, np.ndarray]: ...

    @abstractmethod
    def _metadata(self, model: str, version: int | None, label: str | None, timeout: float) -> ModelMetadata: ...

    @abstractmethod
    def _status(self, model: str, version: int | None, label: str | None, timeout: float) -> list[VersionStatus]: ...


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


def _check_choice(version: int | None, label: str | None) -> None:
    if version is not None and label:
        raise ValueError("Give a version or a label, not both.")


class _NoDelayHTTPConnection(http.client.HTTPConnection):
    # http.client sends a body over 2920 bytes in a second write; without TCP_NODELAY, Nagle plus the
    # server's delayed ACK hold it back ~40 ms.
    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _NoDelayHTTPSConnection(http.client.HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class RestClient(ServingClient):
    """TF Serving's REST API (`http://HOST:8501`), one keep-alive connection per thread."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"REST address {url!r} is not a URL like http://127.0.0.1:8501.")
        self._scheme = parts.scheme
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 8501)
        self._prefix = parts.path.rstrip("/")
        self._local = threading.local()
        self._connections: list[http.client.HTTPConnection] = []
        self._connections_lock = threading.Lock()

    @property
    def address(self) -> str:
        return f"{self._scheme}://{self._host}:{self._port}{self._prefix}"

    def _model_path(self, model: str, version: int | None, label: str | None) -> str:
        path = f"{self._prefix}/v1/models/{quote(model, safe='')}"
        if version is not None:
            path += f"/versions/{int(version)}"
        elif label:
            path += f"/labels/{quote(label, safe='')}"
        return path

    def _predict(self, model, version, label, signature_name, columns, signature, timeout):
        body = {"signature_name": signature_name, "inputs": {k: v.tolist() for k, v in columns.items()}}
        payload = self._request("POST", self._model_path(model, version, label) + ":predict", body, timeout)
        outputs = payload.get("outputs")
        if isinstance(outputs, dict) and len(signature.outputs) != 1:
            return {k: np.asarray(v) for k, v in outputs.items()}
        return {next(iter(signature.outputs), "outputs"): np.asarray(outputs)}

    def _metadata(self, model, version, label, timeout):
        payload = self._request("GET", self._model_path(model, version, label) + "/metadata", None, timeout)
        spec = payload.get("model_spec", {})
        signature_defs = payload.get("metadata", {}).get("signature_def", {}).get("signature_def", {})
        return ModelMetadata(spec.get("name", model), int(spec.get("version", 0)), parse_signature_defs(signature_defs))

    def _status(self, model, version, label, timeout):
        return parse_model_status(self._request("GET", self._model_path(model, version, label), None, timeout))

    def _connection(self, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.timeout = timeout
            if connection.sock is not None:
                connection.sock.settimeout(timeout)
            return connection, True
        factory = _NoDelayHTTPSConnection if self._scheme == "https" else _NoDelayHTTPConnection
        connection = factory(self._host, self._port, timeout=timeout)
        self._local.connection = connection
        with self._connections_lock:
            self._connections.append(connection)
        return connection, False

    def _drop_connection(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None
            with self._connections_lock:
                self._connections.remove(connection)

    def close(self) -> None:
        with self._connections_lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()

    def _request(self, method: str, path: str, body: Any, timeout: float) -> dict[str, Any]:
        data = json.dumps(body, allow_nan=True).encode("utf-8") if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        for _ in range(2):
            connection, reused = self._connection(timeout)
            try:
                connection.request(method, path, body=data, headers=headers)
                response = connection.getresponse()
                raw = response.read()
                break
            except TimeoutError:
                self._drop_connection()
                raise ServingTimeoutError(
                    f"{method} {self.address}{path} got no answer within {timeout}s; retry or raise the timeout.",
                    "DEADLINE_EXCEEDED",
                ) from None
            except (OSError, http.client.HTTPException) as e:
                self._drop_connection()
                if reused:
                    continue  # the server closed an idle keep-alive connection: reconnect once
                raise ServingUnavailableError(
                    f"Cannot reach TF Serving at {self.address}: {e}; is the server running?", "UNAVAILABLE"
                ) from e
        try:
            payload = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            payload = {"error": raw[:200].decode("utf-8", errors="replace")}
        if response.will_close:
            self._drop_connection()
        if response.status == 200:
            return payload
        code = HTTP_STATUS_TO_CODE.get(response.status, "INTERNAL" if response.status >= 500 else "UNKNOWN")
        message = payload.get("error", "") if isinstance(payload, dict) else str(payload)
        raise error_for(code, f"{method} {path} failed with HTTP {response.status}: {message}")


class GrpcClient(ServingClient):
    """TF Serving's gRPC API (`HOST:8500`) with the tensorflow-serving-api messages, built without importing
    TensorFlow (serving/protos.py)."""

    def __init__(self, target: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        import grpc

        from serving.protos import ModelServiceStub, PredictionServiceStub, serving_protos

        self._grpc = grpc
        self._protos = serving_protos()
        self._target = target
        self._channel = grpc.insecure_channel(
            target,
            options=[("grpc.max_receive_message_length", 256 * 1024 * 1024),
                     ("grpc.max_send_message_length", 256 * 1024 * 1024)],
        )
        self._prediction = PredictionServiceStub(self._channel, self._protos)
        self._models = ModelServiceStub(self._channel, self._protos)

    @property
    def address(self) -> str:
        return self._target

    def close(self) -> None:
        self._channel.close()

    def _call(self, method, request, timeout: float, what: str):
        grpc = self._grpc
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as e:
            code = e.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise ServingTimeoutError(
                    f"{what} at {self._target} got no answer within {timeout}s; retry or raise the timeout.", code.name
                ) from None
            if code == grpc.StatusCode.UNAVAILABLE:
                raise ServingUnavailableError(
                    f"Cannot reach TF Serving at {self._target}: {e.details()}; is the server running?", code.name
                ) from None
            raise error_for(code.name, f"{what} failed with {code.name}: {e.details()}") from None

    def _predict(self, model, version, label, signature_name, columns, signature, timeout):
        from serving.protos import predict_request, tensor_values

        dtypes = {name: signature.inputs[name].dtype for name in columns}
        request = predict_request(self._protos, model, columns, dtypes, version, label, signature_name)
        what = f"Predict on {_describe(model, version, label)}"
        response = self._call(self._prediction.Predict, request, timeout, what)
        return {name: tensor_values(tensor, self._protos) for name, tensor in response.outputs.items()}

    def _metadata(self, model, version, label, timeout):
        from google.protobuf import json_format

        from serving.protos import metadata_request

        request = metadata_request(self._protos, model, version, label)
        what = f"GetModelMetadata on {_describe(model, version, label)}"
        response = self._call(self._prediction.GetModelMetadata, request, timeout, what)
        signature_defs = self._protos.SignatureDefMap()
        response.metadata["signature_def"].Unpack(signature_defs)
        as_dict = json_format.MessageToDict(signature_defs, preserving_proto_field_name=True)
        return ModelMetadata(
            response.model_spec.name, response.model_spec.version.value,
            parse_signature_defs(as_dict.get("signature_def", {})),
        )

    def _status(self, model, version, label, timeout):
        from google.protobuf import json_format

        from serving.protos import status_request

        request = status_request(self._protos, model, version, label)
        response = self._call(
            self._models.GetModelStatus, request, timeout, f"GetModelStatus on {_describe(model, version, label)}"
        )
        return parse_model_status(
            json_format.MessageToDict(response, preserving_proto_field_name=True, including_default_value_fields=True)
        )


def connect(rest: str | None = None, grpc: str | None = None, **kwargs: Any) -> ServingClient:
    """A client for `rest` (http://HOST:8501) or `grpc` (HOST:8500); exactly one of them."""
    if (rest is None) == (grpc is None):
        raise ValueError("Give exactly one of rest='http://HOST:8501' or grpc='HOST:8500'.")
    return RestClient(rest, **kwargs) if rest is not None else GrpcClient(grpc, **kwargs)
