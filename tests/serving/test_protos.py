"""serving/clients/protos.py: TF Serving's messages built from the installed modules' descriptors give the official
bytes."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import json_format
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

import serving.clients.protos as protos_module
from serving.clients import TensorSpec, rows_to_columns
from serving.clients.errors import InvalidInputError
from serving.clients.protos import (
    ModelServiceStub,
    PredictionServiceStub,
    metadata_request,
    predict_request,
    serving_protos,
    status_request,
    tensor_proto,
    tensor_values,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY_INPUTS = {"fare": TensorSpec("DT_FLOAT", (-1,)), "trip_start_hour": TensorSpec("DT_INT64", (-1,)),
               "payment_type": TensorSpec("DT_STRING", (-1,))}
# One array per dtype the client encodes itself, in the numpy dtype rows_to_columns gives it.
ARRAYS = {
    "DT_FLOAT": np.array([2.5, math.nan, -0.1], np.float32),
    "DT_DOUBLE": np.array([1e300, math.nan, -0.1], np.float64),
    "DT_HALF": np.array([0.5, math.nan, 65504.0], np.float16),
    "DT_INT8": np.array([-128, -1, 127], np.int8),
    "DT_INT16": np.array([-32768, -1, 7], np.int16),
    "DT_INT32": np.array([-(2**31), -1, 7], np.int32),
    "DT_INT64": np.array([-(2**63), -1, 2**62], np.int64),
    "DT_UINT8": np.array([0, 1, 255], np.uint8),
    "DT_UINT16": np.array([0, 1, 65535], np.uint16),
    "DT_UINT32": np.array([0, 1, 2**32 - 1], np.uint32),
    "DT_UINT64": np.array([0, 1, 2**64 - 1], np.uint64),
    "DT_BOOL": np.array([True, False, True], np.bool_),
    "DT_STRING": np.array(["Cash", "", "Crédit carte ✓"], dtype=object),
}


def official_tensor(values: np.ndarray, dtype: str):
    """What the client sent before serving/clients/protos.py: TensorFlow's own make_tensor_proto."""
    return tf.make_tensor_proto(values, dtype=tf.dtypes.as_dtype(types_pb2.DataType.Value(dtype)))


def official_predict_request(model, columns, dtypes, version=None, label=None, signature_name="serving_default"):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    if version is not None:
        request.model_spec.version.value = version
    elif label:
        request.model_spec.version_label = label
    request.model_spec.signature_name = signature_name
    for name, values in columns.items():
        request.inputs[name].CopyFrom(official_tensor(values, dtypes[name]))
    return request


def shapes(values: np.ndarray) -> list[np.ndarray]:
    """A scalar, one value, all of them, and all of them as a [batch, 1] column."""
    return [values[:1].reshape(()), values[:1], values, values.reshape(-1, 1)]


def test_the_messages_come_from_the_descriptors_not_the_official_modules():
    assert serving_protos().official is False
    assert serving_protos().PredictRequest is not predict_pb2.PredictRequest
    assert serving_protos().PredictRequest.DESCRIPTOR.full_name == predict_pb2.PredictRequest.DESCRIPTOR.full_name


@pytest.mark.parametrize("dtype", sorted(ARRAYS))
def test_every_tensor_serializes_to_make_tensor_proto_s_bytes(dtype):
    protos = serving_protos()
    for values in shapes(ARRAYS[dtype]):
        ours = tensor_proto(values, dtype, protos)
        assert ours.SerializeToString() == official_tensor(values, dtype).SerializeToString(), values.shape


def test_a_dtype_it_does_not_encode_is_left_to_tensorflow():
    protos = serving_protos()
    values = np.array([0.5, 1.5], dtype=object)
    ours = tensor_proto(values, "DT_BFLOAT16", protos)
    assert ours.SerializeToString() == official_tensor(values, "DT_BFLOAT16").SerializeToString()
    assert tensor_values(ours, protos).astype(np.float32).tolist() == [0.5, 1.5]


