"""The limits the REST and gRPC layers enforce, in process and just inside and just outside each threshold.

No model and no server process: a stand-in servable (signatures without a function) and an API that echoes what
reached it, so each limit's two outcomes are visible in milliseconds. The end-to-end cases are in test_under_load.py.
"""
from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow_serving.apis import get_model_metadata_pb2, predict_pb2

from serving import ServingLimits
from serving.server.errors import ServingRequestError
from serving.server.grpc import codec as grpc_codec
from serving.server.grpc import servicer as grpc_servicer
from serving.server.grpc.servicer import PredictionServicer
from serving.server.limits import AdmissionControl, max_json_items
from serving.server.monitoring import RequestMetrics
from serving.server.rest.app import RestApp
from serving.server.rest.codec import leaf_type, parse_json_body
from serving.server.rest.endpoints import RestApi
from serving.server.rest.transport import RestServer, bind_socket
from serving.server.servable import ServableVersion, Signature

PREDICT = "/v1/models/m:predict"
MAX_BATCH = 4


def info(dims: list[int], dtype=types_pb2.DT_FLOAT) -> meta_graph_pb2.TensorInfo:
    shape = tensor_shape_pb2.TensorShapeProto()
    for size in dims:
        shape.dim.add().size = size
    return meta_graph_pb2.TensorInfo(dtype=dtype, tensor_shape=shape)


def servable(**signature_inputs: dict) -> ServableVersion:
    """A loaded version whose signatures (name -> inputs) have no function: enough for every check before a call."""
    signatures = {name: Signature(name, inputs, {}, None) for name, inputs in signature_inputs.items()}
    return ServableVersion("m", 1, "", get_model_metadata_pb2.SignatureDefMap(), signatures, None)


# x: two floats per example; s: one string per example. "wide", listed first, takes three floats per example.
MODEL = servable(wide={"x": info([-1, 3])},
                 serving_default={"x": info([-1, 2]), "s": info([-1], types_pb2.DT_STRING)})


class Manager:
    def resolve(self, name, version, label) -> ServableVersion:
        return MODEL


class Predictor:
    max_batch_size = MAX_BATCH


# ------------------------------------------------------------------------------------------------------ gRPC
def grpc_request(rows: int, signature: str = "", width: int = 2, extra_values: int = 0) -> bytes:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "m"
    request.model_spec.signature_name = signature
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.ones((rows, width), np.float32)))
    x = request.inputs["x"]
    x.float_val.extend(np.frombuffer(x.tensor_content, np.float32).tolist() + [1.0] * extra_values)
    x.ClearField("tensor_content")  # values in float_val, as most clients send them
    if not signature:
        request.inputs["s"].CopyFrom(tf.make_tensor_proto([b"a"] * rows, dtype=tf.string))
    return request.SerializeToString()


def prepare(data: bytes) -> tuple[predict_pb2.PredictRequest, ServableVersion, dict[str, np.ndarray]]:
    servicer = PredictionServicer(Manager(), Predictor(), AdmissionControl(8, 1 << 20), None, 1 << 20)
    return servicer._prepare(data)


def grpc_refused(data: bytes) -> str:
    with pytest.raises(ServingRequestError) as error:
        prepare(data)
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT
    return error.value.message


def test_grpc_batch_at_the_limit_is_accepted_and_one_more_row_refused():
    request, servable_version, arrays = prepare(grpc_request(MAX_BATCH))
    assert (request.model_spec.name, servable_version) == ("m", MODEL)
    assert arrays["x"].shape == (MAX_BATCH, 2) and arrays["x"].dtype == np.float32
    assert arrays["s"].tolist() == [b"a"] * MAX_BATCH
    assert grpc_refused(grpc_request(MAX_BATCH + 1)) == (
        "Batch size 5 is larger than the maximum batch size 4; split the request into smaller ones."
    )


def test_grpc_values_at_the_declared_count_are_accepted_and_one_more_refused():
    assert prepare(grpc_request(2))[2]["x"].shape == (2, 2)
    assert grpc_refused(grpc_request(2, extra_values=1)) == (
        "Input x declares shape [2, 2] (4 elements) but carries 5 values; make the shape match the values."
    )


