"""Layers that only move data: Reshape, Concat and Slice."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hps_core.nn.layers.base import Array, Layer, expect_counts, expect_rank
from hps_core.nn.network_json import LayerSpec
from hps_core.nn.precision import ComputeContext
from hps_core.nn.shapes import TensorShape


@dataclass(frozen=True)
class Reshape(Layer):
    """HugeCTR's Reshape: row-major reshape to ``(-1, leading_dim)`` or
    ``(-1, time_step, leading_dim)``, or, with ``selected``, picking slots of a 3-D input.

    A reshape whose rows would hold parts of two samples is refused: its result would depend
    on the batch size.
    """

    type_names = ("Reshape",)
    output_shapes: tuple[TensorShape, ...]
    selected: tuple[int, ...] | None = None

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> Reshape:
        expect_counts(spec, inputs, 1)
        shape = inputs[0]
        if spec.has("selected"):
            return cls._build_selected(spec, shape)
        leading = spec.int_field("leading_dim", default=shape.row_size, minimum=1)
        time_step = spec.int_field("time_step", default=0, minimum=0)
        per_row = leading * max(time_step, 1)
        if shape.sample_size % per_row:
            raise spec.error(
                f"input {shape} has {shape.sample_size} elements per sample, not a multiple of "
                f"{per_row}; the reshape would mix samples",
                "leading_dim",
            )
        dims = (time_step, leading) if time_step else (leading,)
        return cls((TensorShape(shape.sample_size // per_row, dims),))

    @classmethod
    def _build_selected(cls, spec: LayerSpec, shape: TensorShape) -> Reshape:
        expect_rank(spec, shape, (3,), 0)
        slots, width = shape.dims
        everything = spec.raw["selected"] == []
        selected = tuple(range(slots)) if everything else spec.int_list_field("selected", 0)
        if max(selected) >= slots:
            raise spec.error(f"slot {max(selected)} out of range for input {shape}", "selected")
        out = TensorShape(shape.rows_per_sample, (len(selected) * width,))
        return cls((out,), selected)

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        x = inputs[0]
        if self.selected is not None:
            x = x[:, list(self.selected), :]
        return (x.reshape(-1, *self.output_shapes[0].dims),)


@dataclass(frozen=True)
class Concat(Layer):
    """Concatenation along the feature axis (2-D) or along ``axis`` 1 or 2 (3-D)."""

    type_names = ("Concat",)
    output_shapes: tuple[TensorShape, ...]
    axis: int

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> Concat:
        expect_counts(spec, inputs, None)
        first = inputs[0]
        expect_rank(spec, first, (2, 3), 0)
        # HugeCTR ignores 'axis' for 2-D inputs; 3-D inputs default to axis 1.
        axis = 1 if first.rank == 2 else spec.int_field("axis", default=1)
        if axis not in (1, 2):
            raise spec.error(f"must be 1 or 2 for 3-D inputs, got {axis}", "axis")
        for name, shape in zip(spec.bottoms, inputs, strict=True):
            same_rows = shape.rows_per_sample == first.rows_per_sample
            kept = [d for i, d in enumerate(shape.dims, start=1) if i != axis]
            first_kept = [d for i, d in enumerate(first.dims, start=1) if i != axis]
            if shape.rank != first.rank or not same_rows or kept != first_kept:
                raise spec.error(
                    f"cannot concatenate '{spec.bottoms[0]}' {first} and '{name}' {shape} "
                    f"along axis {axis}",
                    "bottom",
                )
        dims = list(first.dims)
        dims[axis - 1] = sum(shape.dims[axis - 1] for shape in inputs)
        return cls((TensorShape(first.rows_per_sample, tuple(dims)),), axis)

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        return (ctx.xp.concatenate(list(inputs), axis=self.axis),)


@dataclass(frozen=True)
class Slice(Layer):
    """Column ranges ``[start, end)`` of a 2-D input, one top per range (ranges may overlap)."""

    type_names = ("Slice",)
    output_shapes: tuple[TensorShape, ...]
    ranges: tuple[tuple[int, int], ...]

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> Slice:
        expect_counts(spec, inputs, 1, n_out=None)
        shape = inputs[0]
        expect_rank(spec, shape, (2,), 0)
        ranges = spec.int_pairs_field("ranges")
        width = shape.dims[0]
        for start, end in ranges:
            if not 0 <= start < end <= width:
                raise spec.error(f"range [{start}, {end}) is not inside [0, {width})", "ranges")
        if len(spec.tops) != len(ranges):
            raise spec.error(
                f"needs one top per range ({len(ranges)}), got {len(spec.tops)}", "top"
            )
        outs = tuple(TensorShape(shape.rows_per_sample, (end - start,)) for start, end in ranges)
        return cls(outs, ranges)

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        x = inputs[0]
        return tuple(x[:, start:end] for start, end in self.ranges)
