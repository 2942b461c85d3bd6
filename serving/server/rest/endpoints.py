"""TF Serving's REST API (https://www.tensorflow.org/tfx/serving/api_rest): `RestApi` is the protocol, the URL
parsing and the endpoint handlers (method, path, body -> status, JSON), for `RestApp` (app.py) to run."""
from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from concurrent.futures import Executor
from typing import Any
from urllib.parse import unquote

import grpc
import numpy as np

from serving.server.api_messages import message_to_json_dict, model_metadata_json, model_status_response
from serving.server.errors import ServingRequestError, invalid_argument
from serving.server.failures import rows_from_json_body
from serving.server.limits import check_json_cost, max_json_depth, max_json_items
from serving.server.model_manager import ModelManager
from serving.server.monitoring import RequestMetrics
from serving.server.predictor import Predictor
from serving.server.request_log import RequestLogger, predict_messages_from_arrays
from serving.server.rest.codec import inputs_to_arrays, instances_to_arrays, outputs_to_json, parse_json_body
from serving.server.servable import ServableVersion

logger = logging.getLogger(__name__)

# The same paths the real server accepts (model_servers/http_rest_api_util.cc), case-insensitive.
PREDICT_PATH = re.compile(
    r"/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:(classify|regress|predict)", re.IGNORECASE
)
STATUS_PATH = re.compile(
    r"/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:/(metadata))?", re.IGNORECASE
)
INT64_MAX = 2**63 - 1


def _parse_version(text: str | None) -> int | None:
    if not text:
        return None
    try:
        version = int(text)
    except ValueError:  # e.g. more digits than int() converts (sys.get_int_max_str_digits)
        version = INT64_MAX + 1
    if version > INT64_MAX:
        raise invalid_argument(f"Failed to convert version: {text} to numeric.")
    return version


def _model_and_api(method: str, path: str) -> tuple[str, str]:
    """The model a REST request names and its API label as TF Serving's http_server.cc records them ("predict" and
    the like for POSTs, "" for status and metadata GETs); ("", "") when it names none."""
    match = PREDICT_PATH.fullmatch(path) if method == "POST" else STATUS_PATH.fullmatch(path)
    if match is None or not match.group(1):
        return "", ""
    return unquote(match.group(1)), match.group(4).lower() if method == "POST" else ""


