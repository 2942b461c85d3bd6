"""TF Serving's gRPC services (PredictionService, ModelService) from tensorflow-serving-api's own stubs.

The server is grpc.aio on the event loop that serves REST: Predict is a coroutine there, as REST's handler is, and
its model call goes to the scheduler REST uses too. (grpcio's synchronous server answered each call on a pool
thread that woke three to four times per call and contended for the GIL with the batch threads: a gRPC request
cost about three times the CPU of a REST one, model calls included.) The other methods (metadata, status,
reloads that load models) may block, so they run on a small thread pool. Predict takes the request's bytes rather
than a parsed message: the message is admitted by size, and a large one has its value counts read from the wire
(`serving.server.limits.check_wire_value_counts`) before the protobuf is parsed, off the event loop.
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent import futures

import grpc
import numpy as np
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_management_pb2,
    model_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from serving import is_verifier, request_id
from serving.server.api_messages import SIGNATURE_DEF_FIELD, model_metadata_response, model_status_response
from serving.server.errors import ServingRequestError, invalid_argument
from serving.server.failures import rows_from_predict_request
from serving.server.grpc.codec import _filled_vector, array_to_tensor_proto, tensor_proto_to_array
from serving.server.limits import (
    AdmissionControl,
    ServingLimits,
    check_tensor_proto,
    check_wire_value_counts,
    wire_fields,
)
from serving.server.model_manager import ModelConfigError, ModelManager
from serving.server.monitoring import RequestMetrics
from serving.server.predictor import Predictor
from serving.server.request_log import LoggedPrediction, RequestLogger
from serving.server.servable import ServableVersion, dtype_label

logger = logging.getLogger(__name__)

SERVICE = "tensorflow.serving.PredictionService"
# Messages below this size are parsed without reading their value counts first: even the worst (empty strings,
# ~20x in memory) cost little.
WIRE_CHECK_BYTES = 1024 * 1024
# Responses are not what a client controls; this only bounds a runaway model output.
MAX_RESPONSE_BYTES = 256 * 1024 * 1024


def _spec_choice(spec: model_pb2.ModelSpec) -> tuple[int | None, str | None]:
    choice = spec.WhichOneof("version_choice")
    if choice == "version":
        return spec.version.value, None
    if choice == "version_label":
        return None, spec.version_label
    return None, None


def _status_of(error: Exception, method: str) -> tuple[grpc.StatusCode, str]:
    if isinstance(error, ServingRequestError):
        return error.code, error.message
    logger.error("internal error in %s", method, exc_info=error)
    return grpc.StatusCode.INTERNAL, f"Internal error: {error}"


def _abort(context, error: Exception, method: str):
    """Ends a call on the thread pool (the methods other than Predict) with the error's status."""
    context.abort(*_status_of(error, method))


class PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
    """Predict (a coroutine on raw bytes, see `predict_handler`), GetModelMetadata; the others are UNIMPLEMENTED."""

    def __init__(self, manager: ModelManager, predictor: Predictor, admission: AdmissionControl,
                 parser: futures.Executor, inline_bytes: int, metrics: RequestMetrics | None = None,
                 request_logger: RequestLogger | None = None) -> None:
        self.manager = manager
        self.predictor = predictor
        self.admission = admission
        self.parser = parser
        self.inline_bytes = inline_bytes
        self.metrics = metrics or RequestMetrics()
        self.request_logger = request_logger

    def _resolve(self, spec: model_pb2.ModelSpec) -> ServableVersion:
        if not spec.name:
            raise invalid_argument("Missing ModelSpec name; set model_spec.name.")
        version, label = _spec_choice(spec)
        return self.manager.resolve(spec.name, version, label)

    async def predict_bytes(self, data: bytes, context) -> bytes:
        """Predict on the event loop. A call whose deadline passes or whose client goes away is cancelled here by
        grpc.aio, and its task leaves the scheduler's queue with it."""
        started = time.perf_counter()
        try:  # gRPC itself refuses messages over max_request_bytes (RESOURCE_EXHAUSTED)
            self.admission.admit(len(data))
        except ServingRequestError as e:
            self._record(data, e.code.name, started, e.message, context, with_inputs=False)
            await context.abort(e.code, e.message)
        try:
            if len(data) > self.inline_bytes:  # a large message is sized up and parsed off the event loop
                prepared = await asyncio.get_running_loop().run_in_executor(self.parser, self._prepare, data)
            else:
                prepared = self._prepare(data)
            request, servable, arrays = prepared
            signature, outputs = await self.predictor.predict(
                servable, request.model_spec.signature_name, arrays, "grpc", list(request.output_filter)
            )
            response = predict_pb2.PredictResponse()
            response.model_spec.name = servable.model_name
            response.model_spec.version.value = servable.version
            response.model_spec.signature_name = signature.name
            for name, value in outputs.items():
                array_to_tensor_proto(np.asarray(value), response.outputs[name])
            answer = response.SerializeToString()
            metadata = context.invocation_metadata() or ()
            verifier = is_verifier(metadata)
            self.metrics.record(request.model_spec.name, "OK", "Predict", "GRPC", time.perf_counter() - started,
                                verifier)
            if not verifier:
                self.metrics.answers.add(request_id(metadata), servable.model_name, servable.version, "grpc",
                                         time.perf_counter() - started, arrays, outputs)
            if self.request_logger is not None and verifier:
                self.request_logger.leave_out_verifier(servable.model_name)
            elif self.request_logger is not None and self.request_logger.sample():
                # The messages as they crossed the wire: nothing to build but the record around them.
                prediction = LoggedPrediction(servable.version, signature.name, data, answer)
                self.request_logger.submit(servable.model_name, lambda: prediction)
            return answer
        except Exception as e:  # noqa: BLE001 - every error becomes a status; none takes the server down
            status = _status_of(e, "Predict")
        finally:
            self.admission.release(len(data))
        self._record(data, status[0].name, started, status[1], context)
        await context.abort(*status)

    def _record(self, data: bytes, status: str, started: float, message: str, context,
                with_inputs: bool = True) -> None:
        """Counts a failed Predict under the model its message names, as prediction_service_impl.cc does, and keeps
        it, with its inputs unless it was refused unread (overload), for the rollout to name the cause
        (serving/server/failures.py)."""
        try:
            spec = _wire_model_spec(data)
        except ServingRequestError:
            return
        verifier = is_verifier(context.invocation_metadata() or ())
        self.metrics.record(spec.name, status, "Predict", "GRPC", time.perf_counter() - started, verifier)
        try:
            version = self._resolve(spec).version
        except Exception:  # noqa: BLE001 - the model or version is what failed: no version answered
            version = None
        self.metrics.failures.add(spec.name, version, "grpc", status, message, verifier,
                                  rows_from_predict_request(data) if with_inputs else ([], 0))

    def _prepare(self, data: bytes) -> tuple[predict_pb2.PredictRequest, ServableVersion, dict[str, np.ndarray]]:
        """Checks the message's cost, parses it and builds the input arrays."""
        max_batch_size = self.predictor.max_batch_size
        if len(data) > WIRE_CHECK_BYTES:
            spec = _wire_model_spec(data)
            servable = self._resolve(spec)
            limits: dict[str, int] = {}
            for signature in servable.signatures.values():
                for name, limit in signature.max_input_elements(max_batch_size).items():
                    limits[name] = max(limits.get(name, 0), limit)
            check_wire_value_counts(data, limits)
        request = predict_pb2.PredictRequest()
        try:
            request.ParseFromString(data)
        except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends
            raise invalid_argument(f"The PredictRequest is not a valid protobuf message ({e}).") from e
        servable = self._resolve(request.model_spec)
        signature = servable.signature(request.model_spec.signature_name)
        arrays = {}
        max_elements = signature.max_input_elements(max_batch_size)
        dtypes = signature.input_dtype_enums
        for name, tensor in request.inputs.items():
            expected = dtypes.get(name)
            if expected is None:
                raise invalid_argument(
                    f"input tensor alias not found in signature: {name}. "
                    f"Inputs expected to be in the set {{{','.join(sorted(signature.inputs))}}}."
                )
            given = tensor.dtype
            if given != expected:
                label = dtype_label(given) if given else "an unset dtype"
                raise invalid_argument(f"Expects arg[{name}] to be {dtype_label(expected)} but {label} is provided")
            array = _filled_vector(tensor, given, min(max_batch_size, max_elements[name]))
            if array is None:
                declared = [d.size for d in tensor.tensor_shape.dim]
                check_tensor_proto(name, tensor, declared, max_elements[name], max_batch_size)
                try:
                    array = tensor_proto_to_array(tensor, declared)
                except (ValueError, TypeError) as e:
                    raise invalid_argument(f"Input {name} is not a valid TensorProto: {e}") from e
            arrays[name] = array
        return request, servable, arrays

    def GetModelMetadata(  # noqa: N802
        self, request: get_model_metadata_pb2.GetModelMetadataRequest, context
    ) -> get_model_metadata_pb2.GetModelMetadataResponse:
        try:
            if not request.metadata_field:
                raise invalid_argument("GetModelMetadataRequest must specify at least one metadata_field")
            for field in request.metadata_field:
                if field != SIGNATURE_DEF_FIELD:
                    raise invalid_argument(f"Metadata field {field} is not supported")
            return model_metadata_response(self._resolve(request.model_spec))
        except Exception as e:  # noqa: BLE001
            _abort(context, e, "GetModelMetadata")

    def _unimplemented(self, context, name: str):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{name} is not implemented by this server; use Predict.")

    def Classify(self, request, context):  # noqa: N802
        self._unimplemented(context, "Classify")

    def Regress(self, request, context):  # noqa: N802
        self._unimplemented(context, "Regress")

    def MultiInference(self, request, context):  # noqa: N802
        self._unimplemented(context, "MultiInference")

    def predict_handler(self) -> grpc.GenericRpcHandler:
        """Predict with the request's bytes in and the response's bytes out (registered before the stub's)."""
        return grpc.method_handlers_generic_handler(
            SERVICE, {"Predict": grpc.unary_unary_rpc_method_handler(self.predict_bytes)}
        )


