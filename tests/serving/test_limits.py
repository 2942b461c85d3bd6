"""Each limit on a request's cost, as a plain function, just inside and just outside its threshold."""
from __future__ import annotations

import json

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow_serving.apis import predict_pb2

from serving.server.errors import ServingRequestError
from serving.server.limits import (
    MAX_ELEMENTS_PER_EXAMPLE,
    MAX_UNKNOWN_RANK,
    AdmissionControl,
    check_batch_size,
    check_float_range,
    check_json_cost,
    check_request_bytes,
    check_tensor_proto,
    check_tensor_value_count,
    check_wire_value_counts,
    count_json_items,
    json_nesting_depth,
    json_skeleton,
    max_input_elements,
    max_json_depth,
    max_json_items,
    predict_request_input_counts,
)


def info(dims: list[int] | None, dtype=types_pb2.DT_FLOAT) -> meta_graph_pb2.TensorInfo:
    shape = tensor_shape_pb2.TensorShapeProto(unknown_rank=dims is None)
    for size in dims or []:
        shape.dim.add().size = size
    return meta_graph_pb2.TensorInfo(dtype=dtype, tensor_shape=shape)


def refused(call, code=grpc.StatusCode.INVALID_ARGUMENT) -> str:
    with pytest.raises(ServingRequestError) as error:
        call()
    assert error.value.code == code
    return error.value.message


def test_request_bytes_at_the_limit_pass_and_one_more_is_refused():
    check_request_bytes(100, 100)
    assert refused(lambda: check_request_bytes(101, 100)) == (
        "Request of 101 bytes is over the limit of 100 bytes; send fewer examples per request."
    )


def test_batch_size_at_the_limit_passes_and_one_more_is_refused():
    check_batch_size(8, 8)
    assert refused(lambda: check_batch_size(9, 8)) == (
        "Batch size 9 is larger than the maximum batch size 8; split the request into smaller ones."
    )


@pytest.mark.parametrize("dims,batch,expected", [
    ([-1], 8, 8), ([-1, 3], 8, 24), ([-1, 2, 5], 8, 80), ([], 8, 1), ([-1, -1], 8, 8 * MAX_ELEMENTS_PER_EXAMPLE),
    (None, 8, 8 * MAX_ELEMENTS_PER_EXAMPLE),
    ([-1, 3], 1, 3),  # one example per request
    ([-1, 0], 8, 8),  # 0 is a fixed size, not an open one: an example holds no values (counted as one)
])
def test_max_input_elements_is_a_full_batch_of_the_signature_shape(dims, batch, expected):
    assert max_input_elements(info(dims), batch) == expected


def test_json_skeleton_empties_strings_however_they_are_escaped():
    body = json.dumps({"s": ['a,b[c]{d}', 'quote " and \\ backslash, [', "\\\\"], "n": [1, 2]}).encode()
    skeleton = json_skeleton(body)
    assert skeleton == b'{"": ["", "", ""], "": [1, 2]}'
    assert count_json_items(skeleton) == 4 + 3 + 1  # commas + containers + 1
    assert json_nesting_depth(skeleton) == 2


@pytest.mark.parametrize("depth", [1, 5, 300])
def test_json_nesting_depth_small_and_large(depth):
    body = b"[" * depth + b"1" + b"]" * depth
    assert json_nesting_depth(json_skeleton(body)) == depth
    assert json_nesting_depth(json_skeleton(b'{"a": ' + body + b', "b": []}')) == depth + 1


def reference_depth(skeleton: bytes) -> int:
    depth = deepest = 0
    for byte in skeleton:
        depth += {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}.get(byte, 0)
        deepest = max(deepest, depth)
    return deepest


