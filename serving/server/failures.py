"""Failed predictions with their inputs: what a rollout reads to name why a canary fails.

TF Serving answers a failed prediction with the error and keeps nothing of it (its request logger logs answered
predictions only, core/request_logger.cc). This server and `mlops log-proxy` keep the newest MAX_KEPT failed
predictions of each process in memory, each with the time, model, version, transport, canonical code, the error as the
client got it and the request's inputs as rows (the first MAX_ROWS, each value cut at MAX_VALUE_CHARS), and answer
a model's as JSON at FAILURES_PATH/NAME (a path without a query: the API server's pod proxy passes no query on).
The request logger also writes the users' failures (serving/server/request_log.py, `failures-*.jsonl`); the
verifier's are kept here, marked, and left out of the log.
"""
from __future__ import annotations

import collections
import json
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import unquote

FAILURES_PATH = "/monitoring/failures"
# Per process: a rollout window of 30 s at a few failing requests a second fits.
MAX_KEPT = 512
MAX_ROWS = 16
MAX_VALUE_CHARS = 200
MAX_MESSAGE_CHARS = 1024
# A larger request is kept by its first characters: parsing it again for its rows would cost what it did once, and
# a refused one may be refused for its cost (serving/server/limits.py json_cost): JSON that deep or with that many
# values is never parsed here.
MAX_PARSED_BYTES = 256 * 1024
MAX_PARSED_JSON_DEPTH = 16
MAX_PARSED_JSON_ITEMS = 4096


@dataclass(frozen=True)
class FailedPrediction:
    """One failed prediction: `rows` are its first inputs as {input name: value}, `row_count` how many it had."""

    time: float
    model: str
    version: int | None
    transport: str  # "rest" or "grpc"
    code: str  # the canonical gRPC code name; REST answers carry the same code as an HTTP status
    message: str
    traffic: str  # "users" or "verifier"
    rows: list[dict[str, Any]]
    row_count: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _plain(value: Any) -> Any:
    """A JSON-safe, bounded copy of one input value (a one-element list is its element)."""
    if hasattr(value, "tolist"):  # a numpy array or scalar
        value = value.tolist()
    while isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if isinstance(value, str):
        return value if len(value) <= MAX_VALUE_CHARS else value[:MAX_VALUE_CHARS] + "..."
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (bool, int, float)) or value is None:
        return value
    if isinstance(value, dict):  # {"b64": ...}
        return {str(k): _plain(v) for k, v in list(value.items())[:MAX_ROWS]}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value[:MAX_ROWS]]
    return _plain(str(value))


def rows_from_json_body(body: bytes) -> tuple[list[dict[str, Any]], int]:
    """A REST predict body's inputs as rows, in either of TF Serving's formats ("instances": one row per instance;
    "inputs": columns); a body that is not such JSON, or is costlier than the MAX_PARSED_ bounds, is one row
    {"body": its first characters}."""
    from serving.server.limits import json_cost  # with TensorFlow: this module is read without it (rollout/)

    if len(body) > MAX_PARSED_BYTES:
        return [{"body": _plain(body[:MAX_VALUE_CHARS])}], 1
    items, depth = json_cost(body)
    if items > MAX_PARSED_JSON_ITEMS or depth > MAX_PARSED_JSON_DEPTH:
        return [{"body": _plain(body[:MAX_VALUE_CHARS])}], 1
    try:
        request = json.loads(body)
    except ValueError:
        return [{"body": _plain(body[:MAX_VALUE_CHARS])}], 1
    if isinstance(request, dict) and isinstance(request.get("instances"), list):
        instances = request["instances"]
        return [({str(k): _plain(v) for k, v in row.items()} if isinstance(row, dict) else {"instance": _plain(row)})
                for row in instances[:MAX_ROWS]], len(instances)
    if isinstance(request, dict) and isinstance(request.get("inputs"), dict):
        return _rows_from_columns({str(k): v for k, v in request["inputs"].items()})
    if isinstance(request, dict) and "inputs" in request:
        return [{"inputs": _plain(request["inputs"])}], 1
    return [{"body": _plain(body[:MAX_VALUE_CHARS].decode("utf-8", errors="replace"))}], 1