class RestApi:
    """The protocol: maps one HTTP request to a status code and a JSON-serialisable body."""

    def __init__(self, manager: ModelManager, predictor: Predictor, executor: Executor, inline_bytes: int,
                 metrics: RequestMetrics | None = None, request_logger: RequestLogger | None = None) -> None:
        self.manager = manager
        self.predictor = predictor
        self.executor = executor
        self.inline_bytes = inline_bytes
        self.metrics = metrics or RequestMetrics()
        self.request_logger = request_logger
        self._json_limits_cache: dict[int, tuple[ServableVersion, tuple[int, int]]] = {}

    async def handle(self, method: str, raw_path: str, body: bytes, verifier: bool = False, request_id: str = ""
                     ) -> tuple[int, dict[str, Any]]:
        """`verifier`: the request carries the rollout verifier's mark (serving.TRAFFIC_HEADER): not logged.
        `request_id`: the router's id of the request (serving.REQUEST_ID_HEADER): its answer is kept under it."""
        path = raw_path.split("?", 1)[0]
        started = time.perf_counter()
        status = "OK"
        try:
            return 200, await self._dispatch(method, path, body, verifier, request_id)
        except ServingRequestError as e:
            status = e.code.name
            self.keep_failure(method, path, body, status, e.message, verifier)
            return e.http_status, {"error": e.message}
        except Exception as e:  # noqa: BLE001 - one broken request must not take the server down
            status = "INTERNAL"
            logger.exception("internal error serving %s %s", method, path)
            self.keep_failure(method, path, body, status, f"Internal error: {e}", verifier)
            return 500, {"error": f"Internal error: {e}"}
        finally:
            model, api = _model_and_api(method, path)
            self.metrics.record(model, status, api, "REST", time.perf_counter() - started, verifier and bool(api))

    def keep_failure(self, method: str, path: str, body: bytes | None, code: str, message: str,
                     verifier: bool) -> None:
        """A failed prediction with its inputs (none for a request refused unread, `body` None), for the rollout to
        name the cause (serving/server/failures.py)."""
        match = PREDICT_PATH.fullmatch(path) if method == "POST" else None
        if match is None:
            return
        name, version, label = unquote(match.group(1)), match.group(2), match.group(3)
        try:
            answered = self.manager.resolve(name, _parse_version(version), label and unquote(label)).version
        except Exception:  # noqa: BLE001 - the model or version is what failed: no version answered
            answered = None
        rows = rows_from_json_body(body) if body is not None else ([], 0)
        self.metrics.failures.add(name, answered, "rest", code, message, verifier, rows)

    async def _dispatch(self, method: str, path: str, body: bytes, verifier: bool = False, request_id: str = ""
                        ) -> dict[str, Any]:
        if method == "POST":
            match = PREDICT_PATH.fullmatch(path)
            if match:
                name, version, label, verb = match.groups()
                if verb.lower() != "predict":
                    raise ServingRequestError(
                        grpc.StatusCode.UNIMPLEMENTED, f"The {verb} API is not implemented here; use :predict."
                    )
                return await self._predict(unquote(name), _parse_version(version), label and unquote(label), body,
                                           verifier, request_id)
        elif method == "GET":
            match = STATUS_PATH.fullmatch(path)
            if match:
                name, version, label, metadata = match.groups()
                if not name:
                    raise invalid_argument("Missing model name in request.")
                if metadata:
                    servable = self.manager.resolve(unquote(name), _parse_version(version), label and unquote(label))
                    return model_metadata_json(servable)
                states = self.manager.model_status(unquote(name), _parse_version(version), label and unquote(label))
                return message_to_json_dict(model_status_response(states))
        raise invalid_argument(f"Malformed request: {method} {path}")

    async def _predict(self, name: str, version: int | None, label: str | None, body: bytes,
                       verifier: bool = False, request_id: str = "") -> dict[str, Any]:
        started = time.perf_counter()
        servable = self.manager.resolve(name, version, label)
        if len(body) > self.inline_bytes:  # a large body is sized up and parsed off the event loop
            loop = asyncio.get_running_loop()
            prepared = await loop.run_in_executor(self.executor, self._prepare, servable, body)
        else:
            prepared = self._prepare(servable, body)
        signature_name, arrays, row_format = prepared
        signature, outputs = await self.predictor.predict(servable, signature_name, arrays, "rest")
        answer = outputs_to_json(outputs, row_format)
        if request_id and not verifier:
            self.metrics.answers.add(request_id, servable.model_name, servable.version, "rest",
                                     time.perf_counter() - started, arrays, outputs)
        if self.request_logger is not None and verifier:
            self.request_logger.leave_out_verifier(servable.model_name)
        elif self.request_logger is not None and self.request_logger.sample():
            self.request_logger.submit(servable.model_name, functools.partial(
                predict_messages_from_arrays, servable.model_name, version, label, servable.version, signature.name,
                arrays, outputs))
        return answer

    def _json_limits(self, servable: ServableVersion) -> tuple[int, int]:
        """(items, depth) a valid body for `servable` can need; the signature is named inside the body, so the most
        permissive of its signatures counts. Worked out once per loaded version."""
        cached = self._json_limits_cache.get(id(servable))
        if cached is not None and cached[0] is servable:
            return cached[1]
        max_batch_size = self.predictor.max_batch_size
        signatures = servable.signatures.values()
        limits = (max(max_json_items(s.inputs, max_batch_size) for s in signatures),
                  max(max_json_depth(s.inputs) for s in signatures))
        if len(self._json_limits_cache) > 64:
            self._json_limits_cache.clear()
        self._json_limits_cache[id(servable)] = (servable, limits)
        return limits

    def _prepare(self, servable: ServableVersion, body: bytes) -> tuple[str, dict[str, np.ndarray], bool]:
        """Sizes up, parses and converts a predict body: (signature name, input arrays, row format?)."""
        max_batch_size = self.predictor.max_batch_size
        check_json_cost(body, *self._json_limits(servable))
        request = parse_json_body(body)
        signature_name = request.get("signature_name", "")
        if not isinstance(signature_name, str):
            raise invalid_argument("'signature_name' key must be a string value.")
        signature = servable.signature(signature_name)
        if "instances" in request and "inputs" in request:
            raise invalid_argument("Not formatted correctly expecting only one of 'inputs' or 'instances' keys")
        if "instances" in request:
            return signature.name, instances_to_arrays(request["instances"], signature.inputs, max_batch_size), True
        if "inputs" in request:
            return signature.name, inputs_to_arrays(request["inputs"], signature.inputs, max_batch_size), False
        raise invalid_argument("Missing 'inputs' or 'instances' key")