def vector(dtype, values: list, dims: list[int], content: bytes = b"") -> tensor_pb2.TensorProto:
    """A TensorProto of `values` in its dtype's value field, declaring shape `dims` (and `content` as raw bytes)."""
    tensor = tf.make_tensor_proto(np.array(values, dtype=dtype))
    field = grpc_codec._FAST_DTYPES[tensor.dtype][0]
    if tensor.tensor_content:  # values in their field, as most clients send them
        getattr(tensor, field).extend(np.frombuffer(tensor.tensor_content, dtype).tolist())
        tensor.ClearField("tensor_content")
    del tensor.tensor_shape.dim[:]
    for size in dims:
        tensor.tensor_shape.dim.add().size = size
    if content:
        tensor.tensor_content = content
    return tensor


@pytest.mark.parametrize("tensor,most,taken", [
    (vector(np.float32, [1.0, 2.0], [2]), 2, True),
    (vector(np.int64, [7, 8, 9], [3]), 4, True),
    (vector(object, [b"a", b""], [2]), 2, True),
    (vector(np.bool_, [True], [1]), 1, True),
    (vector(np.float32, [], [0]), 4, True),
    (vector(np.float32, [1.0, 2.0, 3.0], [3]), 2, False),  # more than a batch: the full checks refuse it
    (vector(np.float32, [1.0], [2]), 4, False),  # fewer values than its shape: TF pads them
    (vector(np.float32, [1.0, 2.0], [1]), 4, False),  # more values than its shape: refused
    (vector(np.float32, [], [-1]), 4, False),  # a negative size: refused
    (vector(np.float32, [1.0, 2.0], [1, 2]), 4, False),  # rank 2
    (vector(np.float32, [], [1], content=np.float32([5.0]).tobytes()), 4, False),  # values as raw bytes
    (vector(np.float32, [], [0], content=bytes(3)), 4, False),  # raw bytes that fit no shape: refused
])
def test_a_vector_filled_as_its_shape_says_is_converted_at_once_and_any_other_tensor_fully_checked(tensor, most, taken):
    """The fast path of `_prepare` takes only tensors the full checks accept, and builds the same array."""
    fast = grpc_codec._filled_vector(tensor, tensor.dtype, most)
    assert (fast is not None) == taken
    declared = [d.size for d in tensor.tensor_shape.dim]
    try:
        grpc_servicer.check_tensor_proto("v", tensor, declared, max_elements=most, max_batch_size=most)
        full = grpc_codec.tensor_proto_to_array(tensor, declared)
    except (ServingRequestError, ValueError, TypeError):
        full = None
    if taken:
        assert full is not None and fast.dtype == full.dtype and fast.tolist() == full.tolist()


@pytest.mark.parametrize("wire_check_bytes,message", [
    (0, "Input x carries more than 12 values"),  # larger than the threshold: counted on the wire, never parsed
    (None, "Input x declares shape [4, 3] (12 elements) but carries 13 values"),  # at it: parsed, then checked
])
def test_a_grpc_message_over_the_wire_check_size_is_counted_before_parsing(monkeypatch, wire_check_bytes, message):
    over = grpc_request(MAX_BATCH, "wide", width=3, extra_values=1)
    monkeypatch.setattr(grpc_servicer, "WIRE_CHECK_BYTES", len(over) if wire_check_bytes is None else wire_check_bytes)
    assert message in grpc_refused(over)


def test_the_wire_count_limit_of_an_input_is_its_largest_full_batch_over_all_signatures(monkeypatch):
    monkeypatch.setattr(grpc_servicer, "WIRE_CHECK_BYTES", 0)
    # x holds 4 x 2 values in serving_default and 4 x 3 in "wide": a message may carry 12 before it is parsed.
    assert prepare(grpc_request(MAX_BATCH, "wide", width=3))[2]["x"].shape == (MAX_BATCH, 3)
    assert "Input x carries more than 12 values" in grpc_refused(grpc_request(MAX_BATCH, "wide", 3, extra_values=1))


def test_grpc_inputs_are_checked_against_the_signature_by_name_and_dtype():
    request = predict_pb2.PredictRequest.FromString(grpc_request(1))
    request.inputs["tips"].CopyFrom(tf.make_tensor_proto([1.0]))
    assert grpc_refused(request.SerializeToString()) == (
        "input tensor alias not found in signature: tips. Inputs expected to be in the set {s,x}."
    )
    request = predict_pb2.PredictRequest.FromString(grpc_request(1))
    request.inputs["x"].dtype = types_pb2.DT_DOUBLE
    assert grpc_refused(request.SerializeToString()) == "Expects arg[x] to be float but double is provided"
    request.inputs["x"].dtype = types_pb2.DT_INVALID
    assert grpc_refused(request.SerializeToString()) == "Expects arg[x] to be float but an unset dtype is provided"


