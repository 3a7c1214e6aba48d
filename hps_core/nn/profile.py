"""Per-layer cost of a forward pass: arithmetic work counted from shapes, and measured time.

Work is counted in floating-point operations (FLOPs): a multiply-add of a matrix product counts
2, every other add, multiply, comparison or exponential counts 1, and moving data counts 0. It
is what the layer's ``forward`` computes (the Interaction computes its whole Gram matrix, so its
count covers all ``n * n`` dot products, not only the lower triangle it keeps).

Time comes from a :class:`StepClock`: the host clock for NumPy, CUDA events recorded on the
current stream for CuPy. Events are recorded between layers without synchronising, so the GPU
runs the pass as it would unprofiled; each layer's time is the stream time between the events
around it, which on a starved GPU (small batches) includes the host's launch overhead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod
from types import ModuleType
from typing import Any, Protocol

from hps_core.nn.layers import (
    Add,
    ElementwiseMultiply,
    FmOrder2,
    InnerProduct,
    Interaction,
    Layer,
    MultiCross,
    ReduceSum,
    WeightMultiply,
)
from hps_core.nn.layers.activation import LossAsSigmoid, ReLU, Sigmoid
from hps_core.nn.spec.shapes import TensorShape

Array = Any  # a numpy.ndarray or cupy.ndarray


def layer_flops(layer: Layer, inputs: Sequence[TensorShape], batch: int) -> int:
    """FLOPs of one layer's forward pass for ``batch`` samples.

    Args:
        layer: a built layer (with ``fuse_relu`` set if the executor fused a ReLU into it).
        inputs: the shapes of its consumed inputs, in order.
        batch: samples in the batch.

    Returns:
        The operation count (0 for layers that only move data).

    Example:
        >>> fc = InnerProduct((TensorShape(1, (4,)),), in_features=3, out_features=4)
        >>> layer_flops(fc, [TensorShape(1, (3,))], batch=10)  # 10*4*(2*3 + 1 bias)
        280
    """
    count = _COUNTERS.get(type(layer))
    return 0 if count is None else count(layer, inputs, batch)


def _elements(shape: TensorShape, batch: int) -> int:
    return prod(shape.concrete(batch))


def _inner_product(layer: InnerProduct, inputs: Sequence[TensorShape], batch: int) -> int:
    rows = _elements(inputs[0], batch) // layer.in_features
    per_output = 2 * layer.in_features + 1 + (1 if layer.fuse_relu else 0)
    return rows * layer.out_features * per_output


def _multi_cross(layer: MultiCross, inputs: Sequence[TensorShape], batch: int) -> int:
    rows, d, p = _elements(inputs[0], batch) // layer.width, layer.width, layer.projection_dim
    # Per cross layer: the product(s), then x0 * s, + x_l and + b on every element.
    product = 4 * d * p if p else 2 * d
    return layer.num_layers * rows * (product + 3 * d)


def _interaction(layer: Interaction, inputs: Sequence[TensorShape], batch: int) -> int:
    rows, width = inputs[0].concrete(batch)
    return 2 * rows * layer.num_vectors**2 * width


def _fm_order2(layer: FmOrder2, inputs: Sequence[TensorShape], batch: int) -> int:
    # Sum, squares and their sum over the input; square, subtract and halve per output.
    return 3 * _elements(inputs[0], batch) + 3 * batch * inputs[0].rows_per_sample * layer.out_dim


def _per_input_element(ops: int) -> Callable[[Layer, Sequence[TensorShape], int], int]:
    return lambda layer, inputs, batch: ops * _elements(inputs[0], batch)


def _combine(layer: Layer, inputs: Sequence[TensorShape], batch: int) -> int:
    return (len(inputs) - 1) * _elements(inputs[0], batch)


def _weight_multiply(layer: WeightMultiply, inputs: Sequence[TensorShape], batch: int) -> int:
    return _elements(layer.output_shapes[0], batch)


_COUNTERS: dict[type[Layer], Callable[[Any, Sequence[TensorShape], int], int]] = {
    Add: _combine,
    ElementwiseMultiply: _combine,
    FmOrder2: _fm_order2,
    InnerProduct: _inner_product,
    Interaction: _interaction,
    MultiCross: _multi_cross,
    ReduceSum: _per_input_element(1),
    ReLU: _per_input_element(1),
    # |x|, exp, 1 + e and the division; the select is data movement.
    Sigmoid: _per_input_element(4),
    LossAsSigmoid: _per_input_element(4),
    WeightMultiply: _weight_multiply,
}


@dataclass(frozen=True)
class LayerTime:
    """Cost of one step of the executor's plan.

    Args:
        step: the step's layer name.
        layers: every layer the step runs (an InnerProduct and the ReLU fused into it).
        layer_type: HugeCTR type of the step's layer.
        seconds: measured time.
        flops: arithmetic work (see :func:`layer_flops`).
    """

    step: str
    layers: tuple[str, ...]
    layer_type: str
    seconds: float
    flops: int


@dataclass(frozen=True)
class ForwardProfile:
    """One profiled forward pass.

    Args:
        batch: samples in the batch.
        layers: one entry per plan step, in execution order.
        total_seconds: the whole pass, input checks and output conversion included.
        predictions: the float32 ``[batch, width]`` predictions the pass produced.
    """

    batch: int
    layers: tuple[LayerTime, ...]
    total_seconds: float
    predictions: Array

    @property
    def flops(self) -> int:
        """Arithmetic work of the whole pass."""
        return sum(layer.flops for layer in self.layers)

    @property
    def layer_seconds(self) -> float:
        """Sum of the per-layer times (at most :attr:`total_seconds`)."""
        return sum(layer.seconds for layer in self.layers)


class StepClock(Protocol):
    """Marks points of a forward pass; :meth:`intervals` gives the time between them."""

    def mark(self) -> None:
        """Record the current point of the pass."""

    def intervals(self) -> list[float]:
        """Seconds between consecutive marks (waits for the device first)."""


class HostClock:
    """Marks taken with ``time.perf_counter`` (NumPy: the work is done when a call returns)."""

    def __init__(self) -> None:
        self._marks: list[float] = []

    def mark(self) -> None:
        """Record the current time."""
        self._marks.append(time.perf_counter())

    def intervals(self) -> list[float]:
        """Seconds between consecutive marks."""
        return [b - a for a, b in zip(self._marks, self._marks[1:], strict=False)]


class CudaEventClock:
    """Marks recorded as CUDA events on the current stream, read after one synchronisation.

    Args:
        cupy: the ``cupy`` module.
    """

    def __init__(self, cupy: ModuleType) -> None:
        self._cupy = cupy
        self._events: list[Any] = []

    def mark(self) -> None:
        """Record an event on the current stream."""
        event = self._cupy.cuda.Event()
        event.record()
        self._events.append(event)

    def intervals(self) -> list[float]:
        """Seconds between consecutive events, once the last one has completed."""
        if not self._events:
            return []
        self._events[-1].synchronize()
        elapsed = self._cupy.cuda.get_elapsed_time
        pairs = zip(self._events, self._events[1:], strict=False)
        return [elapsed(a, b) / 1e3 for a, b in pairs]


def step_clock(xp: ModuleType) -> StepClock:
    """The clock that times work issued through ``xp``.

    Args:
        xp: ``numpy`` or ``cupy``.

    Returns:
        A :class:`CudaEventClock` for CuPy, a :class:`HostClock` otherwise.
    """
    return CudaEventClock(xp) if xp.__name__ == "cupy" else HostClock()
