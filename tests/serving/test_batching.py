"""Server-side batching: TF Serving's parameters file, the scheduler's batches, and both transports sharing them."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from serving.server.batching import (
    BatchingConfigError,
    BatchingParameters,
    BatchScheduler,
    TransportCosts,
    parse_batching_parameters,
    read_batching_parameters,
)
from serving.server.errors import ServingRequestError, invalid_argument
from tests.serving.conftest import FEATURES, MODEL, ROW, expected_probability, http_json, start_server

REPO_ROOT = Path(__file__).resolve().parents[2]
CLUSTER_FILE = REPO_ROOT / "k8s" / "serving" / "base" / "batching_parameters.txt"


def test_the_cluster_file_is_valid_tf_serving_batching_parameters():
    parameters = read_batching_parameters(CLUSTER_FILE)
    assert parameters.max_batch_size >= 1 and parameters.num_batch_threads >= 1
    assert parameters.max_enqueued_batches >= 1 and parameters.batch_timeout_micros >= 0


def test_parameters_text_format_and_defaults():
    parameters = parse_batching_parameters(
        "max_batch_size { value: 64 } batch_timeout_micros { value: 500 }\n"
        "num_batch_threads { value: 2 } max_enqueued_batches { value: 100 }\n"
        'thread_pool_name { value: "batch_threads" } allowed_batch_sizes: 16 allowed_batch_sizes: 64\n'
    )
    assert parameters == BatchingParameters(64, 500, 100, 2, (16, 64))
    defaults = parse_batching_parameters("")
    assert (defaults.max_batch_size, defaults.batch_timeout_micros, defaults.max_enqueued_batches) == (1000, 0, 10)


@pytest.mark.parametrize("text,message", [
    ("max_batch_size: 64", "not a valid text-format BatchingParameters"),
    ("max_batch_sise { value: 64 }", "not a valid text-format BatchingParameters"),
    ("max_batch_size { value: 0 }", "max_batch_size must be at least 1"),
    ("num_batch_threads { value: 0 }", "num_batch_threads must be at least 1"),
    ("batch_timeout_micros { value: -1 }", "must not be negative"),
    ("max_batch_size { value: 64 } allowed_batch_sizes: 8 allowed_batch_sizes: 32", "must equal max_batch_size"),
    ("max_batch_size { value: 64 } allowed_batch_sizes: 32 allowed_batch_sizes: 8 allowed_batch_sizes: 64",
     "increasing"),
    ("enable_large_batch_splitting { value: true }", "not supported by mlops serve"),
    ("pad_variable_length_inputs: true", "not supported by mlops serve"),
])
def test_unusable_parameters_are_refused_with_the_reason(text, message):
    with pytest.raises(BatchingConfigError, match=message):
        parse_batching_parameters(text, "test file")


class FakeSignature:
    """Adds one to `x`, records each call's batch size; `gate` holds calls until set."""

    name = "serving_default"

    def __init__(self, gate: threading.Event | None = None, bad_value: float | None = None) -> None:
        self.calls: list[int] = []
        self.values: list[float] = []  # each call's first value, in the order of the calls
        self.gate = gate
        self.bad_value = bad_value
        self.started = threading.Event()

    def run(self, inputs):
        self.started.set()
        if self.gate is not None:
            self.gate.wait(10)
        x = inputs["x"]
        self.calls.append(len(x))
        self.values.append(float(x[0]))
        if self.bad_value is not None and (x == self.bad_value).any():
            raise invalid_argument("The model rejected the inputs: bad value")
        return {"y": x + 1}


def task(value: float, rows: int = 1) -> dict:
    return {"x": np.full(rows, value, dtype=np.float32)}


@pytest.fixture
def scheduler_factory():
    made = []

    def make(**parameters) -> BatchScheduler:
        merge = parameters.pop("merge", True)
        costs = parameters.pop("costs", None)
        scheduler = BatchScheduler(BatchingParameters(**{"num_batch_threads": 1, **parameters}), merge=merge,
                                   costs=costs)
        made.append(scheduler)
        return scheduler

    yield make
    for scheduler in made:
        scheduler.stop()


