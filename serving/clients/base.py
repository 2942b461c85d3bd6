"""`ServingClient`: the one API of the REST and gRPC clients (predict, predict_outputs, metadata, status), with the
signature cache and the retries, over a transport's three calls."""
from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import numpy as np

from serving import DEFAULT_MAX_BATCH_SIZE
from serving.clients.errors import InvalidInputError, ServingError, ServingUnavailableError
from serving.clients.values import ModelMetadata, SignatureSpec, VersionStatus, _rows_of, rows_to_columns

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 10.0


def _describe(model: str, version: int | None, label: str | None) -> str:
    if version is not None:
        return f"model {model!r} version {version}"
    if label:
        return f"model {model!r} label {label!r}"
    return f"model {model!r}"


class ServingClient(ABC):
    """One API over both transports. Retries, with exponential backoff, only when the server is unavailable."""

    def __init__(self, retries: int = 3, backoff_s: float = 0.1, metadata_ttl_s: float = 30.0,
                 headers: Mapping[str, str] | None = None) -> None:
        self.retries = retries
        # Sent with every call: HTTP headers, or gRPC metadata (whose keys are lower case).
        self.headers = {name.lower(): value for name, value in (headers or {}).items()}
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


def _check_choice(version: int | None, label: str | None) -> None:
    if version is not None and label:
        raise ValueError("Give a version or a label, not both.")
