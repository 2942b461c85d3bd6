"""Server-side batching as TF Serving does it, configured by TF Serving's own batching parameters file.

`read_batching_parameters` parses the text-format `BatchingParameters` message that `tensorflow_model_server
--enable_batching --batching_parameters_file=...` reads, so one file serves the local server and the cluster.
`BatchScheduler` queues prediction tasks from both transports per (model version, signature, inner shapes), and
`num_batch_threads` threads each take a batch of up to `max_batch_size` rows once it is full or its oldest task
has waited `batch_timeout_micros`; a queue holding `max_enqueued_batches` batches refuses more (UNAVAILABLE).
Tasks are taken from the transports in turn, weighted by what a request of each costs the server
(`TransportCosts`), so a flood on one transport cannot push the other's tasks to the back of the queue, and each
gets a like share of the server's CPU. With batching off the same scheduler runs each task on its own.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format, wrappers_pb2

from serving.server.errors import ServingRequestError, invalid_argument
from serving.server.limits import unavailable
from serving.server.servable import ServableVersion, Signature

logger = logging.getLogger(__name__)

TRANSPORTS = ("rest", "grpc")


class BatchingConfigError(ValueError):
    """A batching parameters file that cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class BatchingParameters:
    """TF Serving's BatchingParameters; the defaults are SharedBatchScheduler's when a field is left out."""

    max_batch_size: int = 1000
    batch_timeout_micros: int = 0
    max_enqueued_batches: int = 10
    num_batch_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    allowed_batch_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_enqueued_batches", "num_batch_threads"):
            if getattr(self, name) < 1:
                raise BatchingConfigError(f"{name} must be at least 1, got {getattr(self, name)}.")
        if self.batch_timeout_micros < 0:
            raise BatchingConfigError(f"batch_timeout_micros must not be negative, got {self.batch_timeout_micros}.")
        sizes = self.allowed_batch_sizes
        if sizes:
            if any(b <= a for a, b in zip(sizes, sizes[1:], strict=False)) or sizes[0] < 1:
                raise BatchingConfigError(f"allowed_batch_sizes must be positive and increasing, got {list(sizes)}.")
            if sizes[-1] != self.max_batch_size:
                raise BatchingConfigError(
                    f"The last of allowed_batch_sizes ({sizes[-1]}) must equal max_batch_size ({self.max_batch_size})."
                )


def _batching_parameters_class():
    """TF Serving's message (session_bundle_config.proto), built here: tensorflow-serving-api does not ship it."""
    pool = descriptor_pool.DescriptorPool()
    wrappers = descriptor_pb2.FileDescriptorProto()
    wrappers_pb2.DESCRIPTOR.CopyToProto(wrappers)
    pool.Add(wrappers)
    file = descriptor_pb2.FileDescriptorProto(
        name="tensorflow_serving/servables/tensorflow/session_bundle_config.proto", package="tensorflow.serving",
        syntax="proto3", dependency=[wrappers.name],
    )
    message = file.message_type.add(name="BatchingParameters")
    label, optional = descriptor_pb2.FieldDescriptorProto, descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    wrapped = [("max_batch_size", 1, ".google.protobuf.Int64Value"),
               ("batch_timeout_micros", 2, ".google.protobuf.Int64Value"),
               ("max_enqueued_batches", 3, ".google.protobuf.Int64Value"),
               ("num_batch_threads", 4, ".google.protobuf.Int64Value"),
               ("thread_pool_name", 5, ".google.protobuf.StringValue"),
               ("enable_large_batch_splitting", 8, ".google.protobuf.BoolValue"),
               ("max_execution_batch_size", 9, ".google.protobuf.Int64Value")]
    for name, number, type_name in wrapped:
        message.field.add(name=name, number=number, label=optional, type=label.TYPE_MESSAGE, type_name=type_name)
    message.field.add(name="allowed_batch_sizes", number=6, label=label.LABEL_REPEATED, type=label.TYPE_INT64)
    message.field.add(name="pad_variable_length_inputs", number=7, label=optional, type=label.TYPE_BOOL)
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.serving.BatchingParameters"))