@pytest.mark.parametrize("body", [
    b"[" * 300 + b"1" + b"]" * 300,
    b"[" + b"[], " * 200 + b'{"a": [[[[1]]]]}, [[]]]',  # the deepest point after many closings
    b'{"a": [' + b"[1], " * 150 + b'[[{"b": [2]}]]], "c": {}}',
])
def test_nesting_of_many_brackets_is_measured_in_chunks_as_in_one_pass(monkeypatch, body):
    from serving.server import limits

    skeleton = json_skeleton(body)
    assert len(skeleton.translate(None, limits._NOT_BRACKETS)) >= 256  # the chunked path
    expected = reference_depth(skeleton)
    assert json_nesting_depth(skeleton) == expected
    monkeypatch.setattr(limits, "_DEPTH_CHUNK", 7)  # nesting crosses chunk borders, the last chunk is partial
    assert json_nesting_depth(skeleton) == expected


def test_json_items_at_the_limit_pass_and_one_more_is_refused():
    body = json.dumps({"inputs": {"x": list(range(9))}}).encode()  # 8 commas + 3 containers + 1 = 12
    check_json_cost(body, max_items=12, max_depth=10)
    message = refused(lambda: check_json_cost(json.dumps({"inputs": {"x": list(range(10))}}).encode(), 12, 10))
    assert message == (
        "Request holds about 13 JSON values, more than the 12 that a full batch of this signature's inputs can need; "
        "send fewer examples or fewer values per example."
    )


def test_json_item_limit_of_a_signature_is_three_per_value_and_two_per_example():
    inputs = {"a": info([-1]), "b": info([-1, 2])}  # a full batch of 4: 4 + 8 values
    assert max_json_items(inputs, max_batch_size=4) == 3 * 12 + 2 * 4 + 64 == 108

    def columnar(count: int) -> bytes:  # count values, 3 containers: count - 1 commas + 3 + 1 = count + 3 items
        return json.dumps({"inputs": {"a": [0] * count}}).encode()

    check_json_cost(columnar(105), max_json_items(inputs, 4), max_json_depth(inputs))
    assert "about 109 JSON values, more than the 108" in refused(
        lambda: check_json_cost(columnar(106), max_json_items(inputs, 4), max_json_depth(inputs))
    )


def test_json_depth_at_the_limit_passes_and_one_more_is_refused():
    at_limit = b'{"inputs": {"x": [[1]]}}'  # depth 4
    check_json_cost(at_limit, max_items=100, max_depth=4)
    message = refused(lambda: check_json_cost(b'{"inputs": {"x": [[[1]]]}}', max_items=100, max_depth=4))
    assert message == (
        "Request nests JSON 5 levels deep, more than the 4 this signature's inputs can use; "
        "send each value at its input's rank."
    )


def test_json_depth_limit_follows_the_signature_rank():
    matrix = {"x": info([-1, 2], types_pb2.DT_STRING), "y": info([-1])}  # the deepest input, of rank 2, counts
    assert max_json_depth(matrix) == 2 + 3
    at_limit = b'{"instances": [{"x": [{"b64": "YQ=="}, {"b64": "Yg=="}], "y": 1}]}'
    check_json_cost(at_limit, 100, max_json_depth(matrix))
    one_deeper = b'{"instances": [{"x": [[{"b64": "YQ=="}, {"b64": "Yg=="}]], "y": 1}]}'
    assert "nests JSON 6 levels deep, more than the 5" in refused(
        lambda: check_json_cost(one_deeper, 100, max_json_depth(matrix))
    )
    no_inputs: dict = {}  # a signature that takes nothing: each instance is an empty object
    assert max_json_depth(no_inputs) == 3
    check_json_cost(b'{"instances": [{}]}', 100, max_json_depth(no_inputs))
    assert "nests JSON 4 levels deep, more than the 3" in refused(
        lambda: check_json_cost(b'{"instances": [{"x": []}]}', 100, max_json_depth(no_inputs))
    )


def test_json_limits_admit_every_valid_format_of_a_full_batch():
    inputs = {"a": info([-1]), "b": info([-1, 2]), "s": info([-1], types_pb2.DT_STRING)}
    batch = 4
    rows = [{"a": 1.0, "b": [1.0, 2.0], "s": {"b64": "YQ=="}} for _ in range(batch)]
    columns = {"a": [1.0] * batch, "b": [[1.0, 2.0]] * batch, "s": [{"b64": "YQ=="}] * batch}
    for document in ({"signature_name": "x", "instances": rows}, {"signature_name": "x", "inputs": columns}):
        check_json_cost(json.dumps(document).encode(), max_json_items(inputs, batch), max_json_depth(inputs))
    assert max_json_depth({"u": info(None)}) == MAX_UNKNOWN_RANK + 3


