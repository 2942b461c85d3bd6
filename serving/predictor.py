"""Checks a prediction request against the signature (names, shapes, batch size) and runs it.

Both transports call this after turning their wire format into numpy arrays of the signature's dtypes.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from tensorflow.core.protobuf import meta_graph_pb2

from serving.errors import invalid_argument
from serving.servable import ServableVersion, Signature


def shape_of(info: meta_graph_pb2.TensorInfo) -> list[int] | None:
    """The signature's shape for a tensor, -1 for unknown dimensions, None for unknown rank."""
    if info.tensor_shape.unknown_rank:
        return None
    return [d.size for d in info.tensor_shape.dim]


def check_inputs(
    servable: ServableVersion, signature: Signature, inputs: Mapping[str, np.ndarray], max_batch_size: int
) -> None:
    """Raises INVALID_ARGUMENT unless `inputs` has the signature's names, compatible shapes and one batch size."""
    expected = set(signature.inputs)
    given = set(inputs)
    for name in sorted(given - expected):
        raise invalid_argument(
            f"input tensor alias not found in signature: {name}. "
            f"Inputs expected to be in the set {{{','.join(sorted(expected))}}}."
        )
    missing = sorted(expected - given)
    if missing:
        raise invalid_argument(
            f"Request inputs do not match required inputs for model `{servable.model_name}`. "
            f"Send extra: {{}}. Missing but required: {{{','.join(missing)}}}."
        )
    batch_sizes = {}
    for name, value in inputs.items():
        expected_shape = shape_of(signature.inputs[name])
        if expected_shape is not None and not _shape_compatible(value.shape, expected_shape):
            raise invalid_argument(
                f"Input {name} has shape {list(value.shape)} but the signature expects {expected_shape} "
                "(-1 means any size)."
            )
        if value.ndim >= 1:
            batch_sizes[name] = value.shape[0]
    if len(set(batch_sizes.values())) > 1:
        raise invalid_argument(
            f"Input tensors must have the same 0th-dimension (batch) size; got {dict(sorted(batch_sizes.items()))}."
        )
    batch = next(iter(batch_sizes.values()), 0)
    if batch > max_batch_size:
        raise invalid_argument(
            f"Batch size {batch} is larger than the maximum batch size {max_batch_size}; "
            "split the request into smaller ones."
        )


def run_prediction(
    servable: ServableVersion,
    signature_name: str,
    inputs: Mapping[str, np.ndarray],
    max_batch_size: int,
    output_filter: Sequence[str] = (),
) -> tuple[Signature, dict[str, np.ndarray]]:
    """Validates and runs one request; returns the signature used and its (optionally filtered) outputs."""
    signature = servable.signature(signature_name)
    check_inputs(servable, signature, inputs, max_batch_size)
    for name in output_filter:
        if name not in signature.outputs:
            raise invalid_argument(
                f"output tensor alias not found in signature: {name} "
                f"Outputs expected to be in the set {{{','.join(sorted(signature.outputs))}}}."
            )
    outputs = signature.run(inputs)
    if output_filter:
        outputs = {name: outputs[name] for name in output_filter}
    return signature, outputs


def _shape_compatible(actual: tuple[int, ...], expected: list[int]) -> bool:
    if len(actual) != len(expected):
        return False
    return all(e < 0 or a == e for a, e in zip(actual, expected, strict=True))
