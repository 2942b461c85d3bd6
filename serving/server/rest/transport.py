"""The REST server's HTTP transport: `RestServer` runs an ASGI app on uvicorn with httptools' HTTP/1.1 parser, adding
what uvicorn leaves to a proxy: a deadline for headers, a cap on header size and on connections, and JSON bodies for
the errors the HTTP layer itself answers."""
from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from serving.server.limits import ServingLimits
from serving.server.rest.app import _overloaded_app


def json_response_bytes(status: int, reason: str, message: str) -> bytes:
    """A whole HTTP/1.1 response with a JSON error body that closes the connection (for the protocol layer)."""
    data = json.dumps({"error": message}).encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n"
        "connection: close\r\n\r\n"
    ).encode() + data


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus a deadline for headers, a cap on their size and on connections."""

    limits: ServingLimits  # set on the per-server subclass made by `protocol_class`

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self.app = _overloaded_app
        self._header_timer = None
        self._start_header_clock()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._start_header_clock()

    def on_url(self, url: bytes) -> None:
        self._count_header_bytes(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_header_bytes(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._stop_header_clock()
        super().on_headers_complete()

    def connection_lost(self, exc) -> None:
        self._stop_header_clock()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        # httptools refused the request (e.g. a malformed Content-Length): say so in JSON, as every error here is.
        self._close_with(400, "Bad Request", f"{msg.rstrip('.')}: the request line, headers or body framing "
                                             "(Content-Length, Transfer-Encoding) are not valid HTTP/1.1.")

    def _start_header_clock(self) -> None:
        self._stop_header_clock()
        self._header_bytes = 0
        self._header_timer = self.loop.call_later(self.limits.header_timeout_s, self._headers_too_slow)

    def _stop_header_clock(self) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        self._close_with(408, "Request Timeout", f"The request headers did not arrive within "
                                                 f"{self.limits.header_timeout_s:g} s.")

    def _count_header_bytes(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > self.limits.max_header_bytes:
            self._close_with(431, "Request Header Fields Too Large",
                             f"The request line and headers are over {self.limits.max_header_bytes} bytes.")
            raise ValueError("headers too large")  # stops the parser; the connection is already closing

    def _close_with(self, status: int, reason: str, message: str) -> None:
        self._stop_header_clock()
        if not self.transport.is_closing():
            self.transport.write(json_response_bytes(status, reason, message))
            self.transport.close()


def protocol_class(limits: ServingLimits) -> type[GuardedHttpToolsProtocol]:
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (0: a free port); IPPROTO_TCP so asyncio sets TCP_NODELAY on connections."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


class RestServer:
    """An ASGI app (`RestApp`, or `mlops log-proxy`'s forwarder) on uvicorn, serving on an already bound socket inside
    the server's event loop."""

    def __init__(self, app: Callable[..., Awaitable[None]], sock: socket.socket, limits: ServingLimits) -> None:
        self.sock = sock
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            app, http=protocol_class(limits), lifespan="off", log_config=None, log_level="warning",
            access_log=False, server_header=False, proxy_headers=False, backlog=limits.backlog,
            timeout_keep_alive=limits.keep_alive_timeout_s, timeout_graceful_shutdown=5, ws="none",
        )
        self._server = uvicorn.Server(config)
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._task = asyncio.ensure_future(self._server.serve(sockets=[self.sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise OSError("the REST server stopped while starting")
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            await self._task
        self.sock.close()
