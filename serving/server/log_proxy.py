"""`mlops log-proxy`: a hop in front of an unmodified TF Serving that forwards its REST and gRPC APIs and logs
sampled predictions with the request logger of `mlops serve` (serving/server/request_log.py).

Open-source TF Serving cannot log requests (a `logging_config` fails with "No request-logger-creator provided"), so
on Kubernetes this runs as a sidecar in the serving pod: it listens on the ports the Services target and forwards
each request to TF Serving on localhost. Answers come back as TF Serving gave them: REST status, content type and
body, gRPC messages, status codes and details. The additions are the Prometheus page
(`/monitoring/prometheus/metrics`), to which the proxy appends its own `:mlops:serving:request_log_count` family, and
the failed predictions it saw pass, with their inputs, at `/monitoring/failures/NAME` (serving/server/failures.py),
and the answers to requests with a request id, at `/monitoring/answers/NAME/SINCE` (serving/server/answers.py).
When TF Serving does not answer at all, REST gets 503 and gRPC UNAVAILABLE, as from TF Serving while it starts.

A gRPC Predict is logged as its two messages, untouched. A REST prediction is logged as the PredictRequest and
PredictResponse TF Serving converts it to and from (model_servers/http_rest_api_handler.cc ProcessPredictRequest,
2.16.1): the writer thread asks TF Serving for the signature over gRPC (GetModelMetadata with the request's name and
version or label, cached for `metadata_ttl_s` when it names a label or no version) and converts the JSON with the
signature's dtypes, as `mlops serve` does. That lookup also gives the version that answered, which a REST answer
does not carry: during a label move it is the version the label named when the record was written, within
`metadata_ttl_s` of the answer. Classify and Regress are forwarded, not logged.
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from urllib.parse import unquote

import grpc
import httptools
import uvloop
from tensorflow_serving.apis import get_model_metadata_pb2, prediction_service_pb2_grpc

from serving import (
    DEFAULT_HOST,
    DEFAULT_UPSTREAM_GRPC,
    DEFAULT_UPSTREAM_REST,
    ServingLimits,
    is_verifier,
    request_id,
)
from serving.server.answers import RecentAnswers, outputs_from_json_answer, outputs_from_predict_response
from serving.server.failures import RecentFailures, rows_from_json_body, rows_from_predict_request
from serving.server.grpc.servicer import MAX_RESPONSE_BYTES
from serving.server.monitoring import METRICS_PATH, RequestLogMetrics, VerifierRequestCount
from serving.server.request_log import LoggedPrediction, RequestLogger, predict_messages_from_arrays, wire_model_spec
from serving.server.rest.codec import inputs_to_arrays, instances_to_arrays, parse_json_body
from serving.server.rest.endpoints import PREDICT_PATH, _parse_version
from serving.server.rest.transport import RestServer, bind_socket

logger = logging.getLogger(__name__)

PREDICT_METHOD = "/tensorflow.serving.PredictionService/Predict"
# Hop-by-hop headers (RFC 9110 section 7.6.1) and the framing the proxy sets itself.
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding",
                        b"upgrade", b"content-length", b"expect"})
# Answer headers uvicorn writes itself (a second Date would be a duplicate).
SERVER_SET = frozenset({b"date", b"server"})
# gRPC metadata that the channel sets itself; forwarding it would be refused.
RESERVED_METADATA = frozenset({"user-agent", "te", "content-type", "host"})
# Idle keep-alive connections to TF Serving's REST port kept for reuse.
MAX_IDLE_CONNECTIONS = 64
UPSTREAM_TIMEOUT_S = 300.0
# A failed REST answer that is not TF Serving's JSON is kept by its first characters.
MAX_FORWARDED_ERROR_CHARS = 1024


class UpstreamError(Exception):
    """TF Serving's REST port closed the connection or answered something that is not HTTP/1.1; `answered`: after
    its answer had begun (so the request reached it)."""

    def __init__(self, message: str, answered: bool = False) -> None:
        super().__init__(message)
        self.answered = answered


class _ResponseReader:
    """httptools callbacks collecting one HTTP response."""

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.headers_done = False
        self.done = False
        self.framed = False  # Content-Length or chunked: the body's end is known without the connection closing

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered in (b"content-length", b"transfer-encoding"):
            self.framed = True
        self.headers.append((lowered, value))

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.done = True


class HttpUpstream:
    """HTTP/1.1 to TF Serving's REST port over a pool of keep-alive connections."""

    def __init__(self, host: str, port: int, timeout_s: float = UPSTREAM_TIMEOUT_S) -> None:
        self.host = host
        self.port = port
        self.timeout_s = timeout_s
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def request(self, method: str, target: str, headers: list[tuple[bytes, bytes]], body: bytes,
                      ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """(status, headers, body) of TF Serving's answer; a kept-alive connection it had closed is retried once."""
        head = [f"{method} {target} HTTP/1.1\r\n".encode("latin-1")]
        head += [name + b": " + value + b"\r\n" for name, value in headers if name not in HOP_BY_HOP]
        head.append(b"content-length: %d\r\n\r\n" % len(body))
        message = b"".join(head) + body
        while True:
            reused = bool(self._idle)
            reader, writer = self._idle.pop() if reused else await asyncio.open_connection(self.host, self.port)
            try:
                answer, keep = await asyncio.wait_for(self._exchange(reader, writer, message, method),
                                                      self.timeout_s)
            except (OSError, UpstreamError, asyncio.IncompleteReadError) as e:
                writer.close()
                # A kept-alive connection TF Serving had closed: the request never reached it, so send it again.
                if reused and isinstance(e, (ConnectionError, UpstreamError)) and not getattr(e, "answered", True):
                    continue
                raise
            except BaseException:
                writer.close()
                raise
            if keep and len(self._idle) < MAX_IDLE_CONNECTIONS:
                self._idle.append((reader, writer))
            else:
                writer.close()
            return answer

    async def _exchange(self, reader, writer, message: bytes, method: str):
        writer.write(message)
        collected = _ResponseReader()
        parser = httptools.HttpResponseParser(collected)
        while not collected.done:
            data = await reader.read(65536)
            if not data:
                if collected.headers_done and not collected.framed:
                    break  # a body that ends with the connection
                raise UpstreamError("TF Serving closed the connection before it answered", collected.headers_done)
            try:
                parser.feed_data(data)
            except httptools.HttpParserError as e:
                raise UpstreamError(f"TF Serving's answer is not valid HTTP/1.1: {e}") from e
            if method == "HEAD" and collected.headers_done:
                return (parser.get_status_code(), collected.headers, b""), False
        keep = collected.done and collected.framed and parser.should_keep_alive()
        return (parser.get_status_code(), collected.headers, b"".join(collected.body)), keep

    def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


class SignatureSource:
    """The version that answers a model spec and its signatures, from TF Serving's GetModelMetadata (writer thread)."""

    def __init__(self, target: str, ttl_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._channel = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", MAX_RESPONSE_BYTES)])
        self._stub = prediction_service_pb2_grpc.PredictionServiceStub(self._channel)
        self._ttl_s = ttl_s
        self._clock = clock
        # (model, version, label) -> (fetched at, version that answered, signatures)
        self._cache: dict[tuple, tuple[float, int, get_model_metadata_pb2.SignatureDefMap]] = {}

    def resolve(self, model: str, version: int | None, label: str | None,
                ) -> tuple[int, get_model_metadata_pb2.SignatureDefMap]:
        key = (model, version, label)
        cached = self._cache.get(key)
        # A version's signatures do not change; which version a label or "latest" names does.
        if cached is not None and (version is not None or self._clock() - cached[0] < self._ttl_s):
            return cached[1], cached[2]
        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        request.model_spec.name = model
        if version is not None:
            request.model_spec.version.value = version
        elif label:
            request.model_spec.version_label = label
        response = self._stub.GetModelMetadata(request, timeout=10)
        signatures = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(signatures)
        if len(self._cache) > 256:
            self._cache.clear()
        self._cache[key] = (self._clock(), response.model_spec.version.value, signatures)
        return response.model_spec.version.value, signatures

    def close(self) -> None:
        self._channel.close()


def rest_prediction(signatures: SignatureSource, model: str, version: int | None, label: str | None, body: bytes,
                    answer: bytes) -> LoggedPrediction:
    """A REST prediction TF Serving answered, as the PredictRequest and PredictResponse it stands for."""
    answered, signature_defs = signatures.resolve(model, version, label)
    request = parse_json_body(body)
    signature_name = request.get("signature_name") or "serving_default"
    if signature_name not in signature_defs.signature_def:  # indexing a protobuf map would add the key
        raise KeyError(f"model {model} version {answered} has no signature {signature_name!r}")
    signature = signature_defs.signature_def[signature_name]
    unbounded = sys.maxsize
    if "instances" in request:
        inputs = instances_to_arrays(request["instances"], signature.inputs, unbounded)
    else:
        inputs = inputs_to_arrays(request["inputs"], signature.inputs, unbounded)
    payload = json.loads(answer)
    if "predictions" in payload:
        outputs = instances_to_arrays(payload["predictions"], signature.outputs, unbounded)
    else:
        outputs = inputs_to_arrays(payload["outputs"], signature.outputs, unbounded)
    return predict_messages_from_arrays(model, version, label, answered, signature_name, inputs, outputs)


def grpc_prediction(request: bytes, response: bytes) -> LoggedPrediction:
    """A gRPC Predict TF Serving answered: its messages as they were, and who answered from the response."""
    spec = wire_model_spec(response, 2)
    return LoggedPrediction(spec.version.value, spec.signature_name, request, response)


class _ClientGone(Exception):
    """The client closed its connection before its request's body was in: nothing to forward or answer."""


def _json_error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


class RestForwarder:
    """ASGI app: every request to TF Serving's REST port, its answer back unchanged; sampled predictions logged."""

    def __init__(self, upstream: HttpUpstream, limits: ServingLimits, request_logger: RequestLogger | None,
                 signatures: SignatureSource | None, metrics: RequestLogMetrics, failures: RecentFailures,
                 verifier_requests: VerifierRequestCount, answers: RecentAnswers | None = None) -> None:
        self.upstream = upstream
        self.answers = answers or RecentAnswers()
        self.limits = limits
        self.request_logger = request_logger
        self.signatures = signatures
        self.metrics = metrics
        self.failures = failures
        self.verifier_requests = verifier_requests

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        method = scope["method"]
        path = scope["raw_path"].decode("latin-1")
        query = scope.get("query_string", b"")
        kept = (self.failures.answer(path) or self.answers.answer(path)) if method == "GET" else None
        if kept is not None:
            await _send(send, kept[0], [(b"content-type", b"application/json")], json.dumps(kept[1]).encode())
            return
        try:
            body = await self._read_body(receive)
        except _ClientGone:
            return
        if body is None:
            await _send(send, 413, [(b"content-type", b"application/json")], _json_error(
                f"Request body is over the limit of {self.limits.max_request_bytes} bytes; send fewer examples per "
                "request."))
            return
        target = path + ("?" + query.decode("latin-1") if query else "")
        started = time.perf_counter()
        try:
            status, headers, answer = await self.upstream.request(method, target, scope["headers"], body)
        except (OSError, UpstreamError, asyncio.IncompleteReadError, asyncio.TimeoutError) as e:
            await _send(send, 503, [(b"content-type", b"application/json"), (b"retry-after", b"1")], _json_error(
                f"TF Serving at {self.upstream.host}:{self.upstream.port} did not answer ({type(e).__name__}: {e}); "
                "retry once it is up."))
            return
        if method == "GET" and path == METRICS_PATH and status == 200:
            answer += (self.metrics.text() + self.verifier_requests.text()).encode()
        await _send(send, status, [(n, v) for n, v in headers if n not in HOP_BY_HOP and n not in SERVER_SET],
                    answer)
        verifier = is_verifier(scope["headers"])
        if verifier and method == "POST":
            self._count_verifier(path, status)
        if status == 200 and method == "POST" and not verifier:
            self._keep_answer(path, body, answer, request_id(scope["headers"]), time.perf_counter() - started)
        if status == 200 and method == "POST" and self.request_logger is not None:
            self._maybe_log(path, body, answer, verifier)
        elif status != 200 and method == "POST":
            self._keep_failure(path, body, status, answer, verifier)

    def _count_verifier(self, path: str, status: int) -> None:
        """The verifier's prediction, counted apart (TF Serving's request_count counts it with the users')."""
        match = PREDICT_PATH.fullmatch(path)
        if match is not None and match.group(4).lower() == "predict":
            self.verifier_requests.count(unquote(match.group(1)), "OK" if status == 200 else f"HTTP {status}")

    def _keep_answer(self, path: str, body: bytes, answer: bytes, request: str, seconds: float) -> None:
        """A prediction TF Serving answered to a request with an id (the router's), for the shadow step. Its REST
        answer names no version: the one the path asked for, if any."""
        match = PREDICT_PATH.fullmatch(path) if request else None
        if match is None or match.group(4).lower() != "predict":
            return
        version = int(match.group(2)) if match.group(2) and match.group(2).isdigit() else None
        rows, row_count = rows_from_json_body(body)
        self.answers.keep(request, unquote(match.group(1)), version, "rest", seconds, rows, row_count,
                          outputs_from_json_answer(answer))

    def _keep_failure(self, path: str, body: bytes, status: int, answer: bytes, verifier: bool) -> None:
        """A prediction TF Serving refused, with its inputs. TF Serving's REST answer names neither the version nor
        the canonical code: the version is the one the path asked for, the code the HTTP status."""
        match = PREDICT_PATH.fullmatch(path)
        if match is None or match.group(4).lower() != "predict":
            return
        try:
            message = str(json.loads(answer)["error"])
        except (ValueError, KeyError, TypeError):
            message = answer[:MAX_FORWARDED_ERROR_CHARS].decode("utf-8", errors="replace")
        version = int(match.group(2)) if match.group(2) and match.group(2).isdigit() else None
        self.failures.add(unquote(match.group(1)), version, "rest", f"HTTP {status}", message, verifier,
                          rows_from_json_body(body))

    def _maybe_log(self, path: str, body: bytes, answer: bytes, verifier: bool) -> None:
        match = PREDICT_PATH.fullmatch(path)
        if match is None or match.group(4).lower() != "predict":
            return
        name, version, label = unquote(match.group(1)), match.group(2), match.group(3)
        if verifier:
            self.request_logger.leave_out_verifier(name)
            return
        if not self.request_logger.sample():
            return
        try:
            version_number = _parse_version(version)
        except Exception:  # noqa: BLE001 - TF Serving answered it, so this does not happen
            return
        self.request_logger.submit(name, functools.partial(
            rest_prediction, self.signatures, name, version_number, label and unquote(label), body, answer))

    async def _read_body(self, receive) -> bytes | None:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limits.max_request_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


async def _send(send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class GrpcForwarder(grpc.GenericRpcHandler):
    """Every unary gRPC method (all of TF Serving's PredictionService and ModelService), forwarded as bytes."""

    def __init__(self, channel: grpc.aio.Channel, request_logger: RequestLogger | None,
                 failures: RecentFailures, verifier_requests: VerifierRequestCount,
                 answers: RecentAnswers | None = None) -> None:
        self.channel = channel
        self.answers = answers or RecentAnswers()
        self.request_logger = request_logger
        self.failures = failures
        self.verifier_requests = verifier_requests
        self._callables: dict[str, grpc.aio.UnaryUnaryMultiCallable] = {}

    def service(self, handler_call_details):
        method = handler_call_details.method
        return grpc.unary_unary_rpc_method_handler(functools.partial(self._forward, method))

    async def _forward(self, method: str, request: bytes, context) -> bytes:
        call = self._callables.get(method)
        if call is None:
            call = self._callables[method] = self.channel.unary_unary(method)
        metadata = [(k, v) for k, v in context.invocation_metadata() or ()
                    if not k.startswith((":", "grpc-")) and k not in RESERVED_METADATA]
        started = time.perf_counter()
        try:
            response = await call(request, timeout=context.time_remaining(), metadata=metadata)
        except grpc.aio.AioRpcError as e:
            if method == PREDICT_METHOD:
                self._keep_failure(request, e, metadata)
                if is_verifier(metadata):
                    self._count_verifier(request, e.code().name)
            await context.abort(e.code(), e.details() or "", _user_metadata(e.trailing_metadata()))
        verifier = is_verifier(metadata)
        if method == PREDICT_METHOD and verifier:
            self._count_verifier(request, "OK")
        if method == PREDICT_METHOD and not verifier and (request_key := request_id(metadata)):
            self._keep_answer(request, response, request_key, time.perf_counter() - started)
        if method == PREDICT_METHOD and self.request_logger is not None:
            if not verifier and not self.request_logger.sample():
                return response
            try:
                model = wire_model_spec(request, 1).name
            except Exception:  # noqa: BLE001 - TF Serving parsed it, so this does not happen
                return response
            if verifier:
                self.request_logger.leave_out_verifier(model)
            else:
                self.request_logger.submit(model, functools.partial(grpc_prediction, request, response))
        return response

    def _keep_answer(self, request: bytes, response: bytes, request_key: str, seconds: float) -> None:
        try:
            model = wire_model_spec(request, 1).name
        except Exception:  # noqa: BLE001 - TF Serving parsed it, so this does not happen
            return
        version, outputs = outputs_from_predict_response(response)
        rows, row_count = rows_from_predict_request(request)
        self.answers.keep(request_key, model, version, "grpc", seconds, rows, row_count, outputs)

    def _count_verifier(self, request: bytes, status: str) -> None:
        try:
            self.verifier_requests.count(wire_model_spec(request, 1).name, status)
        except Exception:  # noqa: BLE001 - a message TF Serving could not parse names no model
            return

    def _keep_failure(self, request: bytes, error: grpc.aio.AioRpcError, metadata: list) -> None:
        try:
            spec = wire_model_spec(request, 1)
        except Exception:  # noqa: BLE001 - a message TF Serving could not parse names no model
            return
        version = spec.version.value if spec.HasField("version") else None
        self.failures.add(spec.name, version, "grpc", error.code().name, error.details() or "", is_verifier(metadata),
                          rows_from_predict_request(request))


def _user_metadata(metadata) -> tuple:
    return tuple((k, v) for k, v in metadata or () if not k.startswith((":", "grpc-")))


def _host_port(target: str) -> tuple[str, int]:
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"TF Serving address {target!r} must be HOST:PORT, e.g. 127.0.0.1:9501.")
    return host.strip("[]"), int(port)


class LogProxy:
    """Listens for TF Serving's REST and gRPC APIs on host:rest_port and host:grpc_port (0: a free port) and forwards
    them to a TF Serving at `upstream_rest` and `upstream_grpc` (HOST:PORT), logging with `request_logger` when given;
    `stop` writes what the logger holds and closes it."""

    def __init__(self, upstream_rest: str = DEFAULT_UPSTREAM_REST, upstream_grpc: str = DEFAULT_UPSTREAM_GRPC,
                 host: str = DEFAULT_HOST, rest_port: int = 8501, grpc_port: int = 8500,
                 request_logger: RequestLogger | None = None, limits: ServingLimits | None = None,
                 metadata_ttl_s: float = 1.0) -> None:
        self.upstream_rest = _host_port(upstream_rest)
        self.upstream_grpc = upstream_grpc
        _host_port(upstream_grpc)
        self.host = host
        self.request_logger = request_logger
        self.limits = limits or ServingLimits()
        self.metrics = request_logger.metrics if request_logger is not None else RequestLogMetrics()
        self.failures = RecentFailures()
        self.answers = RecentAnswers()
        self.verifier_requests = VerifierRequestCount()
        if request_logger is not None:
            self.failures.on_users_failure = request_logger.submit_failure
        self.metadata_ttl_s = metadata_ttl_s
        self._requested_ports = (rest_port, grpc_port)
        self.rest_port: int | None = None
        self.grpc_port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._rest: RestServer | None = None
        self._grpc_server: grpc.aio.Server | None = None
        self._channel: grpc.aio.Channel | None = None
        self._upstream: HttpUpstream | None = None
        self._signatures: SignatureSource | None = None

    @property
    def rest_url(self) -> str:
        return f"http://{self.host}:{self.rest_port}"

    @property
    def grpc_target(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    def start(self) -> None:
        rest_port, grpc_port = self._requested_ports
        sock = bind_socket(self.host, rest_port)
        if self.request_logger is not None:
            self._signatures = SignatureSource(self.upstream_grpc, self.metadata_ttl_s)
        message_limits = [("grpc.max_receive_message_length", self.limits.max_request_bytes),
                          ("grpc.max_send_message_length", MAX_RESPONSE_BYTES)]

        async def start_front_ends() -> None:
            self._upstream = HttpUpstream(*self.upstream_rest)
            self._channel = grpc.aio.insecure_channel(self.upstream_grpc, options=[
                ("grpc.max_send_message_length", self.limits.max_request_bytes),
                ("grpc.max_receive_message_length", MAX_RESPONSE_BYTES)])
            forwarder = RestForwarder(self._upstream, self.limits, self.request_logger, self._signatures,
                                      self.metrics, self.failures, self.verifier_requests, self.answers)
            self._rest = RestServer(forwarder, sock, self.limits)
            self.rest_port = self._rest.port
            await self._rest.start()
            self._grpc_server = grpc.aio.server(options=[*message_limits, ("grpc.so_reuseport", 0)],
                                                maximum_concurrent_rpcs=self.limits.max_in_flight_requests)
            self._grpc_server.add_generic_rpc_handlers(
                (GrpcForwarder(self._channel, self.request_logger, self.failures, self.verifier_requests,
                               self.answers),))
            self.grpc_port = self._grpc_server.add_insecure_port(f"{self.host}:{grpc_port}")
            if self.grpc_port == 0:
                raise OSError(f"Could not bind gRPC to {self.host}:{grpc_port}; is the port in use?")
            await self._grpc_server.start()

        self._loop = uvloop.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="log-proxy-event-loop", daemon=True)
        self._loop_thread.start()
        try:
            asyncio.run_coroutine_threadsafe(start_front_ends(), self._loop).result(timeout=60)
        except BaseException:
            if self._rest is None:
                sock.close()
            self.stop()
            raise

    def stop(self) -> None:
        if self._loop is not None:
            async def stop_front_ends() -> None:
                if self._grpc_server is not None:
                    await self._grpc_server.stop(1.0)
                if self._rest is not None:
                    await self._rest.stop()
                if self._channel is not None:
                    await self._channel.close()
                if self._upstream is not None:
                    self._upstream.close()

            try:
                asyncio.run_coroutine_threadsafe(stop_front_ends(), self._loop).result(timeout=30)
            finally:
                self._grpc_server = self._rest = self._channel = self._upstream = None
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._loop_thread.join(timeout=10)
                self._loop.close()
                self._loop = None
        if self.request_logger is not None:  # after the front ends: no request is left to log
            self.request_logger.close()
        if self._signatures is not None:
            self._signatures.close()
            self._signatures = None

    def __enter__(self) -> LogProxy:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()
