"""`RestApp`, the ASGI application that sizes up, admits and reads each request before `RestApi` (endpoints.py) sees
it, and answers what it refuses itself (too large, too slow, overloaded) with JSON errors."""
from __future__ import annotations

import asyncio
import json

from serving import is_verifier, request_id
from serving.server.errors import ServingRequestError
from serving.server.limits import AdmissionControl, ServingLimits, check_request_bytes
from serving.server.monitoring import METRICS_PATH
from serving.server.rest.endpoints import RestApi

# An unread body up to this size is read and dropped before an early error, so the connection stays usable and the
# client reads the answer instead of a reset; a larger one closes the connection.
DRAIN_BYTES = 1024 * 1024


class _EarlyAnswer(Exception):
    """Ends a request before the protocol sees it (too large, too slow, overloaded)."""

    def __init__(self, status: int, message: str, close: bool) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.close = close


class RestApp:
    """ASGI application: bounds each request's size, time and admission, then hands it to `RestApi`."""

    def __init__(self, api: RestApi, limits: ServingLimits, admission: AdmissionControl) -> None:
        self.api = api
        self.limits = limits
        self.admission = admission

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        method = scope["method"]
        raw_path = scope["raw_path"].decode("latin-1")
        if method == "GET" and raw_path.split("?", 1)[0] == METRICS_PATH:
            await _send_text(send, self.api.metrics.text())
            return
        kept = (self.api.metrics.failures.answer(raw_path) or self.api.metrics.answers.answer(raw_path)
                if method == "GET" else None)
        if kept is not None:
            await _send_json(send, *kept, False)
            return
        length, chunked = _body_framing(scope["headers"])
        body_pending = chunked or length > 0
        try:
            status, payload, close = await self._answer(method, raw_path, length, receive, scope["headers"])
        except _EarlyAnswer as e:
            status, payload, close = e.status, {"error": e.message}, e.close
            if body_pending and not close and not await self._drained(receive, length, chunked):
                close = True
        await _send_json(send, status, payload, close)

    async def _answer(self, method, raw_path, length, receive, headers) -> tuple[int, dict, bool]:
        if not raw_path.lower().startswith("/v1/"):
            raise _EarlyAnswer(404, f"Unknown path {raw_path}; the API lives under /v1/models/.", close=False)
        try:
            check_request_bytes(length, self.limits.max_request_bytes)
        except ServingRequestError as e:
            raise _EarlyAnswer(413, e.message, close=True) from e
        if method != "POST":  # status and metadata: cheap, and answered even when predictions are overloaded
            body = await self._read_body(receive, length, None)
            status, payload = await self.api.handle(method, raw_path, body)
            return status, payload, False
        try:
            self.admission.admit(length)
        except ServingRequestError as e:
            self.api.keep_failure(method, raw_path, None, e.code.name, e.message, is_verifier(headers))
            raise _EarlyAnswer(e.http_status, e.message, close=False) from e
        reservation = [length]  # grows with a chunked body
        try:
            body = await self._read_body(receive, length, reservation)
            status, payload = await self.api.handle(method, raw_path, body, is_verifier(headers), request_id(headers))
            return status, payload, False
        finally:
            self.admission.release(reservation[0])

    async def _read_body(self, receive, length: int, reservation: list[int] | None) -> bytes:
        """The whole body within `body_timeout_s`, never more than `max_request_bytes` (chunked bodies too).

        `reservation` holds the bytes admitted for this request; a chunked body's bytes are admitted as they come.
        """
        chunks: list[bytes] = []
        size = 0
        task = asyncio.current_task()
        timed_out = []
        timer = asyncio.get_running_loop().call_later(
            self.limits.body_timeout_s, lambda: (timed_out.append(True), task.cancel())
        )
        try:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _EarlyAnswer(400, "The client closed the connection before sending the whole body.", True)
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.limits.max_request_bytes:
                    raise _EarlyAnswer(413, f"Request body is over the limit of {self.limits.max_request_bytes} "
                                            "bytes; send fewer examples per request.", close=True)
                if reservation is not None and size > reservation[0]:
                    try:
                        self.admission.grow(size - reservation[0])
                    except ServingRequestError as e:
                        raise _EarlyAnswer(e.http_status, e.message, close=True) from e
                    reservation[0] = size
                if chunk:
                    chunks.append(chunk)
                if not message.get("more_body", False):
                    break
        except asyncio.CancelledError:
            if not timed_out:
                raise
            raise _EarlyAnswer(408, f"The request body did not arrive within {self.limits.body_timeout_s:g} s; "
                                    "send it faster or in a smaller request.", close=True) from None
        finally:
            timer.cancel()
        if length and size != length:
            raise _EarlyAnswer(400, f"The body has {size} bytes but Content-Length says {length}.", close=True)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _drained(self, receive, length: int, chunked: bool) -> bool:
        """Reads and drops a small unread body so the connection can carry the next request."""
        if chunked or length > DRAIN_BYTES:
            return False
        try:
            size = 0
            while True:
                message = await asyncio.wait_for(receive(), self.limits.body_timeout_s)
                if message["type"] == "http.disconnect":
                    return False
                size += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return size == length
        except asyncio.TimeoutError:
            return False


def _body_framing(headers: list[tuple[bytes, bytes]]) -> tuple[int, bool]:
    """(Content-Length, chunked?) from the request headers; httptools has already refused malformed ones."""
    length, chunked = 0, False
    for name, value in headers:
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = True
    return length, chunked


async def _send_json(send, status: int, payload: dict, close: bool) -> None:
    data = json.dumps(payload, allow_nan=True).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    if status == 503:
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _send_text(send, text: str) -> None:
    data = text.encode("utf-8")
    headers = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8"),
               (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _overloaded_app(scope, receive, send) -> None:
    """Answers every request of a connection over the connection limit, then closes it."""
    if scope["type"] == "http":
        await _send_json(send, 503, {"error": "Server has too many open connections; retry with backoff."}, True)
