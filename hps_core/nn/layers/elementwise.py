"""Layers that combine inputs element by element or reduce along an axis:
Add, Sub, ElementwiseMultiply (HugeCTR's former DotProduct), ReduceSum and ReduceMean."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hps_core.nn.layers.base import Array, Layer, expect_counts, expect_same_shapes
from hps_core.nn.spec.network_json import LayerSpec
from hps_core.nn.spec.precision import ComputeContext
from hps_core.nn.spec.shapes import TensorShape


@dataclass(frozen=True)
class Add(Layer):
    """Sum of two or more inputs of the same shape."""

    type_names = ("Add",)
    output_shapes: tuple[TensorShape, ...]

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> Add:
        expect_counts(spec, inputs, None)
        expect_same_shapes(spec, inputs)
        return cls((inputs[0],))

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        total = ctx.widen(inputs[0]) + ctx.widen(inputs[1])
        for x in inputs[2:]:
            total += x
        return (ctx.cast(total),)


@dataclass(frozen=True)
class Sub(Layer):
    """``bottom[0] - bottom[1]``, two inputs of the same shape (no broadcasting)."""

    type_names = ("Sub",)
    output_shapes: tuple[TensorShape, ...]

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> Sub:
        expect_counts(spec, inputs, 2)
        expect_same_shapes(spec, inputs)
        return cls((inputs[0],))

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        return (ctx.cast(ctx.widen(inputs[0]) - ctx.widen(inputs[1])),)


@dataclass(frozen=True)
class ElementwiseMultiply(Layer):
    """Product of two or more inputs of the same shape. ``DotProduct`` is its name in HugeCTR
    before 22.02 (renamed without change of behaviour), and still in older network files."""

    type_names = ("ElementwiseMultiply", "DotProduct")
    output_shapes: tuple[TensorShape, ...]

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> ElementwiseMultiply:
        expect_counts(spec, inputs, None)
        expect_same_shapes(spec, inputs)
        return cls((inputs[0],))

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        product = ctx.widen(inputs[0]) * ctx.widen(inputs[1])
        for x in inputs[2:]:
            product *= x
        return (ctx.cast(product),)


@dataclass(frozen=True)
class ReduceSum(Layer):
    """Sum along ``axis`` keeping it with size 1 (axis 0, the batch, is refused)."""

    type_names = ("ReduceSum",)
    output_shapes: tuple[TensorShape, ...]
    axis: int

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> ReduceSum:
        return cls(*_reduced(spec, inputs))

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        return (ctx.cast(ctx.sum(inputs[0], axis=self.axis, keepdims=True)),)


@dataclass(frozen=True)
class ReduceMean(Layer):
    """Mean along ``axis`` (default 1) keeping it with size 1, accumulated in float32; 2-D and
    3-D inputs as in HugeCTR; axis 0, the batch, is refused."""

    type_names = ("ReduceMean",)
    output_shapes: tuple[TensorShape, ...]
    axis: int

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> ReduceMean:
        if inputs and inputs[0].rank > 3:
            raise spec.error(f"input must be 2-D or 3-D, got {inputs[0]}", "bottom")
        # HugeCTR's Python API defaults the axis to 1; older hand-written network files (its
        # test/scripts/din_fp32_1gpu.json) omit it.
        return cls(*_reduced(spec, inputs, default_axis=1))

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        total = ctx.sum(inputs[0], axis=self.axis, keepdims=True)
        return (ctx.cast(total / np.float32(inputs[0].shape[self.axis])),)


def _reduced(
    spec: LayerSpec, inputs: Sequence[TensorShape], default_axis: int | None = None
) -> tuple[tuple[TensorShape], int]:
    """Output shape and axis of a reduction along the field ``axis`` (required unless a
    default is given)."""
    expect_counts(spec, inputs, 1)
    shape = inputs[0]
    if default_axis is None:
        axis = spec.int_field("axis", minimum=0)
    else:
        axis = spec.int_field("axis", default=default_axis, minimum=0)
    if axis == 0:
        raise spec.error("axis 0 reduces over the batch, which inference cannot do", "axis")
    if axis >= shape.rank:
        raise spec.error(f"axis {axis} out of range for input {shape}", "axis")
    dims = tuple(1 if i == axis else d for i, d in enumerate(shape.dims, start=1))
    return (TensorShape(shape.rows_per_sample, dims),), axis