def _rows_from_columns(columns: Mapping[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """Rows from {input: a list with a value per row} (a value that is not a list stands for one row)."""
    count = max((len(v) for v in columns.values() if isinstance(v, list)), default=1)
    rows = []
    for i in range(min(count, MAX_ROWS)):
        row = {}
        for name, values in columns.items():
            listed = isinstance(values, list)
            row[name] = _plain(values[i] if listed and i < len(values) else None if listed else values)
        rows.append(row)
    return rows, count


def rows_from_arrays(arrays: Mapping[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """Input arrays (numpy; the first dimension is the batch) as rows, converting only the rows kept."""
    rows, count = _rows_from_columns({name: value[:MAX_ROWS].tolist() if value.ndim else value.tolist()
                                      for name, value in arrays.items()})
    return rows, max((len(value) for value in arrays.values() if value.ndim), default=count)


def _tensor_rows(tensor) -> tuple[list[Any], int]:
    """The first MAX_ROWS rows of a TensorProto's values and the rows its shape declares, read from its value field
    without building the tensor the shape declares (a refused request may declare billions of elements)."""
    import numpy as np

    from serving.server.grpc.codec import _FAST_DTYPES

    dims = [d.size for d in tensor.tensor_shape.dim]
    rows = dims[0] if dims else 1
    per_row = math.prod(dims[1:]) if len(dims) > 1 else 1
    if any(d < 0 for d in dims) or per_row > MAX_ROWS:
        return [f"<a tensor of shape {dims}>"], 1
    wanted = min(rows, MAX_ROWS) * per_row
    field, numpy_dtype = _FAST_DTYPES.get(tensor.dtype, (None, None))
    if field is None:
        values: list[Any] = []
    elif tensor.tensor_content and numpy_dtype is not object:
        width = np.dtype(numpy_dtype).itemsize
        values = np.frombuffer(tensor.tensor_content[:wanted * width], numpy_dtype).tolist()
    else:
        values = list(getattr(tensor, field)[:wanted])
    if per_row == 1:
        return values, rows
    return [values[i:i + per_row] for i in range(0, len(values) - per_row + 1, per_row)], rows


def rows_from_predict_request(data: bytes) -> tuple[list[dict[str, Any]], int]:
    """A serialized PredictRequest's inputs as rows; a message that does not parse, or is over MAX_PARSED_BYTES,
    is no rows."""
    # Imported here: monitoring.py imports this module, and needs no TensorFlow for its counters.
    from tensorflow_serving.apis import predict_pb2

    if len(data) > MAX_PARSED_BYTES:
        return [], 0
    try:
        request = predict_pb2.PredictRequest.FromString(data)
        columns = {name: _tensor_rows(tensor) for name, tensor in request.inputs.items()}
    except Exception:  # noqa: BLE001 - the failure being recorded may be this very message's
        return [], 0
    count = max((declared for _, declared in columns.values()), default=0)
    rows = [{name: _plain(values[i]) if i < len(values) else None for name, (values, _) in columns.items()}
            for i in range(min(count, MAX_ROWS))]
    return rows, count


class RecentFailures:
    """The newest MAX_KEPT failed predictions of this process, safe to add to from any thread.

    `on_users_failure` (the request logger's, when it logs) is handed each users' failure as well."""

    def __init__(self, clock: Callable[[], float] = time.time, kept: int = MAX_KEPT) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: collections.deque[FailedPrediction] = collections.deque(maxlen=kept)
        self.on_users_failure: Callable[[FailedPrediction], None] | None = None

    def add(self, model: str, version: int | None, transport: str, code: str, message: str, verifier: bool,
            rows: tuple[list[dict[str, Any]], int]) -> None:
        if not model:
            return
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[:MAX_MESSAGE_CHARS] + "..."
        failure = FailedPrediction(self._clock(), model, version, transport, code, message,
                                   "verifier" if verifier else "users", rows[0], rows[1])
        with self._lock:
            self._failures.append(failure)
        if not verifier and self.on_users_failure is not None:
            self.on_users_failure(failure)

    def of_model(self, model: str) -> list[FailedPrediction]:
        with self._lock:
            return [f for f in self._failures if f.model == model]

    def answer(self, path: str) -> tuple[int, dict[str, Any]] | None:
        """The answer to GET `path` when it is FAILURES_PATH/NAME: (HTTP status, JSON); None for another path."""
        if not path.startswith(FAILURES_PATH + "/"):
            return None
        model = unquote(path[len(FAILURES_PATH) + 1:])
        if not model or "/" in model:
            return 404, {"error": f"Name one model: GET {FAILURES_PATH}/NAME."}
        return 200, {"failures": [f.to_json() for f in self.of_model(model)], "kept": self._failures.maxlen}