def test_a_grpc_tensor_that_fits_its_shape_but_is_no_array_is_invalid_argument():
    request = predict_pb2.PredictRequest.FromString(grpc_request(1))
    request.inputs["s"].ClearField("string_val")
    request.inputs["s"].tensor_content = bytes(8)  # strings as raw bytes: the size of one object, but no string
    assert grpc_refused(request.SerializeToString()).startswith("Input s is not a valid TensorProto: ")


@pytest.mark.parametrize("wire_check_bytes", [0, 1 << 20])
def test_bytes_that_are_not_a_predict_request_are_invalid_argument(monkeypatch, wire_check_bytes):
    monkeypatch.setattr(grpc_servicer, "WIRE_CHECK_BYTES", wire_check_bytes)
    assert grpc_refused(b"\x12\xff\xff\xff\x7f").startswith("The PredictRequest is not a valid protobuf message (")


class HeldPredictor(Predictor):
    """Answers each request with the row sums of x, after `release` is set (so calls can be held in flight)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.release.set()
        self.calls: list[tuple[str, list[str]]] = []
        self.failure: Exception | None = None

    async def predict(self, servable_version, signature_name, inputs, transport, output_filter=()):
        self.calls.append((transport, output_filter))
        if self.failure is not None:
            raise self.failure
        await self.release.wait()
        signature = servable_version.signature(signature_name)
        return signature, {"sums": inputs["x"].sum(axis=1)}


def grpc_calls(limits: ServingLimits, scenario) -> object:
    """Runs `scenario(predict, predictor, admission)` against GrpcServer with the stand-in model on a free port."""

    async def run():
        predictor = HeldPredictor()
        admission = AdmissionControl(limits.max_in_flight_requests, limits.max_in_flight_bytes)
        parser = ThreadPoolExecutor(max_workers=1, thread_name_prefix="request-parser")
        server = grpc_servicer.GrpcServer(Manager(), predictor, admission, limits, "127.0.0.1", 0, 1, parser)
        await server.start()
        try:
            options = [("grpc.max_send_message_length", 1 << 24)]
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}", options=options) as channel:
                predict = channel.unary_unary(f"/{grpc_servicer.SERVICE}/Predict")
                return await scenario(predict, predictor, admission)
        finally:
            await server.stop(0)
            parser.shutdown()

    return asyncio.run(run())


def padded_request(size: int) -> bytes:
    """A one-row PredictRequest of exactly `size` bytes (padded in model_spec.version_label, which the stand-in
    manager ignores)."""
    request = predict_pb2.PredictRequest.FromString(grpc_request(1))
    base = len(request.SerializeToString())
    request.model_spec.version_label = "a" * (size - base - 4)  # field tag and a 2-byte length
    data = request.SerializeToString()
    assert len(data) == size
    return data


def test_a_grpc_message_at_the_byte_limit_is_answered_and_one_byte_more_is_resource_exhausted():
    async def scenario(predict, predictor, admission):
        answer = predict_pb2.PredictResponse.FromString(await predict(padded_request(1000), timeout=10))
        assert tf.make_ndarray(answer.outputs["sums"]).tolist() == [2.0]
        spec = answer.model_spec
        assert (spec.name, spec.version.value, spec.signature_name) == ("m", 1, "serving_default")
        answer = predict_pb2.PredictResponse.FromString(await predict(grpc_request(1, "wide", 3), timeout=10))
        assert (answer.model_spec.signature_name, tf.make_ndarray(answer.outputs["sums"]).tolist()) == ("wide", [3.0])
        assert predictor.calls == [("grpc", []), ("grpc", [])]
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await predict(padded_request(1001), timeout=10)
        return error.value.code()

    assert grpc_calls(ServingLimits(max_request_bytes=1000), scenario) == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_grpc_message_up_to_inline_bytes_is_parsed_on_the_event_loop_and_a_larger_one_on_the_pool(monkeypatch):
    threads = []
    real_prepare = PredictionServicer._prepare
    monkeypatch.setattr(PredictionServicer, "_prepare",
                        lambda self, data: threads.append(threading.current_thread().name) or real_prepare(self, data))

    async def scenario(predict, predictor, admission):
        await predict(padded_request(300), timeout=10)
        await predict(padded_request(301), timeout=10)

    grpc_calls(ServingLimits(inline_bytes=300), scenario)
    assert threads[0] == threading.current_thread().name and threads[1].startswith("request-parser")


def test_an_internal_error_in_a_grpc_call_is_internal_and_logged_with_the_method(caplog):
    async def scenario(predict, predictor, admission):
        predictor.failure = RuntimeError("the model broke")
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await predict(grpc_request(1), timeout=10)
        return error.value.code(), error.value.details(), (admission.requests, admission.bytes)

    code, details, in_flight = grpc_calls(ServingLimits(), scenario)
    assert (code, in_flight) == (grpc.StatusCode.INTERNAL, (0, 0))
    assert details == "Internal error: the model broke"
    logged = [r.getMessage() for r in caplog.records if r.name == "serving.server.grpc.servicer"]
    assert logged == ["internal error in Predict"]


def test_grpc_calls_past_the_in_flight_bound_get_unavailable_and_every_slot_is_given_back():
    async def scenario(predict, predictor, admission):
        with pytest.raises(grpc.aio.AioRpcError) as error:  # a refused call gives its slot back
            await predict(grpc_request(MAX_BATCH + 1), timeout=10)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (admission.requests, admission.bytes) == (0, 0)
        predictor.release.clear()
        admission.admit(100)  # a REST request in flight: the bound is shared by both transports
        held = [asyncio.ensure_future(predict(grpc_request(1), timeout=10))]
        while admission.requests < 2:  # at the limit, admitted and waiting for the model
            await asyncio.sleep(0.01)
        assert admission.bytes == 100 + len(grpc_request(1))
        for _ in range(100):
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await predict(grpc_request(1), timeout=10)
            # grpc.aio frees a call's slot in its own cap (the same size) a moment after the call is answered: the
            # refused call above may still hold it. Only that cap's answer is waited out.
            if "Concurrent RPC limit exceeded" not in error.value.details():
                break
            await asyncio.sleep(0.01)
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE
        assert error.value.details() == (
            "Server is overloaded: 2 requests in flight, the limit is 2; retry with backoff."
        )
        predictor.release.set()
        assert len(await asyncio.gather(*held)) == 1
        admission.release(100)
        return admission.requests, admission.bytes

    limits = ServingLimits(max_in_flight_requests=2, max_in_flight_bytes=1 << 20)
    assert grpc_calls(limits, scenario) == (0, 0)


# ------------------------------------------------------------------------------------------------------ REST
class EchoApi:
    """Stands in for RestApi: answers what reached it, and the admission counts while it was being answered."""

    def __init__(self, admission: AdmissionControl) -> None:
        self.admission = admission
        self.metrics = RequestMetrics()
        self.kept: list[tuple] = []  # RestApi.keep_failure's arguments: the refusals RestApp keeps

    def keep_failure(self, *arguments) -> None:
        self.kept.append(arguments)

    async def handle(self, method: str, raw_path: str, body: bytes, verifier: bool = False,
                     request_id: str = "") -> tuple[int, dict]:
        in_flight = [self.admission.requests, self.admission.bytes]
        return 200, {"method": method, "path": raw_path, "body": body.decode(), "in_flight": in_flight}


def rest_app(admission: AdmissionControl | None = None, **limits) -> RestApp:
    admission = admission or AdmissionControl(max_requests=4, max_bytes=1000)
    limits = ServingLimits(**{"max_request_bytes": 100, "body_timeout_s": 0.2, **limits})
    return RestApp(EchoApi(admission), limits, admission)


def asgi_exchange(app: RestApp, method: str, chunks: list[bytes], length: int | None = None, path: str = PREDICT,
                  then: str = "wait") -> tuple[int, dict[str, str], dict, int]:
    """(status, headers, JSON body, times the app called receive) for one request whose body arrives in `chunks`.

    `length` None sends it chunked. After the last chunk the client waits (`then="wait"`) or goes away
    ("disconnect"); a chunk of None means the client stops sending there without finishing the body.
    """
    headers = [(b"host", b"x")]
    headers.append((b"transfer-encoding", b"chunked") if length is None else (b"content-length", str(length).encode()))
    scope = {"type": "http", "method": method, "raw_path": path.encode(), "headers": headers}
    messages = []
    for index, chunk in enumerate(chunks):
        more = index < len(chunks) - 1
        if chunk is not None:  # ASGI leaves out an empty body and a false more_body
            messages.append({"type": "http.request", **({"body": chunk} if chunk else {}),
                             **({"more_body": True} if more else {})})
    received = []
    sent = []

    async def receive():
        received.append(1)
        if messages:
            return messages.pop(0)
        if then == "disconnect":
            return {"type": "http.disconnect"}
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start, body = sent
    headers = {name.decode(): value.decode() for name, value in start["headers"]}
    return start["status"], headers, json.loads(body["body"]), len(received)


def test_rest_body_at_the_byte_limit_is_read_and_one_more_byte_refused_unread():
    app = rest_app()
    status, headers, answer, _ = asgi_exchange(app, "POST", [b"a" * 100], length=100)
    assert (status, answer["method"], answer["path"], answer["body"]) == (200, "POST", PREDICT, "a" * 100)
    assert "connection" not in headers
    status, headers, answer, reads = asgi_exchange(app, "POST", [b"a" * 101], length=101)
    assert (status, headers["connection"], reads) == (413, "close", 0)
    assert answer["error"] == (
        "Request of 101 bytes is over the limit of 100 bytes; send fewer examples per request."
    )
    # Status requests are held to the same limit, and their bodies read the same way.
    assert asgi_exchange(app, "GET", [b""], length=101, path="/v1/models/m")[0] == 413
    status, headers, answer, _ = asgi_exchange(app, "GET", [b"ab", None], length=3, path="/v1/models/m",
                                               then="disconnect")
    assert (status, headers["connection"]) == (400, "close")
    status, _, answer, _ = asgi_exchange(app, "GET", [b"ab"], length=3, path="/v1/models/m")
    assert (status, answer["error"]) == (400, "The body has 2 bytes but Content-Length says 3.")


def test_a_chunked_rest_body_at_the_byte_limit_is_read_and_one_more_byte_refused():
    app = rest_app()
    status, _, answer, _ = asgi_exchange(app, "POST", [b"a" * 60, b"", b"b" * 40])
    assert (status, answer["body"]) == (200, "a" * 60 + "b" * 40)
    status, headers, answer, _ = asgi_exchange(app, "POST", [b"a" * 60, b"b" * 41])
    assert (status, headers["connection"]) == (413, "close")
    assert answer["error"] == "Request body is over the limit of 100 bytes; send fewer examples per request."


def test_rest_requests_past_the_in_flight_bound_get_503_while_status_is_still_answered():
    admission = AdmissionControl(max_requests=2, max_bytes=1000)
    app = rest_app(admission)
    admission.admit(10)  # one request already in flight: this one is the last admitted
    status, _, answer, _ = asgi_exchange(app, "POST", [b"{}"], length=2)
    assert (status, answer["in_flight"]) == (200, [2, 12])  # counted, with its bytes, while it is answered
    assert (admission.requests, admission.bytes) == (1, 10)  # and released after
    admission.admit(10)
    status, headers, answer, reads = asgi_exchange(app, "POST", [b"{}"], length=2)
    assert (status, headers["retry-after"], reads) == (503, "1", 1)  # the small body is drained: keep-alive
    assert "connection" not in headers
    assert answer["error"] == "Server is overloaded: 2 requests in flight, the limit is 2; retry with backoff."
    assert app.api.kept == [("POST", PREDICT, None, "UNAVAILABLE", answer["error"], False)], "kept, without inputs"
    status, headers, answer, _ = asgi_exchange(app, "GET", [b""], length=0, path="/v1/models/m")
    assert (status, answer["method"], answer["in_flight"]) == (200, "GET", [2, 20])
    assert "connection" not in headers


def test_a_chunked_rest_body_is_admitted_as_it_grows_up_to_the_in_flight_byte_bound():
    admission = AdmissionControl(max_requests=4, max_bytes=100)
    app = rest_app(admission)
    admission.admit(40)  # another request holds 40 of the 100 bytes
    status, _, answer, _ = asgi_exchange(app, "POST", [b"a" * 30, b"b" * 30])
    assert (status, answer["in_flight"]) == (200, [2, 100])
    assert (admission.requests, admission.bytes) == (1, 40)
    status, headers, answer, _ = asgi_exchange(app, "POST", [b"a" * 30, b"b" * 31])
    assert (status, headers["connection"]) == (503, "close")
    assert answer["error"] == "Server is overloaded: 70 request bytes in flight; retry with backoff."
    assert (admission.requests, admission.bytes) == (1, 40)


def test_a_rest_body_that_stops_arriving_gets_408_and_one_cut_short_gets_400():
    app = rest_app(body_timeout_s=0.05)
    status, headers, answer, reads = asgi_exchange(app, "POST", [b"{", None], length=5)
    assert (status, headers["connection"], reads) == (408, "close", 2)  # answered at once, not after another wait
    assert answer["error"] == (
        "The request body did not arrive within 0.05 s; send it faster or in a smaller request."
    )
    status, headers, answer, reads = asgi_exchange(app, "POST", [b"{", None], length=5, then="disconnect")
    assert (status, headers["connection"], reads) == (400, "close", 2)
    assert answer["error"] == "The client closed the connection before sending the whole body."
    status, headers, answer, reads = asgi_exchange(app, "POST", [b"{}"], length=5)
    assert (status, headers["connection"], reads) == (400, "close", 1)
    assert answer["error"] == "The body has 2 bytes but Content-Length says 5."
    assert (app.admission.requests, app.admission.bytes) == (0, 0)


def test_rest_paths_outside_the_api_get_404():
    app = rest_app()
    status, headers, answer, _ = asgi_exchange(app, "GET", [b""], length=0, path="/v2/models/m")
    assert (status, answer["error"]) == (404, "Unknown path /v2/models/m; the API lives under /v1/models/.")
    assert "connection" not in headers  # the connection serves the next request
    assert asgi_exchange(app, "GET", [b""], length=0, path="/V1/models/m")[:3:2] == (
        200, {"method": "GET", "path": "/V1/models/m", "body": "", "in_flight": [0, 0]}
    )


def test_rest_json_limits_are_those_of_the_most_permissive_signature():
    api = RestApi(Manager(), Predictor(), None, inline_bytes=1 << 20)
    # "wide" holds the most values (4 x 5), "deep" the deepest input (rank 3): a body may need either.
    two = servable(wide={"x": info([-1, 5])}, deep={"x": info([-1, 1, 1])})
    assert api._json_limits(two) == (max_json_items({"x": info([-1, 5])}, MAX_BATCH), 3 + 3) == (3 * 20 + 8 + 64, 6)
    assert api._json_limits(two) is api._json_limits(two)  # worked out once per loaded version


def raw_http(limits: ServingLimits, request: bytes, idle_connections: int = 0) -> tuple[int, dict]:
    """Status and JSON answer to `request` from the HTTP layer on uvicorn, after opening `idle_connections`."""

    async def exchange() -> tuple[int, dict]:
        admission = AdmissionControl(4, 1000)
        app = RestApp(EchoApi(admission), limits, admission)

        async def asgi(scope, receive, send) -> None:
            # uvicorn probes an app object by calling it without arguments; under mutmut's trampolines a RestApp
            # would answer with a coroutine, so it is handed a plain coroutine function.
            await app(scope, receive, send)

        server = RestServer(asgi, bind_socket("127.0.0.1", 0), limits)
        await server.start()
        idle = []
        try:
            for _ in range(idle_connections):
                idle.append(await asyncio.open_connection("127.0.0.1", server.port))
            await asyncio.sleep(0.05)  # the server has taken them
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(request)
            received = await asyncio.wait_for(reader.read(), 10)
            writer.close()
        finally:
            for _, idle_writer in idle:
                idle_writer.close()
            await server.stop()
        head, _, body = received.partition(b"\r\n\r\n")
        status_line, _, _ = head.partition(b"\r\n")
        _, code, reason = status_line.decode().split(" ", 2)
        assert reason == HTTPStatus(int(code)).phrase  # e.g. "431 Request Header Fields Too Large"
        return int(code), json.loads(body)

    return asyncio.run(exchange())


def request_with_headers_of(size: int) -> bytes:
    """A GET whose target plus headers count `size` bytes as the limit counts them (name + value + 4 per header)."""
    fixed = len("/v1/models/m") + len("host") + len("x") + 4 + len("connection") + len("close") + 4
    padding = size - fixed - len("x-pad") - 4
    return f"GET /v1/models/m HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: {'a' * padding}\r\n\r\n".encode()


def test_rest_headers_at_the_size_limit_are_read_and_one_byte_more_gets_431():
    limits = ServingLimits(max_header_bytes=200)
    assert raw_http(limits, request_with_headers_of(200)) == (
        200, {"method": "GET", "path": "/v1/models/m", "body": "", "in_flight": [0, 0]}
    )
    assert raw_http(limits, request_with_headers_of(201)) == (
        431, {"error": "The request line and headers are over 200 bytes."}
    )


def test_rest_connections_up_to_the_limit_are_served_and_one_more_gets_503():
    limits = ServingLimits(max_connections=3)
    request = b"GET /v1/models/m HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    assert raw_http(limits, request, idle_connections=2)[0] == 200  # the third connection
    assert raw_http(limits, request, idle_connections=3) == (
        503, {"error": "Server has too many open connections; retry with backoff."}
    )


# ------------------------------------------------------------------------------------- REST: number ranges
FLOAT32_MAX = float(np.finfo(np.float32).max)
JUST_OVER_FLOAT32 = float(np.nextafter(FLOAT32_MAX, np.inf, dtype=np.float64))


def convert_refused(dtype, value) -> str:
    with pytest.raises(ValueError) as error:
        leaf_type(dtype).convert(value)
    return str(error.value)


def test_json_numbers_at_the_float32_range_are_accepted_and_just_outside_refused():
    leaf = leaf_type(types_pb2.DT_FLOAT)
    for inside in (FLOAT32_MAX, -FLOAT32_MAX, float("inf"), float("-inf"), 3):
        assert leaf.convert(inside) == inside
    assert np.isnan(leaf.convert(float("nan")))
    assert convert_refused(types_pb2.DT_FLOAT, JUST_OVER_FLOAT32) == (
        f"JSON Value: {JUST_OVER_FLOAT32} is out of range for float"
    )
    assert convert_refused(types_pb2.DT_FLOAT, -JUST_OVER_FLOAT32).endswith("is out of range for float")
    assert convert_refused(types_pb2.DT_FLOAT, 10**39) == f"JSON Value: {10**39} is out of range for float"
    assert convert_refused(types_pb2.DT_DOUBLE, 10**400).endswith("is out of range for double")
    assert leaf_type(types_pb2.DT_DOUBLE).convert(JUST_OVER_FLOAT32) == JUST_OVER_FLOAT32  # a double holds it


def test_json_integers_at_the_int32_bounds_are_accepted_and_one_past_refused():
    leaf = leaf_type(types_pb2.DT_INT32)
    assert (leaf.convert(2**31 - 1), leaf.convert(-(2**31))) == (2**31 - 1, -(2**31))
    assert convert_refused(types_pb2.DT_INT32, 2**31) == "JSON Value: 2147483648 is out of range for int32"
    assert convert_refused(types_pb2.DT_INT32, -(2**31) - 1) == "JSON Value: -2147483649 is out of range for int32"
    assert convert_refused(types_pb2.DT_INT32, 1.5) == "JSON Value: 1.5 Type: Number is not of expected type: int32"
    assert convert_refused(types_pb2.DT_INT32, True) == "JSON Value: true Type: Bool is not of expected type: int32"
    assert convert_refused(types_pb2.DT_INT32, float("nan")) == (
        "JSON Value: NaN Type: Number is not of expected type: int32"
    )


def test_json_values_of_other_types_are_converted_or_refused_by_type():
    assert leaf_type(types_pb2.DT_STRING).convert("né") == "né".encode()
    assert leaf_type(types_pb2.DT_STRING).convert({"b64": "YQ=="}) == b"a"
    assert convert_refused(types_pb2.DT_STRING, {"b64": "YQ==!"}).startswith("Unable to base64 decode 'YQ==!': ")
    assert convert_refused(types_pb2.DT_STRING, {"b64": 1}) == (
        'JSON Value: {"b64": 1} Type: Object is not of expected type: string'
    )
    assert leaf_type(types_pb2.DT_BOOL).convert(False) is False
    assert convert_refused(types_pb2.DT_BOOL, 1) == "JSON Value: 1 Type: Number is not of expected type: bool"
    assert convert_refused(types_pb2.DT_FLOAT, True) == "JSON Value: true Type: Bool is not of expected type: float"
    assert convert_refused(types_pb2.DT_COMPLEX64, 1.0) == (
        "tensors of type complex64 are not supported in JSON requests"
    )


@pytest.mark.parametrize("count", [1, 64, 65, 200])  # up to 64 values are checked in Python, more with numpy
def test_float_columns_at_the_float32_range_are_accepted_and_just_outside_refused(count):
    leaf = leaf_type(types_pb2.DT_FLOAT)
    column = leaf.fast_column([1] * (count - 1) + [FLOAT32_MAX])
    assert column.dtype == np.float32 and column[-1] == np.float32(FLOAT32_MAX)
    assert leaf.fast_column([1.5] * (count - 1) + [float("-inf")])[-1] == -np.inf
    for outside in (JUST_OVER_FLOAT32, -JUST_OVER_FLOAT32, -(10**39)):
        with pytest.raises(ValueError, match="out of range for float"):
            leaf.fast_column([1.0] * (count - 1) + [outside])
    # An integer too large for any float: refused among a few values, left to the value-by-value path (which
    # says which value it is) among many.
    too_large = [1.0] * (count - 1) + [10**400]
    if count <= 64:
        with pytest.raises(ValueError, match="out of range for float"):
            leaf.fast_column(too_large)
    else:
        assert leaf.fast_column(too_large) is None


def test_int_columns_at_the_int32_bounds_are_converted_in_one_call_and_one_past_left_to_each_value():
    leaf = leaf_type(types_pb2.DT_INT32)
    column = leaf.fast_column([-(2**31), 0, 2**31 - 1])
    assert column.dtype == np.int32 and column.tolist() == [-(2**31), 0, 2**31 - 1]
    assert leaf.fast_column([0, 2**31]) is None
    assert leaf.fast_column([-(2**31) - 1, 0]) is None
    assert leaf.fast_column([1, 2.0]) is None


def test_columns_of_strings_and_bools_are_converted_in_one_call_and_mixed_ones_left_to_each_value():
    strings = leaf_type(types_pb2.DT_STRING).fast_column(["a", "né"])
    assert strings.dtype == object and strings.tolist() == [b"a", "né".encode()]
    assert leaf_type(types_pb2.DT_STRING).fast_column(["a", {"b64": "YQ=="}]) is None
    bools = leaf_type(types_pb2.DT_BOOL).fast_column([True, False])
    assert bools.dtype == np.bool_ and bools.tolist() == [True, False]
    assert leaf_type(types_pb2.DT_BOOL).fast_column([True, 1]) is None
    assert leaf_type(types_pb2.DT_FLOAT).fast_column([]) is None
    assert leaf_type(types_pb2.DT_FLOAT).fast_column([1.0, "a"]) is None
    assert leaf_type(types_pb2.DT_FLOAT).fast_column(["a"]) is None
    assert leaf_type(types_pb2.DT_STRING).fast_column([1]) is None
    assert leaf_type(types_pb2.DT_INT32).fast_column([True]) is None


def test_json_number_literals_up_to_the_double_range_parse_and_larger_ones_are_refused():
    assert parse_json_body(b'{"x": 1.7976931348623157e308, "y": -1e-400}') == {"x": 1.7976931348623157e308, "y": -0.0}
    with pytest.raises(ServingRequestError) as error:
        parse_json_body(b'{"x": 1.8e308}')
    assert error.value.message == "JSON Parse error: Number 1.8e308 is too big to be stored in a double"
    with pytest.raises(ServingRequestError) as error:
        parse_json_body(b'{"x": -1' + b"0" * 400 + b'.5}')
    assert error.value.message == f"JSON Parse error: Number -1{'0' * 38} is too big to be stored in a double"


def test_rest_json_limits_are_kept_for_at_most_65_loaded_versions():
    api = RestApi(Manager(), Predictor(), None, inline_bytes=1 << 20)
    versions = [servable(serving_default={"x": info([-1])}) for _ in range(66)]
    for version in versions[:65]:
        api._json_limits(version)
    assert len(api._json_limits_cache) == 65
    api._json_limits(versions[65])
    assert list(api._json_limits_cache) == [id(versions[65])]