def test_float_range_of_float32():
    largest = float(np.finfo(np.float32).max)
    check_float_range(np.array([largest, -largest, np.inf, -np.inf, np.nan]), np.float32, "float")
    with pytest.raises(ValueError, match="out of range for float"):
        check_float_range(np.array([1.0, np.nextafter(largest, np.inf)]), np.float32, "float")
    with pytest.raises(ValueError, match="out of range for float"):
        check_float_range(np.array([-1e39]), np.float32, "float")
    check_float_range(np.array([1e300]), np.float64, "double")  # a double holds it


def string_tensor(values: list[bytes], dims: list[int]):
    tensor = tf.make_tensor_proto(values, dtype=tf.string)
    del tensor.tensor_shape.dim[:]
    for size in dims:
        tensor.tensor_shape.dim.add().size = size
    return tensor


def test_tensor_values_at_the_declared_count_pass_and_one_more_is_refused():
    check_tensor_value_count("s", string_tensor([b"a"] * 3, [3]), 3)
    check_tensor_value_count("s", string_tensor([b"a"], [3]), 3)  # fewer: TF pads with the last value
    message = refused(lambda: check_tensor_value_count("s", string_tensor([b"a"] * 4, [3]), 3))
    assert "declares shape [3] (3 elements) but carries 4 values" in message


def test_values_of_a_dtype_without_a_value_field_are_left_to_the_parser():
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_RESOURCE)  # resource handles: no VALUE_FIELD_BY_DTYPE entry
    tensor.tensor_shape.dim.add().size = 0
    check_tensor_value_count("handle", tensor, 0)


def test_tensor_content_must_match_the_declared_shape():
    tensor = tf.make_tensor_proto(np.zeros(4, np.float32))
    assert tensor.tensor_content
    check_tensor_value_count("x", tensor, 4)
    assert "holds 16 bytes, not 12" in refused(lambda: check_tensor_value_count("x", tensor, 3))


def test_tensor_proto_declared_shape_against_the_signature():
    tensor = string_tensor([b"a"] * 8, [8])
    check_tensor_proto("s", tensor, [8], max_elements=8, max_batch_size=8)
    assert "Batch size 9" in refused(lambda: check_tensor_proto("s", tensor, [9], 9, 8))
    assert "(16 elements), more than the 8" in refused(lambda: check_tensor_proto("s", tensor, [1, 16], 8, 8))
    assert "negative dimension" in refused(lambda: check_tensor_proto("s", tensor, [-1], 8, 8))
    check_tensor_proto("s", string_tensor([], [0]), [0], max_elements=8, max_batch_size=8)  # an empty batch
    assert refused(lambda: check_tensor_proto("s", string_tensor([b"a"] * 9, [8]), [8], 8, 8)) == (
        "Input s declares shape [8] (8 elements) but carries 9 values; make the shape match the values."
    )


def serialized_request(**tensors) -> bytes:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "m"
    for name, tensor in tensors.items():
        request.inputs[name].CopyFrom(tensor)
    return request.SerializeToString()