def hold_the_thread(scheduler: BatchScheduler, signature: FakeSignature) -> object:
    """Occupies the scheduler's only thread with a task on another queue until `signature.gate` is set."""
    servable = object()
    scheduler.submit(servable, signature, task(0.0), "rest")
    assert signature.started.wait(10)
    return servable


def test_concurrent_tasks_share_a_batch_and_each_gets_its_own_rows(scheduler_factory):
    scheduler = scheduler_factory(max_batch_size=8)
    gate = threading.Event()
    blocker = FakeSignature(gate)
    hold_the_thread(scheduler, blocker)
    signature, servable = FakeSignature(), object()
    futures = [scheduler.submit(servable, signature, task(float(i), rows=2), "rest") for i in range(3)]
    gate.set()
    results = [f.result(10)["y"].tolist() for f in futures]
    assert results == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    assert signature.calls == [6]


def test_a_batch_never_exceeds_max_batch_size(scheduler_factory):
    scheduler = scheduler_factory(max_batch_size=4, max_enqueued_batches=10)
    gate = threading.Event()
    hold_the_thread(scheduler, FakeSignature(gate))
    signature, servable = FakeSignature(), object()
    futures = [scheduler.submit(servable, signature, task(1.0, rows=3), "rest") for _ in range(3)]
    gate.set()
    for future in futures:
        future.result(10)
    assert signature.calls == [3, 3, 3]  # 3 + 3 > 4: no two share a batch


def test_transports_take_turns_within_a_batch(scheduler_factory):
    scheduler = scheduler_factory(max_batch_size=4, max_enqueued_batches=10)
    gate = threading.Event()
    hold_the_thread(scheduler, FakeSignature(gate))
    signature, servable = FakeSignature(), object()
    rest = [scheduler.submit(servable, signature, task(float(i)), "rest") for i in range(6)]
    grpc_tasks = [scheduler.submit(servable, signature, task(100.0 + i), "grpc") for i in range(2)]
    gate.set()
    for future in rest + grpc_tasks:
        future.result(10)
    # Six REST tasks came first, yet the first batch of four holds both gRPC tasks.
    assert signature.calls == [4, 4]
    assert scheduler.stats.mixed_transport_batches >= 1
    first_batch_values = sorted(f.result()["y"][0] for f in rest[:2] + grpc_tasks)
    assert first_batch_values == [1.0, 2.0, 101.0, 102.0]


def test_a_full_queue_answers_unavailable(scheduler_factory):
    scheduler = scheduler_factory(max_batch_size=2, max_enqueued_batches=2)
    gate = threading.Event()
    hold_the_thread(scheduler, FakeSignature(gate))
    signature, servable = FakeSignature(), object()
    accepted = [scheduler.submit(servable, signature, task(1.0), "rest") for _ in range(4)]  # two batches of two
    with pytest.raises(ServingRequestError) as error:
        scheduler.submit(servable, signature, task(1.0), "grpc")
    assert error.value.code == grpc.StatusCode.UNAVAILABLE
    assert "batch scheduling queue" in error.value.message
    gate.set()
    assert [f.result(10)["y"].tolist() for f in accepted] == [[2.0]] * 4


def test_a_task_larger_than_a_batch_is_invalid(scheduler_factory):
    scheduler = scheduler_factory(max_batch_size=4)
    scheduler.submit(object(), FakeSignature(), task(1.0, rows=4), "rest").result(10)
    with pytest.raises(ServingRequestError, match="Task size 5 is larger than maximum input batch size 4"):
        scheduler.submit(object(), FakeSignature(), task(1.0, rows=5), "rest")


def test_the_timeout_lets_a_batch_fill_and_a_full_batch_runs_at_once(scheduler_factory):
    scheduler = scheduler_factory(max_batch_size=3, batch_timeout_micros=30_000_000)
    signature, servable = FakeSignature(), object()
    futures = [scheduler.submit(servable, signature, task(1.0), "rest") for _ in range(3)]
    for future in futures:
        future.result(10)  # the third task filled the batch: no 30 s wait
    assert signature.calls == [3]


