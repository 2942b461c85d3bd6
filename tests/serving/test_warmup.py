"""SavedModel warm-up as TF Serving runs it: the Exporter's assets.extra/tf_serving_warmup_requests are run before a
version is AVAILABLE, and a file TF Serving would refuse fails the load with its reason."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from serving.server.servable import ServableLoadError, load_servable_version
from serving.server.warmup import MAX_WARMUP_RECORDS, WARMUP_FILE, load_and_warm_up, warm_up, write_warmup_requests
from tests.serving.conftest import FEATURES, MODEL

ROWS = {"fare": np.array([2.5, 40.0, np.nan, 7.0] * 3), "trip_start_hour": np.array([7, 23, 0, 12] * 3),
        "payment_type": np.array([b"Cash", b"Credit Card", b"", b"Cash"] * 3, dtype=object)}


class Counted(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = tf.Variable(0, dtype=tf.int64)


def counted_model(export_dir) -> str:
    """A SavedModel whose serving_default counts its calls, and refuses a negative fare."""
    module = Counted()

    @tf.function(input_signature=[tf.TensorSpec([None], dtype, name=name) for name, dtype in FEATURES.items()])
    def serve(fare, trip_start_hour, payment_type):
        checked = tf.debugging.assert_non_negative(tf.where(tf.math.is_nan(fare), 0.0, fare),
                                                   message="fare must not be negative")
        with tf.control_dependencies([checked, module.calls.assign_add(1)]):
            return {"probabilities": tf.sigmoid(fare * 0.0 + tf.cast(trip_start_hour, tf.float32))}

    tf.saved_model.save(module, str(export_dir), signatures={"serving_default": serve})
    return str(export_dir)


def records(path) -> list[prediction_log_pb2.PredictionLog]:
    return [prediction_log_pb2.PredictionLog.FromString(r) for r in tf.data.TFRecordDataset(str(path))
            .as_numpy_iterator()]


def write_records(export_dir, logs) -> None:
    path = export_dir / WARMUP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for log in logs:
            writer.write(log if isinstance(log, bytes) else log.SerializeToString())


def predict_log(export_dir, **inputs) -> prediction_log_pb2.PredictionLog:
    """One warm-up record as write_warmup_requests writes it, with `inputs` replacing its values."""
    written = records(export_dir / WARMUP_FILE)[0] if (export_dir / WARMUP_FILE).exists() else None
    log = prediction_log_pb2.PredictionLog()
    if written is not None:
        log.CopyFrom(written)
    for name, value in inputs.items():
        log.predict_log.request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    return log


def test_the_exporters_requests_are_the_first_rows_at_one_row_and_a_batch_in_the_signatures_dtypes(tmp_path):
    export = counted_model(tmp_path / "1")
    assert write_warmup_requests(export, ROWS) == 2
    logs = records(tmp_path / "1" / WARMUP_FILE)
    assert [log.predict_log.request.model_spec.signature_name for log in logs] == ["serving_default"] * 2
    for log, rows in zip(logs, (1, 8), strict=True):
        inputs = {name: tf.make_ndarray(t) for name, t in log.predict_log.request.inputs.items()}
        assert sorted(inputs) == sorted(FEATURES)
        assert {name: value.dtype for name, value in inputs.items()} == {
            "fare": np.float32, "trip_start_hour": np.int64, "payment_type": object}
        np.testing.assert_array_equal(inputs["trip_start_hour"], ROWS["trip_start_hour"][:rows])
        assert list(inputs["payment_type"]) == list(ROWS["payment_type"][:rows])
    # Fewer rows than a batch: the batch is all of them; no rows: no request.
    assert write_warmup_requests(export, {name: value[:3] for name, value in ROWS.items()}) == 2
    assert [len(log.predict_log.request.inputs["fare"].float_val) or
            log.predict_log.request.inputs["fare"].tensor_shape.dim[0].size
            for log in records(tmp_path / "1" / WARMUP_FILE)] == [1, 3]
    assert write_warmup_requests(export, {name: value[:0] for name, value in ROWS.items()}) == 0


def test_each_request_runs_once_before_the_version_is_returned(tmp_path):
    export = counted_model(tmp_path / "1")
    unwarmed = load_servable_version(MODEL, 1, export)
    assert warm_up(unwarmed) == 0 and unwarmed.loaded_object.calls.numpy() == 0, "no file: nothing runs"
    write_warmup_requests(export, ROWS)
    servable = load_and_warm_up(MODEL, 1, export)
    assert servable.loaded_object.calls.numpy() == 2


@pytest.mark.parametrize("count, loads", [(MAX_WARMUP_RECORDS, True), (MAX_WARMUP_RECORDS + 1, False)])
def test_a_file_of_more_than_a_thousand_records_fails_the_load_as_tf_serving_refuses_it(tmp_path, count, loads):
    export = counted_model(tmp_path / "1")
    write_warmup_requests(export, ROWS, batch_sizes=(1,))
    write_records(tmp_path / "1", [predict_log(tmp_path / "1")] * count)
    if loads:
        assert load_and_warm_up(MODEL, 1, export).loaded_object.calls.numpy() == count
    else:
        with pytest.raises(ServableLoadError, match=r"Number of warmup records exceeds the maximum \(1000\) at "):
            load_and_warm_up(MODEL, 1, export)


def test_a_request_the_model_refuses_fails_the_load_with_the_models_message(tmp_path):
    export = counted_model(tmp_path / "1")
    write_warmup_requests(export, ROWS, batch_sizes=(1,))
    good = predict_log(tmp_path / "1")
    negative = predict_log(tmp_path / "1", fare=np.array([-1.0], np.float32))
    unknown = predict_log(tmp_path / "1", tip=np.array([1.0], np.float32))
    missing = predict_log(tmp_path / "1")
    del missing.predict_log.request.inputs["fare"]
    other_signature = predict_log(tmp_path / "1")
    other_signature.predict_log.request.model_spec.signature_name = "scores"
    write_records(tmp_path / "1", [good, negative])
    with pytest.raises(ServableLoadError) as failed:
        load_and_warm_up(MODEL, 1, export)
    assert failed.value.code == "INVALID_ARGUMENT"
    assert failed.value.message.startswith(f"warmup request 2 of {export}/{WARMUP_FILE} failed: The model rejected "
                                           "the inputs: assertion failed: [fare must not be negative"), \
        failed.value.message
    for log, expected in ((unknown, r"its inputs do not match the signature's \(missing \[\], unknown \['tip'\]\)"),
                          (missing, r"missing \['fare'\], unknown \[\]"), (other_signature, r'"scores" not found')):
        write_records(tmp_path / "1", [log])
        with pytest.raises(ServableLoadError, match=r"warmup request 1 of .* failed: .*" + expected):
            load_and_warm_up(MODEL, 1, export)


def test_a_file_that_is_not_prediction_logs_fails_the_load(tmp_path):
    export = counted_model(tmp_path / "1")
    write_records(tmp_path / "1", [b"not a PredictionLog \xff\xff"])
    with pytest.raises(ServableLoadError, match=r"Failed to parse warmup record 1 from "):
        load_and_warm_up(MODEL, 1, export)
    classify = prediction_log_pb2.PredictionLog()
    classify.classify_log.request.model_spec.signature_name = "serving_default"
    write_records(tmp_path / "1", [classify])
    with pytest.raises(ServableLoadError, match=r"record 1 of .* is a classify_log; this server answers Predict "
                                                r"requests alone") as failed:
        load_and_warm_up(MODEL, 1, export)
    assert failed.value.code == "UNIMPLEMENTED"
    (tmp_path / "1" / WARMUP_FILE).write_bytes(b"\x00" * 40)
    with pytest.raises(ServableLoadError, match=r"Please verify your warmup data is in TFRecord format") as failed:
        load_and_warm_up(MODEL, 1, export)
    assert failed.value.code == "DATA_LOSS"
