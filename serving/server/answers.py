"""Answered predictions under their request ids: what the rollout's shadow step joins (rollout/shadow.py).

At the shadow step the router sends every request to stable and a copy of a share of them, under the same request id
(serving.REQUEST_ID_HEADER, which Envoy sets), to the candidate, whose answers it discards. Each server keeps its
newest MAX_KEPT answers to requests that carry an id, with the time, model, version, transport, the server's time to
answer, each output's value for the first MAX_ROWS rows (outputs with one value per row) and those rows' inputs, and
answers them as JSON at ANSWERS_PATH/NAME/SINCE: the answers kept after SINCE (Unix time in milliseconds), oldest
first, at most MAX_READ (a path without a query: the API server's pod proxy passes no query on). Each is numbered in
its process (`instance`, `number`), so a reader that reads overlapping times counts each once. The verifier's
requests are not kept: they reach a track directly, never through the router.
"""
from __future__ import annotations

import collections
import json
import math
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import unquote

from serving.server.failures import rows_from_arrays

ANSWERS_PATH = "/monitoring/answers"
# Per process: a shadow window of 30 s at ~130 routed requests a second fits.
MAX_KEPT = 4096
MAX_ROWS = 8
MAX_READ = 1024


@dataclass(frozen=True)
class KeptAnswer:
    """One answered prediction: `outputs` maps each output with a value per row to its first MAX_ROWS values."""

    number: int
    request_id: str
    time: float
    model: str
    version: int | None  # None: the answer did not say (a REST answer through `mlops log-proxy` to an unversioned
    # request; each track's servers then serve one version during a shadow window)
    transport: str  # "rest" or "grpc"
    latency_ms: float
    outputs: dict[str, list[Any]]
    rows: list[dict[str, Any]]
    row_count: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def per_row_outputs(outputs: Mapping[str, Any]) -> dict[str, list[Any]]:
    """Each output holding one value per row ([batch] or [batch, 1]; numpy arrays) as its first MAX_ROWS values."""
    import numpy as np  # here: rollout/ reads ANSWERS_PATH without numpy

    kept = {}
    for name, value in outputs.items():
        value = np.asarray(value)
        shape = value.shape
        if len(shape) == 1 or (len(shape) == 2 and shape[1] == 1):
            values = value[:MAX_ROWS].reshape(-1).tolist()
            kept[name] = [v.decode("utf-8", errors="replace") if isinstance(v, bytes) else
                          (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for v in values]
    return kept


def _per_row(value: Any) -> tuple[bool, Any]:
    """(whether `value` is one row's single value, that value): a one-element list is its element."""
    while isinstance(value, list) and len(value) == 1:
        value = value[0]
    return not isinstance(value, (list, dict)), value


def outputs_from_json_answer(answer: bytes) -> dict[str, list[Any]]:
    """The outputs with one value per row of a REST predict answer, in either of TF Serving's formats (an answer of
    one unnamed output keeps TF Serving's key, "predictions" or "outputs"); {} when it is not such JSON."""
    try:
        document = json.loads(answer)
    except ValueError:
        return {}
    if not isinstance(document, dict):
        return {}
    columns: dict[str, list[Any]] = {}
    if isinstance(document.get("predictions"), list):
        rows = document["predictions"][:MAX_ROWS]
        if rows and all(isinstance(row, dict) for row in rows):
            columns = {str(name): [row.get(name) for row in rows] for name in rows[0]}
        else:
            columns = {"predictions": rows}
    elif isinstance(document.get("outputs"), dict):
        columns = {str(name): values[:MAX_ROWS] for name, values in document["outputs"].items()
                   if isinstance(values, list)}
    elif isinstance(document.get("outputs"), list):
        columns = {"outputs": document["outputs"][:MAX_ROWS]}
    kept = {}
    for name, values in columns.items():
        read = [_per_row(v) for v in values]
        if all(single for single, _ in read):
            kept[name] = [v for _, v in read]
    return kept


def outputs_from_predict_response(data: bytes) -> tuple[int | None, dict[str, list[Any]]]:
    """The answering version and the outputs with one value per row of a serialized PredictResponse, read from the
    value fields without building the tensors; (None, {}) for a message that does not parse."""
    from tensorflow_serving.apis import predict_pb2

    from serving.server.failures import _plain, _tensor_rows

    try:
        response = predict_pb2.PredictResponse.FromString(data)
    except Exception:  # noqa: BLE001 - what TF Serving answered always parses; a proxy test's message may not
        return None, {}
    version = response.model_spec.version.value if response.model_spec.HasField("version") else None
    outputs = {}
    for name, tensor in response.outputs.items():
        dims = [d.size for d in tensor.tensor_shape.dim]
        if len(dims) == 1 or (len(dims) == 2 and dims[1] == 1):
            values, _ = _tensor_rows(tensor)
            outputs[name] = [_plain(v) for v in values[:MAX_ROWS]]
    return version, outputs


class RecentAnswers:
    """The newest MAX_KEPT answers of this process to requests with an id, safe to add to from any thread."""

    def __init__(self, clock: Callable[[], float] = time.time, kept: int = MAX_KEPT) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._answers: collections.deque[KeptAnswer] = collections.deque(maxlen=kept)
        self._count = 0
        self.instance = uuid.uuid4().hex[:12]

    def add(self, request_id: str, model: str, version: int, transport: str, seconds: float,
            arrays: Mapping[str, Any], outputs: Mapping[str, Any]) -> None:
        """A prediction this server answered: its input and output arrays (numpy; the first dimension the batch)."""
        if not request_id or not model:
            return
        rows, row_count = rows_from_arrays({name: value[:MAX_ROWS] if getattr(value, "ndim", 0) else value
                                            for name, value in arrays.items()})
        row_count = max((len(value) for value in arrays.values() if getattr(value, "ndim", 0)), default=row_count)
        self.keep(request_id, model, version, transport, seconds, rows, row_count, per_row_outputs(outputs))

    def keep(self, request_id: str, model: str, version: int | None, transport: str, seconds: float,
             rows: list[dict[str, Any]], row_count: int, outputs: dict[str, list[Any]]) -> None:
        """A prediction as rows and per-row outputs already read (`mlops log-proxy`, from the messages it passed)."""
        if not request_id or not model:
            return
        with self._lock:
            self._count += 1
            self._answers.append(KeptAnswer(self._count, request_id, self._clock(), model, version, transport,
                                            round(seconds * 1000.0, 3),
                                            {name: values[:MAX_ROWS] for name, values in outputs.items()},
                                            rows[:MAX_ROWS], row_count))

    def since(self, model: str, since: float) -> tuple[list[KeptAnswer], float | None, bool]:
        """The model's answers kept after `since` (Unix time), oldest first, at most MAX_READ; the time of the oldest
        answer still kept (None: none is); and whether older ones were dropped to keep MAX_KEPT."""
        with self._lock:
            oldest = self._answers[0].time if self._answers else None
            found = [a for a in self._answers if a.time > since and a.model == model]
            dropped = self._count > len(self._answers)
        return found[:MAX_READ], oldest, dropped

    def answer(self, path: str) -> tuple[int, dict[str, Any]] | None:
        """The answer to GET `path` when it is under ANSWERS_PATH: (HTTP status, JSON); None for another path."""
        if not path.startswith(ANSWERS_PATH + "/"):
            return None
        parts = path[len(ANSWERS_PATH) + 1:].split("/")
        if len(parts) != 2 or not parts[0] or not parts[1].isdigit():
            return 404, {"error": f"Name one model and a time: GET {ANSWERS_PATH}/NAME/SINCE (Unix time in "
                                  "milliseconds; 0 for all)."}
        found, oldest, dropped = self.since(unquote(parts[0]), int(parts[1]) / 1000.0)
        return 200, {"answers": [a.to_json() for a in found], "instance": self.instance, "oldest": oldest,
                     "dropped": dropped, "kept": self._answers.maxlen}