def test_one_bad_task_does_not_fail_the_others_in_its_batch(scheduler_factory):
    scheduler = scheduler_factory(max_batch_size=8)
    gate = threading.Event()
    hold_the_thread(scheduler, FakeSignature(gate))
    signature, servable = FakeSignature(bad_value=13.0), object()
    good = scheduler.submit(servable, signature, task(1.0), "rest")
    bad = scheduler.submit(servable, signature, task(13.0), "grpc")
    gate.set()
    assert good.result(10)["y"].tolist() == [2.0]
    with pytest.raises(ServingRequestError, match="bad value"):
        bad.result(10)


def test_batches_are_padded_to_allowed_sizes(scheduler_factory):
    scheduler = scheduler_factory(max_batch_size=8, allowed_batch_sizes=(4, 8))
    gate = threading.Event()
    hold_the_thread(scheduler, FakeSignature(gate))
    signature, servable = FakeSignature(), object()
    futures = [scheduler.submit(servable, signature, task(float(i)), "rest") for i in range(3)]
    gate.set()
    assert [f.result(10)["y"].tolist() for f in futures] == [[1.0], [2.0], [3.0]]
    assert signature.calls == [4]


def test_without_merging_each_task_runs_alone(scheduler_factory):
    scheduler = scheduler_factory(max_batch_size=8, merge=False)
    gate = threading.Event()
    hold_the_thread(scheduler, FakeSignature(gate))
    signature, servable = FakeSignature(), object()
    futures = [scheduler.submit(servable, signature, task(1.0), t) for t in ("rest", "grpc", "rest")]
    gate.set()
    for future in futures:
        future.result(10)
    assert signature.calls == [1, 1, 1]


def transports_in_call_order(signature: FakeSignature) -> str:
    """R for each REST task, G for each gRPC task (gRPC tasks carry values from 100)."""
    return "".join("G" if value >= 100 else "R" for value in signature.values)


def test_unbatched_transports_take_strict_turns_while_their_costs_are_unknown(scheduler_factory):
    scheduler = scheduler_factory(max_batch_size=8, merge=False)
    gate = threading.Event()
    hold_the_thread(scheduler, FakeSignature(gate))
    signature, servable = FakeSignature(), object()
    futures = [scheduler.submit(servable, signature, task(float(i)), "rest") for i in range(4)]
    futures += [scheduler.submit(servable, signature, task(100.0 + i), "grpc") for i in range(4)]
    gate.set()
    for future in futures:
        future.result(10)
    assert transports_in_call_order(signature) == "RGRGRGRG"


def test_unbatched_turns_are_weighted_by_what_each_transport_costs(scheduler_factory):
    costs = TransportCosts()
    costs.weights = {"rest": 1.0, "grpc": 2.0}  # a gRPC request costs the server twice a REST one
    scheduler = scheduler_factory(max_batch_size=8, max_enqueued_batches=20, merge=False, costs=costs)
    gate = threading.Event()
    hold_the_thread(scheduler, FakeSignature(gate))
    signature, servable = FakeSignature(), object()
    futures = [scheduler.submit(servable, signature, task(float(i)), "rest") for i in range(8)]
    futures += [scheduler.submit(servable, signature, task(100.0 + i), "grpc") for i in range(8)]
    gate.set()
    for future in futures:
        future.result(10)
    order = transports_in_call_order(signature)
    assert order[:6].count("R") == 4 and order[:9].count("R") == 6, order  # two REST turns for each gRPC turn
    # Each transport's tasks keep their order.
    assert [v for v in signature.values if v < 100] == sorted(v for v in signature.values if v < 100)
    assert [v for v in signature.values if v >= 100] == sorted(v for v in signature.values if v >= 100)


class PausingSignature(FakeSignature):
    """Holds its `pause_at`-th call (counting from 0) until `resume` is set."""

    def __init__(self, pause_at: int) -> None:
        super().__init__()
        self.pause_at = pause_at
        self.paused, self.resume = threading.Event(), threading.Event()

    def run(self, inputs):
        if len(self.values) == self.pause_at:
            self.paused.set()
            self.resume.wait(10)
        return super().run(inputs)


