"""TF Serving's gRPC services (PredictionService, ModelService) from tensorflow-serving-api's own stubs."""
from __future__ import annotations

import logging
from concurrent import futures

import grpc
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_management_pb2,
    model_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from serving.api_messages import SIGNATURE_DEF_FIELD, model_metadata_response, model_status_response
from serving.errors import ServingRequestError, invalid_argument
from serving.model_manager import ConfigError, ModelManager
from serving.predictor import run_prediction
from serving.servable import ServableVersion, dtype_label

logger = logging.getLogger(__name__)

# TF Serving accepts requests up to 2 GiB; a bounded size keeps one client from exhausting memory here.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
# A TensorProto's shape is checked before any array is built: one string_val can declare billions of elements.
# Elements per example when the signature leaves a non-batch dimension (or the rank) open.
MAX_ELEMENTS_PER_EXAMPLE = 1 << 20
# Never more elements in one input tensor than this, whatever the batch size and signature allow.
MAX_TENSOR_ELEMENTS = MAX_MESSAGE_BYTES // 4


def _spec_choice(spec: model_pb2.ModelSpec) -> tuple[int | None, str | None]:
    choice = spec.WhichOneof("version_choice")
    if choice == "version":
        return spec.version.value, None
    if choice == "version_label":
        return None, spec.version_label
    return None, None


def max_input_elements(info, max_batch_size: int) -> int:
    """The most elements a valid input for `info` can hold: a full batch of examples of the signature's shape."""
    dims = None if info.tensor_shape.unknown_rank else [d.size for d in info.tensor_shape.dim]
    if not dims:
        per_example = 1 if dims == [] else MAX_ELEMENTS_PER_EXAMPLE
    elif any(d < 0 for d in dims[1:]):
        per_example = MAX_ELEMENTS_PER_EXAMPLE
    else:
        per_example = 1
        for d in dims[1:]:
            per_example *= d
    return min(max(max_batch_size, 1) * max(per_example, 1), MAX_TENSOR_ELEMENTS)


def check_tensor_proto_shape(name: str, tensor, info, max_batch_size: int) -> None:
    """Refuses a TensorProto whose declared shape is negative or too large, before any memory is allocated."""
    dims = [d.size for d in tensor.tensor_shape.dim]
    if any(d < 0 for d in dims):
        raise invalid_argument(f"Input {name} has shape {dims} with a negative dimension; give every size.")
    if dims and dims[0] > max_batch_size:
        raise invalid_argument(
            f"Batch size {dims[0]} of input {name} is larger than the maximum batch size {max_batch_size}; "
            "split the request into smaller ones."
        )
    elements = 1
    for d in dims:
        elements *= d
    limit = max_input_elements(info, max_batch_size)
    if elements > limit:
        raise invalid_argument(
            f"Input {name} has shape {dims} ({elements} elements), more than the {limit} the signature allows "
            f"for a batch of {max_batch_size}; send fewer or smaller examples."
        )


def _abort_on_error(method):
    """Turns ServingRequestError into the matching gRPC status; anything else is INTERNAL and logged."""

    def wrapper(self, request, context):
        try:
            return method(self, request, context)
        except ServingRequestError as e:
            context.abort(e.code, e.message)
        except Exception as e:  # noqa: BLE001 - one broken request must not take the server down
            logger.exception("internal error in %s", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"Internal error: {e}")

    wrapper.__name__ = method.__name__
    return wrapper


class PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, manager: ModelManager, max_batch_size: int) -> None:
        self.manager = manager
        self.max_batch_size = max_batch_size

    def _resolve(self, spec: model_pb2.ModelSpec) -> ServableVersion:
        if not spec.name:
            raise invalid_argument("Missing ModelSpec name; set model_spec.name.")
        version, label = _spec_choice(spec)
        return self.manager.resolve(spec.name, version, label)

    @_abort_on_error
    def Predict(self, request: predict_pb2.PredictRequest, context) -> predict_pb2.PredictResponse:  # noqa: N802
        servable = self._resolve(request.model_spec)
        signature = servable.signature(request.model_spec.signature_name)
        arrays = {}
        for name, tensor in request.inputs.items():
            info = signature.inputs.get(name)
            if info is None:
                raise invalid_argument(
                    f"input tensor alias not found in signature: {name}. "
                    f"Inputs expected to be in the set {{{','.join(sorted(signature.inputs))}}}."
                )
            if tensor.dtype != info.dtype:
                expected = dtype_label(info.dtype)
                given = dtype_label(tensor.dtype) if tensor.dtype else "an unset dtype"
                raise invalid_argument(f"Expects arg[{name}] to be {expected} but {given} is provided")
            check_tensor_proto_shape(name, tensor, info, self.max_batch_size)
            try:
                arrays[name] = tf.make_ndarray(tensor)
            except (ValueError, TypeError) as e:
                raise invalid_argument(f"Input {name} is not a valid TensorProto: {e}") from e
        used, outputs = run_prediction(
            servable, signature.name, arrays, self.max_batch_size, list(request.output_filter)
        )
        response = predict_pb2.PredictResponse()
        response.model_spec.name = servable.model_name
        response.model_spec.version.value = servable.version
        response.model_spec.signature_name = used.name
        for name, value in outputs.items():
            response.outputs[name].CopyFrom(tf.make_tensor_proto(np.asarray(value)))
        return response

    @_abort_on_error
    def GetModelMetadata(  # noqa: N802
        self, request: get_model_metadata_pb2.GetModelMetadataRequest, context
    ) -> get_model_metadata_pb2.GetModelMetadataResponse:
        if not request.metadata_field:
            raise invalid_argument("GetModelMetadataRequest must specify at least one metadata_field")
        for field in request.metadata_field:
            if field != SIGNATURE_DEF_FIELD:
                raise invalid_argument(f"Metadata field {field} is not supported")
        return model_metadata_response(self._resolve(request.model_spec))

    def _unimplemented(self, context, name: str):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{name} is not implemented by this server; use Predict.")

    def Classify(self, request, context):  # noqa: N802
        self._unimplemented(context, "Classify")

    def Regress(self, request, context):  # noqa: N802
        self._unimplemented(context, "Regress")

    def MultiInference(self, request, context):  # noqa: N802
        self._unimplemented(context, "MultiInference")


class ModelServicer(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager

    @_abort_on_error
    def GetModelStatus(  # noqa: N802
        self, request: get_model_status_pb2.GetModelStatusRequest, context
    ) -> get_model_status_pb2.GetModelStatusResponse:
        if not request.HasField("model_spec") or not request.model_spec.name:
            raise invalid_argument("Missing ModelSpec")
        version, label = _spec_choice(request.model_spec)
        return model_status_response(self.manager.model_status(request.model_spec.name, version, label))

    @_abort_on_error
    def HandleReloadConfigRequest(  # noqa: N802
        self, request: model_management_pb2.ReloadConfigRequest, context
    ) -> model_management_pb2.ReloadConfigResponse:
        response = model_management_pb2.ReloadConfigResponse()
        try:
            problems = self.manager.apply_config(request.config)
        except ConfigError as e:
            raise invalid_argument(str(e)) from e
        if problems:
            # The config is in force; what could not be loaded is in model status. Report it like a failed reload.
            raise ServingRequestError(grpc.StatusCode.FAILED_PRECONDITION, " ".join(problems))
        return response


class GrpcServer:
    """PredictionService and ModelService on host:port (port 0 picks a free one), served by a thread pool."""

    def __init__(self, manager: ModelManager, host: str, port: int, max_batch_size: int, workers: int) -> None:
        # grpc.server's stop() leaves the executor it was given running: stop() shuts it down.
        self._executor = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grpc-server")
        self._server = grpc.server(
            self._executor,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
            ],
        )
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
            PredictionServicer(manager, max_batch_size), self._server
        )
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelServicer(manager), self._server)
        try:
            self.port = self._server.add_insecure_port(f"{host}:{port}")
        except RuntimeError as e:
            self._executor.shutdown(wait=False)
            raise OSError(f"Could not bind gRPC to {host}:{port}; is the port in use? ({e})") from e
        if self.port == 0:
            self._executor.shutdown(wait=False)
            raise OSError(f"Could not bind gRPC to {host}:{port}; is the port in use?")

    def start(self) -> None:
        self._server.start()

    def stop(self, grace_s: float = 1.0) -> None:
        self._server.stop(grace_s).wait()
        self._executor.shutdown(wait=False)