def parse_batching_parameters(text: str, source: str = "batching parameters") -> BatchingParameters:
    """The BatchingParameters in TF Serving's text format (e.g. `max_batch_size { value: 64 }`)."""
    proto = _batching_parameters_class()()
    try:
        text_format.Parse(text, proto)
    except text_format.ParseError as e:
        raise BatchingConfigError(
            f"{source} is not a valid text-format BatchingParameters: {e}; "
            "write fields like `max_batch_size { value: 64 }`."
        ) from e
    if proto.HasField("enable_large_batch_splitting") and proto.enable_large_batch_splitting.value:
        raise BatchingConfigError(
            f"{source}: enable_large_batch_splitting is not supported by mlops serve; remove it (requests larger "
            "than max_batch_size are then refused, as tensorflow_model_server does without it)."
        )
    if proto.pad_variable_length_inputs:
        raise BatchingConfigError(
            f"{source}: pad_variable_length_inputs is not supported by mlops serve; remove it (requests whose inputs "
            "differ in shape beyond the batch dimension then run in separate batches)."
        )
    if proto.HasField("max_execution_batch_size"):
        logger.warning("%s: max_execution_batch_size only applies with large batch splitting; ignored", source)
    values = {}
    for name in ("max_batch_size", "batch_timeout_micros", "max_enqueued_batches", "num_batch_threads"):
        if proto.HasField(name):
            values[name] = getattr(proto, name).value
    try:
        return BatchingParameters(**values, allowed_batch_sizes=tuple(proto.allowed_batch_sizes))
    except BatchingConfigError as e:
        raise BatchingConfigError(f"{source}: {e}") from e


def read_batching_parameters(path: str | Path) -> BatchingParameters:
    path = Path(path)
    if not path.is_file():
        raise BatchingConfigError(f"Batching parameters file {path} does not exist; give an existing file.")
    return parse_batching_parameters(path.read_text(), f"Batching parameters file {path}")


