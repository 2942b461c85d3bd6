"""Checks a prediction request against the signature (names, shapes, batch size) and runs it on the scheduler.

Both transports call this after turning their wire format into numpy arrays of the signature's dtypes, so their
requests share one queue (and, with batching on, share batches).
"""
from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from concurrent.futures import Future

import numpy as np

from serving.server.batching import BatchScheduler
from serving.server.errors import invalid_argument
from serving.server.limits import check_batch_size
from serving.server.servable import ServableVersion, Signature


def check_inputs(
    servable: ServableVersion, signature: Signature, inputs: Mapping[str, np.ndarray], max_batch_size: int
) -> None:
    """Raises INVALID_ARGUMENT unless `inputs` has the signature's names, compatible shapes and one batch size."""
    expected = signature.inputs
    if inputs.keys() != expected.keys():
        given = set(inputs)
        for name in sorted(given - set(expected)):
            raise invalid_argument(
                f"input tensor alias not found in signature: {name}. "
                f"Inputs expected to be in the set {{{','.join(sorted(expected))}}}."
            )
        missing = sorted(set(expected) - given)
        raise invalid_argument(
            f"Request inputs do not match required inputs for model `{servable.model_name}`. "
            f"Send extra: {{}}. Missing but required: {{{','.join(missing)}}}."
        )
    batch_size = None
    one_batch_size = True
    patterns = signature.input_shape_patterns
    for name, value in inputs.items():
        shape = value.shape
        pattern = patterns[name]
        if pattern is not None and not _shape_matches(shape, *pattern):
            raise invalid_argument(
                f"Input {name} has shape {list(shape)} but the signature expects "
                f"{signature.input_dims[name]} (-1 means any size)."
            )
        if shape:
            if batch_size is None:
                batch_size = shape[0]
            elif shape[0] != batch_size:
                one_batch_size = False
    if not one_batch_size:
        batch_sizes = {name: value.shape[0] for name, value in sorted(inputs.items()) if value.ndim}
        raise invalid_argument(f"Input tensors must have the same 0th-dimension (batch) size; got {batch_sizes}.")
    check_batch_size(batch_size or 0, max_batch_size)


def check_output_filter(signature: Signature, output_filter: Sequence[str]) -> None:
    for name in output_filter:
        if name not in signature.outputs:
            raise invalid_argument(
                f"output tensor alias not found in signature: {name} "
                f"Outputs expected to be in the set {{{','.join(sorted(signature.outputs))}}}."
            )


class Predictor:
    """Validates a request and runs it on the shared scheduler; awaited by both transports' handlers."""

    def __init__(self, scheduler: BatchScheduler, max_batch_size: int) -> None:
        self.scheduler = scheduler
        self.max_batch_size = max_batch_size

    def submit(
        self, servable: ServableVersion, signature_name: str, inputs: Mapping[str, np.ndarray], transport: str,
        output_filter: Sequence[str],
    ) -> tuple[Signature, Future]:
        signature = servable.signature(signature_name)
        check_inputs(servable, signature, inputs, self.max_batch_size)
        check_output_filter(signature, output_filter)
        return signature, self.scheduler.submit(servable, signature, inputs, transport)

    async def predict(
        self,
        servable: ServableVersion,
        signature_name: str,
        inputs: Mapping[str, np.ndarray],
        transport: str,
        output_filter: Sequence[str] = (),
    ) -> tuple[Signature, dict[str, np.ndarray]]:
        """The signature used and its (optionally filtered) outputs, awaited on the event loop (both transports).
        Cancelling the awaiting task (a gRPC deadline, a client gone) takes a task not yet started off the queue."""
        signature, future = self.submit(servable, signature_name, inputs, transport, output_filter)
        outputs = await asyncio.wrap_future(future)
        self.scheduler.costs.front_end_done(transport)
        return signature, _filtered(outputs, output_filter)


def _filtered(outputs: dict[str, np.ndarray], output_filter: Sequence[str]) -> dict[str, np.ndarray]:
    return {name: outputs[name] for name in output_filter} if output_filter else outputs


def _shape_matches(actual: tuple[int, ...], rank: int, fixed: tuple[tuple[int, int], ...]) -> bool:
    if len(actual) != rank:
        return False
    for axis, size in fixed:  # most inputs fix no dimension: no generator to set up
        if actual[axis] != size:
            return False
    return True