@pytest.mark.parametrize("rows", [
    [{"fare": 2.5, "trip_start_hour": 7, "payment_type": "Cash"}],
    [{"fare": 2.5, "trip_start_hour": 7, "payment_type": "Cash"}, {"fare": None, "trip_start_hour": "",
                                                                   "payment_type": None},
     {"fare": "12", "trip_start_hour": 23.0, "payment_type": "Crédit"}],
], ids=["one row", "three rows with missing cells"])
@pytest.mark.parametrize("column_shape", [(-1,), (-1, 1)], ids=["[batch]", "[batch, 1]"])
def test_the_clients_predict_request_is_byte_identical_to_the_official_one(rows, column_shape):
    inputs = {name: TensorSpec(spec.dtype, column_shape) for name, spec in TINY_INPUTS.items()}
    columns = rows_to_columns(rows, inputs)
    dtypes = {name: spec.dtype for name, spec in inputs.items()}
    for version, label in ((None, None), (3, None), (None, "canary")):
        ours = predict_request(serving_protos(), "tiny", columns, dtypes, version, label)
        official = official_predict_request("tiny", columns, dtypes, version, label)
        assert ours.SerializeToString() == official.SerializeToString()
        assert ours.SerializeToString(deterministic=True) == official.SerializeToString(deterministic=True)


def test_metadata_and_status_requests_are_byte_identical_to_the_official_ones():
    official_metadata = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    official_metadata.model_spec.name = "tiny"
    official_metadata.model_spec.version_label = "stable"
    assert (metadata_request(serving_protos(), "tiny", label="stable").SerializeToString()
            == official_metadata.SerializeToString())
    official_status = get_model_status_pb2.GetModelStatusRequest()
    official_status.model_spec.name = "tiny"
    official_status.model_spec.version.value = 2
    ours = status_request(serving_protos(), "tiny", version=2)
    assert ours.SerializeToString() == official_status.SerializeToString()


@pytest.mark.parametrize("dtype", sorted(ARRAYS))
def test_tensor_values_reads_what_make_ndarray_reads(dtype):
    protos = serving_protos()
    for values in shapes(ARRAYS[dtype]):
        official = official_tensor(values, dtype)
        ours = tensor_values(protos.TensorProto.FromString(official.SerializeToString()), protos)
        expected = tf.make_ndarray(official)
        assert ours.dtype == expected.dtype and ours.shape == expected.shape
        np.testing.assert_array_equal(ours, expected)


def test_tensor_values_fills_a_short_value_list_as_make_ndarray_does():
    protos = serving_protos()
    short_floats = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[1.5, 2.5])
    short_floats.tensor_shape.dim.add(size=4)
    short_strings = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[b"a"])
    short_strings.tensor_shape.dim.add(size=3)
    no_values = tensor_pb2.TensorProto(dtype=types_pb2.DT_INT64)
    no_values.tensor_shape.dim.add(size=2)
    for official in (short_floats, short_strings, no_values):
        ours = tensor_values(protos.TensorProto.FromString(official.SerializeToString()), protos)
        expected = tf.make_ndarray(official)
        assert ours.dtype == expected.dtype
        assert ours.tolist() == expected.tolist()


def test_an_official_response_parses_to_the_same_outputs():
    protos = serving_protos()
    response = predict_pb2.PredictResponse()
    response.model_spec.name = "iris"
    response.outputs["probabilities"].CopyFrom(tf.make_tensor_proto(np.array([[0.9, 0.1]], np.float32)))
    response.outputs["classes"].CopyFrom(tf.make_tensor_proto(np.array([[b"setosa", b"versicolor"]], object)))
    ours = protos.PredictResponse.FromString(response.SerializeToString())
    assert ours.model_spec.name == "iris"
    for name, tensor in response.outputs.items():
        np.testing.assert_array_equal(tensor_values(ours.outputs[name], protos), tf.make_ndarray(tensor))