class TransportCosts:
    """What a request of each transport costs the server, by which the transports' turns are weighted.

    A request costs its transport's front-end work (HTTP or gRPC, parsing and converting, the response: all on the
    event loop thread) plus its share of a model call, the same for both. The front-end cost is the event loop's
    CPU time per request over intervals in which only that transport was served (a mixed interval's CPU cannot be
    told apart; the last estimates hold); the model cost is the batch threads' CPU time per request. Until both
    front-end costs are known the transports count as equally costly, so they take strict turns. A weight is a
    transport's cost relative to the cheaper one's, at most `max_ratio`, so no estimate can starve either.
    """

    def __init__(self, interval_s: float = 0.5, min_requests: int = 20, max_ratio: float = 4.0,
                 cpu: Callable[[], float] = time.thread_time, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.min_requests = min_requests
        self.max_ratio = max_ratio
        self._cpu = cpu
        self._clock = clock
        self._lock = threading.Lock()
        self.front_end: dict[str, float | None] = dict.fromkeys(TRANSPORTS)  # event loop CPU s per request
        self.model: float | None = None  # batch thread CPU s per request
        self.weights: dict[str, float] = dict.fromkeys(TRANSPORTS, 1.0)
        self._counts = dict.fromkeys(TRANSPORTS, 0)
        self._window = (clock(), cpu())  # when the current interval started, and the CPU time then

    def front_end_done(self, transport: str) -> None:
        """Counts a request whose model call has answered; call it on the event loop thread (its CPU is measured)."""
        if transport not in self._counts:
            return
        self._counts[transport] += 1
        now = self._clock()
        started, cpu_at_start = self._window
        if now - started < self.interval_s:
            return
        cpu = self._cpu()
        served = [t for t, count in self._counts.items() if count]
        if len(served) == 1 and self._counts[served[0]] >= self.min_requests:
            cost = (cpu - cpu_at_start) / self._counts[served[0]]
            previous = self.front_end[served[0]]
            self.front_end[served[0]] = cost if previous is None else 0.8 * previous + 0.2 * cost
            self._update_weights()
        self._counts = dict.fromkeys(TRANSPORTS, 0)
        self._window = (now, cpu)

    def model_ran(self, cpu_s: float, requests: int) -> None:
        """Records a model call's CPU time on a batch thread, shared by the `requests` it answered."""
        with self._lock:
            cost = cpu_s / requests
            self.model = cost if self.model is None else 0.95 * self.model + 0.05 * cost

    def _update_weights(self) -> None:
        if any(cost is None for cost in self.front_end.values()):
            return
        totals = {t: cost + (self.model or 0.0) for t, cost in self.front_end.items()}
        cheapest = min(totals.values())
        if cheapest > 0:
            self.weights = {t: min(total / cheapest, self.max_ratio) for t, total in totals.items()}


@dataclass
class _Task:
    inputs: Mapping[str, np.ndarray]
    rows: int
    transport: str
    future: Future
    enqueued_at: float


@dataclass
class _Queue:
    """Tasks that may share a batch: same servable, signature and input shapes beyond the batch dimension."""

    servable: ServableVersion
    signature: Signature
    by_transport: dict[str, deque] = field(default_factory=lambda: {t: deque() for t in TRANSPORTS})
    rows: int = 0
    tasks: int = 0
    turn: int = 0  # which transport goes first in the next batch on equal terms
    # Each transport's weighted turns so far (the cost of the tasks taken): the least served goes next.
    served: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TRANSPORTS, 0.0))

    def oldest(self) -> float:
        return min(tasks[0].enqueued_at for tasks in self.by_transport.values() if tasks)


@dataclass
class BatchStats:
    """What the scheduler did, for tests and benchmarks."""

    batches: int = 0
    tasks: int = 0
    largest_batch_tasks: int = 0
    mixed_transport_batches: int = 0  # batches holding tasks from both transports