def test_wire_value_counts_match_the_parsed_message_for_every_encoding():
    data = serialized_request(
        s=string_tensor([b"ab"] * 5, [5]),
        f=tf.make_tensor_proto([1.5] * 7, dtype=tf.float32),  # packed float_val... or tensor_content
        i=tf.make_tensor_proto(np.arange(6, dtype=np.int64)),
        big=tf.make_tensor_proto(np.arange(300, dtype=np.int64) * 1000),
    )
    counts = predict_request_input_counts(data, {"s": 100, "f": 100, "i": 100, "big": 1000})
    assert counts == {"s": 5, "f": 7, "i": 6, "big": 300}
    request = predict_pb2.PredictRequest.FromString(data)  # the request's other fields are not inputs
    request.model_spec.version.value = 3
    request.output_filter.append("probabilities")
    assert predict_request_input_counts(request.SerializeToString(), {"s": 100, "f": 100, "i": 100, "big": 1000}) == {
        "s": 5, "f": 7, "i": 6, "big": 300}
    packed = predict_pb2.PredictRequest()
    packed.inputs["v"].dtype = types_pb2.DT_INT64
    packed.inputs["v"].int64_val.extend([1, 300, 70000, 2**40])  # varints of 1, 2, 3 and 6 bytes
    packed.inputs["w"].dtype = types_pb2.DT_FLOAT
    packed.inputs["w"].float_val.extend([0.5] * 9)
    assert predict_request_input_counts(packed.SerializeToString(), {"v": 10, "w": 10}) == {"v": 4, "w": 9}


def test_wire_value_counts_of_unpacked_values_and_repeated_content():
    # Parsers accept repeated numbers unpacked too, one field per value: DT_INT64 with int64_val 5, 6, 7 unpacked.
    unpacked = b"\x08\x09" + b"\x50\x05\x50\x06\x50\x07"
    # A packed field may come in pieces, which the parser joins: float_val 3 + 1 values, int64_val 2 + 2 varints.
    pieces = (b"\x08\x01" + b"\x2a\x0c" + bytes(12) + b"\x2a\x04" + bytes(4)
              + b"\x52\x02\x01\x02" + b"\x52\x03\xac\x02\x03")
    float_content = tf.make_tensor_proto(np.zeros(4, np.float32))
    float_content.version_number = 7  # a varint field that is not the dtype
    content = float_content.SerializeToString()
    twice = content + b"\x22\x10" + bytes(16)  # tensor_content again: the message carries both
    one_byte = tf.make_tensor_proto(np.zeros(6, np.uint8)).SerializeToString()  # content of 1-byte elements
    data = b"".join(b"\x12" + bytes([len(entry)]) + entry for entry in (
        b"\x0a\x01u\x12" + bytes([len(unpacked)]) + unpacked,
        b"\x0a\x01c\x12" + bytes([len(content)]) + content,
        b"\x0a\x01t\x12" + bytes([len(twice)]) + twice,
        b"\x0a\x01p\x12" + bytes([len(pieces)]) + pieces,
        b"\x0a\x01b\x12" + bytes([len(one_byte)]) + one_byte,
    ))
    counts = predict_request_input_counts(data, {"u": 10, "c": 10, "t": 10, "p": 10, "b": 10})
    assert counts == {"u": 3, "c": 4, "t": 8, "p": 8, "b": 6}
    parsed = predict_pb2.PredictRequest.FromString(data)
    assert list(parsed.inputs["u"].int64_val) == [5, 6, 7]
    assert (len(parsed.inputs["p"].float_val), list(parsed.inputs["p"].int64_val)) == (4, [1, 2, 300, 3])
    assert tf.make_ndarray(parsed.inputs["c"]).shape == (4,)


def map_entry(name: str, tensor: bytes) -> bytes:
    """A PredictRequest `inputs` entry, encoded by hand (lengths under 128 and 16384)."""
    def field(tag: int, value: bytes) -> bytes:
        length = bytes([len(value)]) if len(value) < 128 else bytes([len(value) & 0x7F | 0x80, len(value) >> 7])
        return bytes([tag]) + length + value

    return field(0x12, field(0x0A, name.encode()) + field(0x12, tensor))