def _wire_model_spec(data: bytes) -> model_pb2.ModelSpec:
    """The model_spec of a serialized PredictRequest, read without parsing the rest."""
    spec = model_pb2.ModelSpec()
    try:
        for number, wire_type, start, end in wire_fields(data, 0, len(data)):
            if number == 1 and wire_type == 2:
                spec.MergeFromString(data[start:end])
    except Exception as e:  # noqa: BLE001 - WireFormatError, protobuf's DecodeError
        raise invalid_argument(f"The PredictRequest is not a valid protobuf message ({e}).") from e
    return spec


class ModelServicer(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager

    def GetModelStatus(  # noqa: N802
        self, request: get_model_status_pb2.GetModelStatusRequest, context
    ) -> get_model_status_pb2.GetModelStatusResponse:
        try:
            if not request.HasField("model_spec") or not request.model_spec.name:
                raise invalid_argument("Missing ModelSpec")
            version, label = _spec_choice(request.model_spec)
            return model_status_response(self.manager.model_status(request.model_spec.name, version, label))
        except Exception as e:  # noqa: BLE001
            _abort(context, e, "GetModelStatus")

    def HandleReloadConfigRequest(  # noqa: N802
        self, request: model_management_pb2.ReloadConfigRequest, context
    ) -> model_management_pb2.ReloadConfigResponse:
        try:
            try:
                problems = self.manager.apply_config(request.config)
            except ModelConfigError as e:
                raise invalid_argument(str(e)) from e
            if problems:
                # The config is in force; what could not be loaded is in model status. Report it like a failed reload.
                raise ServingRequestError(grpc.StatusCode.FAILED_PRECONDITION, " ".join(problems))
            return model_management_pb2.ReloadConfigResponse()
        except Exception as e:  # noqa: BLE001
            _abort(context, e, "HandleReloadConfigRequest")


class GrpcServer:
    """PredictionService and ModelService on host:port (port 0 picks a free one), on grpc.aio.

    Construct and start it on the event loop that is to run Predict; `workers` threads run the other methods.
    """

    def __init__(self, manager: ModelManager, predictor: Predictor, admission: AdmissionControl,
                 limits: ServingLimits, host: str, port: int, workers: int, parser: futures.Executor,
                 metrics: RequestMetrics | None = None, request_logger: RequestLogger | None = None) -> None:
        # The server's stop() leaves the executor it was given running: stop() shuts it down.
        self._executor = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grpc-server")
        self._server = grpc.aio.server(
            migration_thread_pool=self._executor,
            options=[
                ("grpc.max_receive_message_length", limits.max_request_bytes),
                ("grpc.max_send_message_length", MAX_RESPONSE_BYTES),
                ("grpc.so_reuseport", 0),
            ],
            # Calls in progress are bounded too: past this, RESOURCE_EXHAUSTED at once (as TF Serving's own
            # exhausted thread pool answers), before their messages are read.
            maximum_concurrent_rpcs=limits.max_in_flight_requests,
        )
        servicer = PredictionServicer(manager, predictor, admission, parser, limits.inline_bytes, metrics,
                                      request_logger)
        self._server.add_generic_rpc_handlers((servicer.predict_handler(),))
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(servicer, self._server)
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelServicer(manager), self._server)
        try:
            self.port = self._server.add_insecure_port(f"{host}:{port}")
        except RuntimeError as e:
            self._executor.shutdown(wait=False)
            raise OSError(f"Could not bind gRPC to {host}:{port}; is the port in use? ({e})") from e
        if self.port == 0:
            self._executor.shutdown(wait=False)
            raise OSError(f"Could not bind gRPC to {host}:{port}; is the port in use?")

    async def start(self) -> None:
        await self._server.start()

    async def stop(self, grace_s: float = 1.0) -> None:
        await self._server.stop(grace_s)
        self._executor.shutdown(wait=False)