def test_a_transport_that_had_nothing_waiting_gets_no_banked_turns(scheduler_factory):
    scheduler = scheduler_factory(max_batch_size=8, merge=False)
    signature, servable = PausingSignature(pause_at=3), object()
    futures = [scheduler.submit(servable, signature, task(float(i)), "rest") for i in range(6)]
    assert signature.paused.wait(10)  # three REST tasks ran alone, a fourth is running
    futures += [scheduler.submit(servable, signature, task(100.0 + i), "grpc") for i in range(3)]
    signature.resume.set()
    for future in futures:
        future.result(10)
    # gRPC arrived late: from then on the two take turns; it is not owed the turns REST took alone (else GGG).
    assert transports_in_call_order(signature) == "RRRRRGRGG"


def test_transport_costs_are_measured_while_one_transport_is_served_alone():
    clock, cpu = [0.0], [0.0]
    costs = TransportCosts(interval_s=0.95, min_requests=4, cpu=lambda: cpu[0], clock=lambda: clock[0])

    def interval(requests: list[tuple[str, float]]) -> None:
        """One second of requests (transport, event loop CPU seconds each)."""
        for transport, cpu_seconds in requests:
            clock[0] += 1.0 / len(requests)
            cpu[0] += cpu_seconds
            costs.front_end_done(transport)

    costs.model_ran(cpu_s=0.004, requests=4)  # 1 ms of model time per request
    interval([("rest", 0.001)] * 10)
    assert costs.front_end["rest"] == pytest.approx(0.001)
    assert costs.weights == {"rest": 1.0, "grpc": 1.0}  # gRPC's cost is not known yet: strict turns
    interval([("rest", 0.001), ("grpc", 0.01)] * 5)  # a mixed interval tells nothing about either
    assert costs.front_end["grpc"] is None and costs.front_end["rest"] == pytest.approx(0.001)
    interval([("grpc", 0.002)] * 10)
    assert costs.front_end["grpc"] == pytest.approx(0.002)
    # 2 ms + 1 ms of model against 1 ms + 1 ms: a gRPC request counts one and a half REST requests.
    assert costs.weights == {"rest": 1.0, "grpc": pytest.approx(1.5)}
    interval([("grpc", 0.002)] * 3)  # too few requests in an interval to measure anything
    assert costs.front_end["grpc"] == pytest.approx(0.002)
    for _ in range(20):  # skewed intervals (say a model loading meanwhile) cannot starve either transport
        interval([("grpc", 1.0)] * 10)
    assert costs.weights == {"rest": 1.0, "grpc": costs.max_ratio}


def grpc_request(rows: list[dict]) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL
    for name, dtype in FEATURES.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto([row[name] for row in rows], dtype=dtype))
    return request


def test_rest_and_grpc_requests_share_one_batch(repository):
    # A long timeout: the batch runs when its eighth row arrives, so all eight requests meet in it.
    server = start_server(repository, batching=BatchingParameters(max_batch_size=8, batch_timeout_micros=30_000_000,
                                                                  num_batch_threads=1))
    try:
        rows = [{**ROW, "fare": float(i)} for i in range(8)]
        channel = grpc.insecure_channel(server.grpc_target)
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)

        def rest_call(row):
            status, body = http_json("POST", f"{server.rest_url}/v1/models/{MODEL}:predict", {"instances": [row]})
            assert status == 200, body
            return body["predictions"][0]

        def grpc_call(row):
            return float(tf.make_ndarray(stub.Predict(grpc_request([row]), timeout=20).outputs["probabilities"])[0])

        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(rest_call if i % 2 else grpc_call, row) for i, row in enumerate(rows)]
            answers = [f.result(30) for f in futures]
        channel.close()
        assert answers == pytest.approx([expected_probability(row, 2) for row in rows])
        assert (server.scheduler.stats.batches, server.scheduler.stats.mixed_transport_batches) == (1, 1)
    finally:
        server.stop()


def test_with_batching_a_request_larger_than_a_batch_is_refused(repository):
    server = start_server(repository, max_batch_size=8, batching=BatchingParameters(max_batch_size=4))
    try:
        status, body = http_json("POST", f"{server.rest_url}/v1/models/{MODEL}:predict", {"instances": [ROW] * 4})
        assert status == 200 and len(body["predictions"]) == 4
        status, body = http_json("POST", f"{server.rest_url}/v1/models/{MODEL}:predict", {"instances": [ROW] * 5})
        assert status == 400 and "Batch size 5 is larger than the maximum batch size 4" in body["error"]
    finally:
        server.stop()