def test_wire_counts_read_every_wire_type_as_the_parser_does():
    shape_2 = b"\x12\x04\x12\x02\x08\x02"  # tensor_shape {dim {size: 2}}, after the values
    data = b"".join([
        map_entry("f", b"\x08\x01" + (b"\x2d" + np.float32(1.5).tobytes()) * 2 + shape_2),  # fixed32 float_val
        map_entry("d", b"\x08\x02" + (b"\x31" + np.float64(2.5).tobytes()) * 2 + shape_2),  # fixed64 double_val
        map_entry("i", b"\x08\x09" + b"\x50" + b"\xff" * 9 + b"\x01" + b"\x50\x80\x01"),  # varints of 10, 2 bytes
        map_entry("s", b"\x08\x07" + b"\x42\x80\x01" + b"x" * 128),  # a string of 128 bytes: length 0x80 0x01
    ])
    assert predict_request_input_counts(data, {"f": 9, "d": 9, "i": 9, "s": 9}) == {"f": 2, "d": 2, "i": 2, "s": 1}
    parsed = predict_pb2.PredictRequest.FromString(data)
    assert tf.make_ndarray(parsed.inputs["f"]).tolist() == [1.5, 1.5]
    assert tf.make_ndarray(parsed.inputs["d"]).tolist() == [2.5, 2.5]
    assert list(parsed.inputs["i"].int64_val) == [-1, 128]
    assert parsed.inputs["s"].string_val == [b"x" * 128]


def inputs_entry(*fields: bytes) -> bytes:
    """A PredictRequest `inputs` entry made of these encoded fields (each under 128 bytes)."""
    body = b"".join(fields)
    return b"\x12" + bytes([len(body)]) + body


def key(name: bytes) -> bytes:
    return b"\x0a" + bytes([len(name)]) + name


def value(tensor: bytes) -> bytes:
    return b"\x12" + bytes([len(tensor)]) + tensor


def test_wire_counts_of_every_shape_of_inputs_entry():
    six = string_tensor([b"x"] * 6, [6]).SerializeToString()
    data = b"".join([
        inputs_entry(key(b"k")),  # no value (an empty tensor): nothing to count
        inputs_entry(value(six)),  # no name: the input named "", refused by name later
        inputs_entry(key(b"unknown"), value(six)),  # not an input of the signature: refused by name later
        inputs_entry(key(b"twice"), value(six)),  # sent twice: the parser reads both (and keeps the last)
        inputs_entry(key(b"twice"), value(six)),
        inputs_entry(key(b"p"), value(six), b"\x1a\x00"),  # an unknown field: the parser reads it all, then drops it
    ])
    parsed = predict_pb2.PredictRequest.FromString(data)
    assert {name: len(tensor.string_val) for name, tensor in parsed.inputs.items()} == {
        "k": 0, "": 6, "unknown": 6, "twice": 6}
    assert predict_request_input_counts(data, {"k": 20, "twice": 20, "p": 20}) == {"unknown": 0, "twice": 12, "p": 6}
    assert "Input twice carries more than 10 values" in refused(
        lambda: check_wire_value_counts(data, {"twice": 10, "p": 10}))
    assert "Input p carries more than 5 values" in refused(lambda: check_wire_value_counts(data, {"p": 5}))
    # A name that is not UTF-8 (the parser refuses it later) is no input's name.
    assert predict_request_input_counts(inputs_entry(key(b"\xff"), value(b"")), {"x": 1}) == {"\ufffd": 0}


@pytest.mark.parametrize("data,problem", [
    (map_entry("i", b"\x50" + b"\xff" * 10 + b"\x01"), "varint longer than 10 bytes"),
    (b"\x1b", "unsupported wire type 3"),  # a group: not in a PredictRequest
    (b"\x12\x05ab", "length-delimited field runs past its message"),
    (b"\x09abcd", "field runs past its message"),  # a fixed64 field with 4 of its 8 bytes
])
def test_wire_counts_refuse_what_the_parser_refuses(data, problem):
    with pytest.raises(Exception):  # noqa: B017 - whichever DecodeError the protobuf runtime raises
        predict_pb2.PredictRequest.FromString(data)
    assert refused(lambda: check_wire_value_counts(data, {"i": 9})) == (
        f"The PredictRequest is not a valid protobuf message ({problem})."
    )


def test_wire_value_counts_at_the_limit_pass_and_one_more_is_refused():
    check_wire_value_counts(serialized_request(s=string_tensor([b"x"] * 10, [1])), {"s": 10})
    message = refused(lambda: check_wire_value_counts(serialized_request(s=string_tensor([b"x"] * 11, [1])), {"s": 10}))
    assert message == (
        "Input s carries more than 10 values, the most a full batch of this signature holds; "
        "send fewer examples per request."
    )