def test_metadata_s_any_unpacks_into_the_descriptor_built_signature_map():
    official = get_model_metadata_pb2.GetModelMetadataResponse()
    signature_defs = get_model_metadata_pb2.SignatureDefMap()
    signature_defs.signature_def["serving_default"].inputs["fare"].dtype = types_pb2.DT_FLOAT
    official.metadata["signature_def"].Pack(signature_defs)
    protos = serving_protos()
    ours = protos.GetModelMetadataResponse.FromString(official.SerializeToString())
    unpacked = protos.SignatureDefMap()
    assert ours.metadata["signature_def"].Unpack(unpacked)
    assert json_format.MessageToDict(unpacked) == json_format.MessageToDict(signature_defs)


class _RecordingChannel:
    """Stands for a grpc.Channel: records each method's path and (de)serializers."""

    def __init__(self) -> None:
        self.methods: dict[str, str] = {}

    def unary_unary(self, path, request_serializer=None, response_deserializer=None, **_):
        self.methods[path.rsplit("/", 1)[1]] = path
        return path


def test_the_stubs_call_the_official_stubs_paths():
    protos = serving_protos()
    for ours, official in ((PredictionServiceStub, prediction_service_pb2_grpc.PredictionServiceStub),
                           (ModelServiceStub, model_service_pb2_grpc.ModelServiceStub)):
        our_channel, official_channel = _RecordingChannel(), _RecordingChannel()
        stub = ours(our_channel, protos)
        official(official_channel)
        assert our_channel.methods
        for method, path in our_channel.methods.items():
            assert official_channel.methods[method] == path
            assert getattr(stub, method) == path


def test_without_readable_descriptors_the_official_modules_are_used(monkeypatch):
    def unreadable():
        raise OSError("no such file")

    monkeypatch.setattr(protos_module, "_protos", None)
    monkeypatch.setattr(protos_module, "_from_descriptors", unreadable)
    protos = serving_protos()
    assert protos.official is True and protos.PredictRequest is predict_pb2.PredictRequest
    columns = rows_to_columns([{"fare": 1.0, "trip_start_hour": 2, "payment_type": "Cash"}], TINY_INPUTS)
    dtypes = {name: spec.dtype for name, spec in TINY_INPUTS.items()}
    assert (predict_request(protos, "tiny", columns, dtypes).SerializeToString()
            == official_predict_request("tiny", columns, dtypes).SerializeToString())


def test_a_later_import_of_tensorflow_in_the_same_process_still_works():
    script = """
import sys
import numpy as np
from serving.clients.protos import serving_protos, tensor_proto
protos = serving_protos()
ours = tensor_proto(np.array([1.0, 2.0], np.float32), "DT_FLOAT", protos).SerializeToString()
before = "tensorflow" in sys.modules
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2
request = predict_pb2.PredictRequest()
request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([1.0, 2.0], np.float32)))
print(before, request.inputs["x"].SerializeToString() == ours, float(tf.reduce_sum(tf.constant([1.0, 2.0]))))
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False", "True", "3.0"]



def test_a_row_may_use_the_csv_columns_own_names():
    # "Trip Start Hour" became the input trip_start_hour (settings/csv_header.py): a row from the user's CSV works.
    rows = [{"FARE": 1.0, "Trip Start Hour": 2, "payment_type": "Cash"}]
    assert {name: column.tolist() for name, column in rows_to_columns(rows, TINY_INPUTS).items()} == {
        "fare": [1.0], "trip_start_hour": [2], "payment_type": ["Cash"]}
    with pytest.raises(InvalidInputError, match=r"The keys \['Fare'\] name the same input twice"):
        rows_to_columns([{"fare": 1.0, "Fare": 2.0}], TINY_INPUTS)
    with pytest.raises(InvalidInputError, match=r"features the model does not take: \['Tip'\]"):
        rows_to_columns([{"fare": 1.0, "Tip": 2.0}], TINY_INPUTS)