class BatchScheduler:
    """Runs prediction tasks on `num_batch_threads` threads, merging concurrent tasks when `merge` is on."""

    def __init__(self, parameters: BatchingParameters, merge: bool = True,
                 costs: TransportCosts | None = None) -> None:
        self.parameters = parameters
        self.merge = merge
        self.costs = costs or TransportCosts()
        self.timeout_s = parameters.batch_timeout_micros / 1e6 if merge else 0.0
        self.stats = BatchStats()
        self._queues: dict[tuple, _Queue] = {}
        self._enqueued = 0  # batches (merge) or tasks (no merge) waiting, over all queues
        self._next_queue = 0  # round-robin position over queues
        self._condition = threading.Condition()
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._work, name=f"batch-thread-{i}", daemon=True)
            for i in range(parameters.num_batch_threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(
        self, servable: ServableVersion, signature: Signature, inputs: Mapping[str, np.ndarray], transport: str
    ) -> Future:
        """Queues one request's inputs; the future gets its outputs (or the exception that ended it)."""
        rows = _rows(inputs)
        if rows is not None and rows > self.parameters.max_batch_size:
            raise invalid_argument(
                f"Task size {rows} is larger than maximum input batch size {self.parameters.max_batch_size}; "
                "split the request into smaller ones."
            )
        key = (id(servable), signature.name, tuple(sorted((n, v.shape[1:], v.dtype) for n, v in inputs.items())))
        if rows is None:
            key = (key, object())  # no batch dimension: a queue of its own
        task = _Task(inputs, rows or 0, transport if transport in TRANSPORTS else TRANSPORTS[0], Future(),
                     time.monotonic())
        with self._condition:
            if self._stopping:
                raise unavailable("Server is shutting down; retry on another replica.")
            queue = self._queues.get(key)
            added = self._batches_added(queue, task.rows)
            if self._enqueued + added > self.parameters.max_enqueued_batches:
                raise unavailable(
                    "The batch scheduling queue to which this task was submitted is full "
                    f"({self.parameters.max_enqueued_batches} batches); retry with backoff."
                )
            new_queue = queue is None
            if new_queue:
                queue = self._queues[key] = _Queue(servable, signature)
            pending = queue.by_transport[task.transport]
            if not pending:
                # A transport that had nothing waiting gets no credit for the turns it did not need.
                busy = [queue.served[t] for t in TRANSPORTS if queue.by_transport[t]]
                if busy:
                    queue.served[task.transport] = max(queue.served[task.transport], min(busy))
            pending.append(task)
            queue.rows += task.rows
            queue.tasks += 1
            self._enqueued += added
            # A waiting thread needs waking only if this task moves its deadline (a new queue) or makes a batch
            # ready now; waking it for every task cost a context switch and a GIL hand-off per request.
            if new_queue or not self.merge or queue.rows >= self.parameters.max_batch_size:
                self._condition.notify()
        return task.future

    def stop(self) -> None:
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
        for thread in self._threads:
            thread.join(timeout=10)
        stats = self.stats
        if self.merge and stats.batches:
            logger.info("batching: %d requests ran in %d batches (%.1f per batch, at most %d)", stats.tasks,
                        stats.batches, stats.tasks / stats.batches, stats.largest_batch_tasks)

    # -- scheduling (all under self._condition)
    def _batches_in(self, queue: _Queue) -> int:
        """Batches a queue holds: its tasks (no merging), or its rows in batches of max_batch_size."""
        if not self.merge:
            return queue.tasks
        return max(1, -(-queue.rows // self.parameters.max_batch_size)) if queue.tasks else 0

    def _batches_added(self, queue: _Queue | None, rows: int) -> int:
        if not self.merge or queue is None:
            return 1
        return max(1, -(-(queue.rows + rows) // self.parameters.max_batch_size)) - self._batches_in(queue)

    def _ready(self, queue: _Queue, now: float) -> bool:
        return (not self.merge or queue.rows >= self.parameters.max_batch_size
                or now - queue.oldest() >= self.timeout_s)

    def _take_batch(self, now: float) -> tuple[_Queue, list[_Task]] | None:
        keys = list(self._queues)
        for offset in range(len(keys)):
            key = keys[(self._next_queue + offset) % len(keys)]
            queue = self._queues[key]
            if not self._ready(queue, now):
                continue
            self._next_queue = (self._next_queue + offset + 1) % len(keys)
            before = self._batches_in(queue)
            tasks = self._fill(queue)
            self._enqueued -= before - self._batches_in(queue)
            if queue.tasks == 0:
                del self._queues[key]
            return queue, tasks
        return None

    def _fill(self, queue: _Queue) -> list[_Task]:
        """Up to max_batch_size rows, each next task from the transport served least so far (by weighted turns;
        on equal terms in turn); each transport's tasks stay in order."""
        order = TRANSPORTS[queue.turn:] + TRANSPORTS[:queue.turn]
        queue.turn = (queue.turn + 1) % len(TRANSPORTS)
        weights = self.costs.weights
        tasks: list[_Task] = []
        rows = 0
        open_transports = [t for t in order if queue.by_transport[t]]
        while open_transports:
            transport = min(open_transports, key=lambda t: queue.served[t])  # ties: the first in `order`
            pending = queue.by_transport[transport]
            if not tasks or (self.merge and rows + pending[0].rows <= self.parameters.max_batch_size):
                task = pending.popleft()
                tasks.append(task)
                rows += task.rows
                queue.served[transport] += weights[transport]
                if not pending:
                    open_transports.remove(transport)
            else:
                open_transports.remove(transport)
            if not self.merge:
                break
        least = min(queue.served.values())
        queue.served = {t: served - least for t, served in queue.served.items()}
        queue.rows -= rows
        queue.tasks -= len(tasks)
        return tasks

    def _next_deadline(self) -> float | None:
        deadlines = [q.oldest() + self.timeout_s for q in self._queues.values()]
        return min(deadlines) if deadlines else None

    def _work(self) -> None:
        while True:
            with self._condition:
                while True:
                    now = time.monotonic()
                    taken = self._take_batch(now)
                    if taken is not None:
                        break
                    if self._stopping:
                        return
                    deadline = self._next_deadline()
                    self._condition.wait(None if deadline is None else max(deadline - now, 0.0))
                if self._queues:
                    self._condition.notify()  # another thread may take the next ready batch
            queue, tasks = taken
            self._record(tasks)
            started = time.thread_time()
            self._run(queue.signature, tasks)
            self.costs.model_ran(time.thread_time() - started, len(tasks))

    def _record(self, tasks: list[_Task]) -> None:
        stats = self.stats
        stats.batches += 1
        stats.tasks += len(tasks)
        stats.largest_batch_tasks = max(stats.largest_batch_tasks, len(tasks))
        if len({t.transport for t in tasks}) > 1:
            stats.mixed_transport_batches += 1

    # -- running
    def _run(self, signature: Signature, tasks: list[_Task]) -> None:
        tasks = [t for t in tasks if t.future.set_running_or_notify_cancel()]  # drops requests given up on
        if len(tasks) <= 1:
            for task in tasks:
                _run_alone(signature, task)
            return
        try:
            total = sum(t.rows for t in tasks)
            merged = {name: np.concatenate([t.inputs[name] for t in tasks]) for name in tasks[0].inputs}
            padded = self._padded_size(total)
            if padded > total:
                merged = {name: _pad(value, padded - total) for name, value in merged.items()}
            outputs = signature.run(merged)
            if any(value.ndim == 0 or value.shape[0] != padded for value in outputs.values()):
                raise _NotSplittable()
        except (ServingRequestError, _NotSplittable):
            # One task's values (or outputs without a batch dimension) must not fail the others: run each alone.
            for task in tasks:
                _run_alone(signature, task)
            return
        except BaseException as e:  # noqa: BLE001 - every waiting request gets the error, none hangs
            for task in tasks:
                task.future.set_exception(e)
            return
        start = 0
        for task in tasks:
            end = start + task.rows
            task.future.set_result({name: value[start:end] for name, value in outputs.items()})
            start = end

    def _padded_size(self, rows: int) -> int:
        for size in self.parameters.allowed_batch_sizes:
            if size >= rows:
                return size
        return rows


def _run_alone(signature: Signature, task: _Task) -> None:
    try:
        task.future.set_result(signature.run(task.inputs))
    except BaseException as e:  # noqa: BLE001 - delivered to the request that caused it
        task.future.set_exception(e)


class _NotSplittable(Exception):
    pass


def _rows(inputs: Mapping[str, np.ndarray]) -> int | None:
    sizes = {value.shape[0] if value.ndim else None for value in inputs.values()}
    return sizes.pop() if len(sizes) == 1 else None


def _pad(value: np.ndarray, extra: int) -> np.ndarray:
    # Padding rows repeat the first row (as TF Serving pads); their outputs are dropped.
    return np.concatenate([value, np.repeat(value[:1], extra, axis=0)])


def scheduler_for(batching: BatchingParameters | None, max_batch_size: int) -> BatchScheduler:
    """With `batching`, TF Serving's batching; without, each request alone, one at a time per CPU core (model calls
    are CPU-bound: more threads only contend, and a queue lets the transports take turns)."""
    if batching is not None:
        return BatchScheduler(batching, merge=True)
    unbatched = BatchingParameters(max_batch_size=max_batch_size, max_enqueued_batches=1 << 30)
    return BatchScheduler(unbatched, merge=False)
