"""The gRPC API through the official tensorflow-serving-api stubs: PredictionService and ModelService."""
from __future__ import annotations

import threading

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from serving.repository.base import read_model_server_config
from serving.server.servable import Signature
from tests.serving.conftest import FEATURES, MODEL, ROW, expected_probability, http_json, wait_for


@pytest.fixture
def stubs(server):
    channel = grpc.insecure_channel(server.grpc_target)
    try:
        yield (
            prediction_service_pb2_grpc.PredictionServiceStub(channel),
            model_service_pb2_grpc.ModelServiceStub(channel),
        )
    finally:
        channel.close()


def predict_request(rows: list[dict], version: int | None = None, label: str | None = None, **spec):
    """A PredictRequest for the tiny model's serving_default, built the way any TF Serving client would."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = spec.pop("name", MODEL)
    if version is not None:
        request.model_spec.version.value = version
    if label is not None:
        request.model_spec.version_label = label
    request.model_spec.signature_name = spec.pop("signature_name", "serving_default")
    for name, dtype in FEATURES.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto([row[name] for row in rows], dtype=dtype))
    return request


@pytest.mark.parametrize("version,label,expected_version", [(None, None, 2), (1, None, 1), (None, "stable", 1),
                                                            (None, "canary", 2)])
def test_predict_by_name_version_and_label(stubs, version, label, expected_version):
    prediction, _ = stubs
    response = prediction.Predict(predict_request([ROW, ROW], version, label), timeout=10)
    assert response.model_spec.name == MODEL
    assert response.model_spec.version.value == expected_version
    assert response.model_spec.signature_name == "serving_default"
    probabilities = tf.make_ndarray(response.outputs["probabilities"])
    assert probabilities.dtype == np.float32
    assert probabilities.tolist() == pytest.approx([expected_probability(ROW, expected_version)] * 2)


def test_predict_output_filter(stubs):
    prediction, _ = stubs
    request = predict_request([ROW], signature_name="scores")
    request.output_filter.append("logits")
    response = prediction.Predict(request, timeout=10)
    assert list(response.outputs) == ["logits"]


def test_get_model_metadata(stubs):
    prediction, _ = stubs
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = MODEL
    request.model_spec.version_label = "stable"
    response = prediction.GetModelMetadata(request, timeout=10)
    assert response.model_spec.version.value == 1
    signature_defs = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(signature_defs)
    inputs = signature_defs.signature_def["serving_default"].inputs
    assert {name: tf.dtypes.as_dtype(info.dtype) for name, info in inputs.items()} == {
        "fare": tf.float32, "trip_start_hour": tf.int64, "payment_type": tf.string
    }


def test_get_model_status(stubs):
    _, models = stubs
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = MODEL
    response = models.GetModelStatus(request, timeout=10)
    assert [(s.version, s.state) for s in response.model_version_status] == [
        (2, get_model_status_pb2.ModelVersionStatus.AVAILABLE), (1, get_model_status_pb2.ModelVersionStatus.AVAILABLE)
    ]
    request.model_spec.version_label = "canary"
    response = models.GetModelStatus(request, timeout=10)
    assert [s.version for s in response.model_version_status] == [2]


def test_handle_reload_config_request_moves_labels(stubs, repository, server):
    prediction, models = stubs
    config = read_model_server_config(repository.config_path)
    config.model_config_list.config[0].version_labels["stable"] = 2
    response = models.HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(config=config), timeout=30)
    assert response.status.error_code == 0
    assert prediction.Predict(predict_request([ROW], label="stable"), timeout=10).model_spec.version.value == 2

    config.model_config_list.config[0].name = "../escape"
    with pytest.raises(grpc.RpcError) as error:
        models.HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(config=config), timeout=30)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert server.manager.labels(MODEL) == {"stable": 2, "canary": 2}


def _wrong_dtype():
    request = predict_request([ROW])
    request.inputs["fare"].CopyFrom(tf.make_tensor_proto([1.0], dtype=tf.float64))
    return request


def _extra_input():
    request = predict_request([ROW])
    request.inputs["tips"].CopyFrom(tf.make_tensor_proto([1.0], dtype=tf.float32))
    return request


def _missing_input():
    request = predict_request([ROW])
    del request.inputs["payment_type"]
    return request


def _wrong_rank():
    request = predict_request([ROW])
    request.inputs["fare"].CopyFrom(tf.make_tensor_proto([[1.0]], dtype=tf.float32))
    return request


def _unknown_output():
    request = predict_request([ROW])
    request.output_filter.append("nope")
    return request


BAD_CALLS = [
    ("unknown model", lambda: predict_request([ROW], name="nope"), grpc.StatusCode.NOT_FOUND, "Servable not found"),
    ("unknown version", lambda: predict_request([ROW], version=9), grpc.StatusCode.NOT_FOUND, "Specific(tiny, 9)"),
    ("unknown label", lambda: predict_request([ROW], label="beta"), grpc.StatusCode.INVALID_ARGUMENT,
     "Unrecognized servable version label: beta"),
    ("model name with ..", lambda: predict_request([ROW], name="../etc"), grpc.StatusCode.INVALID_ARGUMENT,
     "is invalid"),
    ("no model name", lambda: predict_request([ROW], name=""), grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec"),
    ("unknown signature", lambda: predict_request([ROW], signature_name="nope"), grpc.StatusCode.INVALID_ARGUMENT,
     "not found in signature def"),
    ("wrong dtype", _wrong_dtype, grpc.StatusCode.INVALID_ARGUMENT, "Expects arg[fare] to be float but double"),
    ("unknown input", _extra_input, grpc.StatusCode.INVALID_ARGUMENT, "alias not found in signature: tips"),
    ("missing input", _missing_input, grpc.StatusCode.INVALID_ARGUMENT, "Missing but required: {payment_type}"),
    ("wrong rank", _wrong_rank, grpc.StatusCode.INVALID_ARGUMENT, "shape"),
    ("unknown output", _unknown_output, grpc.StatusCode.INVALID_ARGUMENT, "output tensor alias not found"),
    ("batch over the limit", lambda: predict_request([ROW] * 9), grpc.StatusCode.INVALID_ARGUMENT,
     "larger than the maximum batch size 8"),
]


@pytest.mark.parametrize("what,make_request,code,message", BAD_CALLS, ids=[case[0] for case in BAD_CALLS])
def test_bad_call_gets_a_status_and_the_server_keeps_serving(stubs, what, make_request, code, message):
    prediction, _ = stubs
    with pytest.raises(grpc.RpcError) as error:
        prediction.Predict(make_request(), timeout=10)
    assert error.value.code() == code
    assert message in error.value.details()
    assert prediction.Predict(predict_request([ROW]), timeout=10).model_spec.version.value == 2


def test_metadata_and_status_errors(stubs):
    prediction, models = stubs
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = MODEL
    with pytest.raises(grpc.RpcError) as error:
        prediction.GetModelMetadata(request, timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    request.metadata_field.append("graph")
    with pytest.raises(grpc.RpcError) as error:
        prediction.GetModelMetadata(request, timeout=10)
    assert "graph is not supported" in error.value.details()

    status_request = get_model_status_pb2.GetModelStatusRequest()
    status_request.model_spec.name = "nope"
    with pytest.raises(grpc.RpcError) as error:
        models.GetModelStatus(status_request, timeout=10)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    assert "Could not find any versions of model nope" in error.value.details()


def _declared_shape_proto(dims: list[int], dtype=tf.string):
    """A tiny TensorProto that declares `dims` but carries one value: building it as an array would fill them all."""
    tensor = tf.make_tensor_proto(["Cash"] if dtype == tf.string else [1.0], dtype=dtype)
    del tensor.tensor_shape.dim[:]
    for size in dims:
        tensor.tensor_shape.dim.add().size = size
    return tensor


HUGE_SHAPES = [
    ("two billion strings", "payment_type", [2_000_000_000], "larger than the maximum batch size"),
    ("batch within the limit, huge inner dimension", "payment_type", [1, 100_000_000], "elements"),
    ("negative dimension", "fare", [-1], "negative dimension"),
    ("unknown input with a huge shape", "tips", [2_000_000_000], "alias not found in signature: tips"),
]


@pytest.mark.parametrize("what,name,dims,message", HUGE_SHAPES, ids=[case[0] for case in HUGE_SHAPES])
def test_tensor_shape_is_checked_before_any_array_is_built(stubs, monkeypatch, what, name, dims, message):
    built = []
    make_ndarray = tf.make_ndarray

    def guarded_make_ndarray(tensor, *args, **kwargs):
        declared = int(np.prod([d.size for d in tensor.tensor_shape.dim]))
        built.append(declared)
        if declared > 1000:
            raise AssertionError(f"an array of {declared} elements was built")
        return make_ndarray(tensor, *args, **kwargs)

    monkeypatch.setattr(tf, "make_ndarray", guarded_make_ndarray)
    prediction, _ = stubs
    request = predict_request([ROW])
    dtype = tf.float32 if name == "fare" else tf.string
    request.inputs[name].CopyFrom(_declared_shape_proto(dims, dtype))
    with pytest.raises(grpc.RpcError) as error:
        prediction.Predict(request, timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value.details()
    assert message in error.value.details()
    assert all(size <= 1000 for size in built)
    assert prediction.Predict(predict_request([ROW]), timeout=10).model_spec.version.value == 2


def test_an_empty_reload_config_request_changes_nothing(stubs, server):
    prediction, models = stubs
    response = models.HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(), timeout=30)
    assert response.status.error_code == 0
    assert server.manager.available_versions(MODEL) == [1, 2]
    assert server.manager.labels(MODEL) == {"stable": 1, "canary": 2}
    assert prediction.Predict(predict_request([ROW], label="stable"), timeout=10).model_spec.version.value == 1


def test_a_batch_at_the_limit_is_accepted_and_one_more_row_refused(stubs):
    prediction, _ = stubs
    response = prediction.Predict(predict_request([ROW] * 8), timeout=10)
    assert tf.make_ndarray(response.outputs["probabilities"]).shape == (8,)
    with pytest.raises(grpc.RpcError) as error:
        prediction.Predict(predict_request([ROW] * 9), timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Batch size 9 is larger than the maximum batch size 8" in error.value.details()


def test_stopping_the_server_ends_its_threads(repository):
    from tests.serving.conftest import start_server

    before = set(threading.enumerate())
    server = start_server(repository)
    with grpc.insecure_channel(server.grpc_target) as channel:
        prediction = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        assert prediction.Predict(predict_request([ROW]), timeout=10).model_spec.version.value == 2
    server.stop()
    wait_for(lambda: not [t for t in set(threading.enumerate()) - before
                          if t.name.startswith(("batch-thread", "serving-event-loop", "model-config-poller"))],
             what="the server's threads to end")


def test_a_call_whose_deadline_passes_while_queued_gets_deadline_exceeded_and_never_runs(server, stubs, monkeypatch):
    gate = threading.Event()
    started = []
    real_run = Signature.run

    def held_run(self, inputs):
        started.append(1)
        gate.wait(20)
        return real_run(self, inputs)

    monkeypatch.setattr(Signature, "run", held_run)
    threads = server.scheduler.parameters.num_batch_threads
    busy = [threading.Thread(target=http_json, args=("POST", f"{server.rest_url}/v1/models/{MODEL}:predict",
                                                      {"instances": [ROW]})) for _ in range(threads)]
    for thread in busy:  # every batch thread holds a model call: the gRPC call waits in the queue
        thread.start()
    try:
        wait_for(lambda: len(started) == threads, what="every batch thread busy")
        with pytest.raises(grpc.RpcError) as error:
            stubs[0].Predict(predict_request([ROW]), timeout=0.5)
        assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        wait_for(lambda: server.admission.requests == threads, what="the expired call to release its slot")
    finally:
        gate.set()
        for thread in busy:
            thread.join(20)
    assert stubs[0].Predict(predict_request([ROW]), timeout=10).model_spec.version.value == 2
    assert len(started) == threads + 1  # the held calls and the last one: the expired call never ran