def test_wire_count_stops_reading_once_over_the_limit():
    counts = predict_request_input_counts(serialized_request(s=string_tensor([b"x"] * 100_000, [1])), {"s": 10})
    assert 10 < counts["s"] < 100


def test_bytes_that_are_not_a_message_are_invalid_argument():
    assert "not a valid protobuf message" in refused(lambda: check_wire_value_counts(b"\x12\xff\xff\xff\x7f", {}))
    assert refused(lambda: check_wire_value_counts(b"\x08", {})) == (  # a varint field without its value
        "The PredictRequest is not a valid protobuf message (truncated varint)."
    )


def test_admission_bounds_requests_and_bytes_in_flight():
    admission = AdmissionControl(max_requests=2, max_bytes=100)
    admission.admit(40)
    admission.admit(60)  # exactly at both limits
    message = refused(lambda: admission.admit(1), grpc.StatusCode.UNAVAILABLE)
    assert message == "Server is overloaded: 2 requests in flight, the limit is 2; retry with backoff."
    admission.release(60)
    message = refused(lambda: admission.admit(61), grpc.StatusCode.UNAVAILABLE)
    assert message == (
        "Server is overloaded: 40 request bytes in flight and this request adds 61, over the limit of 100; "
        "retry with backoff."
    )
    admission.admit(60)
    admission.release(40)
    admission.release(60)
    assert (admission.requests, admission.bytes) == (0, 0)
    admission.admit(500)  # alone, a request larger than the byte budget still runs (it passed the size limit)
    admission.release(500)


def test_admission_of_a_growing_chunked_body():
    admission = AdmissionControl(max_requests=4, max_bytes=100)
    admission.admit(50)
    admission.admit(0)
    admission.grow(50)  # exactly at the byte limit
    assert refused(lambda: admission.grow(1), grpc.StatusCode.UNAVAILABLE) == (
        "Server is overloaded: 100 request bytes in flight; retry with backoff."
    )
    admission.release(50)
    admission.grow(100)  # alone, a body may grow past the byte budget (the size limit bounds it)
    assert (admission.requests, admission.bytes) == (1, 150)


JSON_BODIES = [
    json.dumps({"s": ['a,b[c]{d}', 'quote " and \\ backslash, [', "\\\\", "]]]"], "n": [[1, 2], [3, [4]]]}).encode(),
    b'{"instances": [' + b", ".join([b'{"a": "x,y", "b": [1.5, 2]}'] * 50) + b"]}",
    b"[" * 40 + b'"}"' + b"]" * 40,
    b'"a bare string, [not] {nested}"',  # depth 0
]


@pytest.mark.parametrize("body", JSON_BODIES)
def test_large_bodies_are_sized_up_in_chunks_exactly_as_small_ones(monkeypatch, body):
    from serving.server import limits

    skeleton = json_skeleton(body)
    expected = (count_json_items(skeleton), json_nesting_depth(skeleton))
    assert limits.json_cost(body) == expected
    monkeypatch.setattr(limits, "_SMALL_BODY", 0)
    monkeypatch.setattr(limits, "_DEPTH_CHUNK", 7)  # strings and nesting cross chunk borders
    assert limits.json_cost(body) == expected


def test_sizing_up_a_body_of_millions_of_strings_needs_little_memory():
    import tracemalloc

    body = json.dumps({"inputs": {"s": ["ab"] * 4_000_000}}).encode()  # 24 MB
    tracemalloc.start()
    try:
        from serving.server.limits import json_cost

        assert json_cost(body) == (4_000_000 - 1 + 3 + 1, 3)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < len(body) // 4, peak  # scratch for one chunk, whatever the number of strings


def test_measuring_the_nesting_of_millions_of_brackets_needs_little_scratch():
    import tracemalloc

    skeleton = b"[]" * 4_000_000  # 8 MB of brackets
    tracemalloc.start()
    try:
        assert json_nesting_depth(skeleton) == 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * len(skeleton), peak  # the brackets once, and scratch for one chunk
