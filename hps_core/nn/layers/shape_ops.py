"""Layers that only move data: Reshape, Concat, Slice, Scale (repeat), DIN's
FusedReshapeConcat and FusedReshapeConcatGeneral, and Cast."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

from hps_core.nn.layers.base import Array, Layer, expect_counts, expect_rank
from hps_core.nn.spec.network_json import LayerSpec
from hps_core.nn.spec.precision import ComputeContext
from hps_core.nn.spec.shapes import TensorShape


def _one_kernel_concat(ctx: ComputeContext) -> ModuleType | None:
    """:mod:`hps_core.cuda.dense_ops` on a GPU (its concatenations take one kernel, not a copy
    per input), else None (NumPy's concatenate serves)."""
    if not ctx.on_gpu:
        return None
    from hps_core.cuda import dense_ops  # needs CuPy

    return dense_ops


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
        ops = _one_kernel_concat(ctx)
        out = ops.concatenate(inputs, self.axis) if ops else None  # one kernel, not n copies
        if out is not None:
            return (out,)
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


@dataclass(frozen=True)
class Scale(Layer):
    """HugeCTR's Scale: repeat a 2-D input ``factor`` times (``scale_param``).

    ``axis`` 0 repeats each element along the row (``[B, N] -> [B, N * factor]``), ``axis`` 1
    repeats each row (``[B, N] -> [B * factor, N]``): HugeCTR names the axes the other way
    round from NumPy (``ScaleLayer``'s ``upscale_kernel``). The factor is written as a float
    and truncated to an integer, as HugeCTR does.
    """

    type_names = ("Scale",)
    output_shapes: tuple[TensorShape, ...]
    axis: int
    factor: int

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> Scale:
        expect_counts(spec, inputs, 1)
        shape = inputs[0]
        expect_rank(spec, shape, (2,), 0)
        axis = spec.int_field("scale_param.axis", minimum=0)
        if axis > 1:
            raise spec.error(f"must be 0 or 1, got {axis}", "scale_param.axis")
        factor = int(spec.float_field("scale_param.factor"))
        if factor < 1:
            raise spec.error(f"must be at least 1, got {factor}", "scale_param.factor")
        if axis == 0:
            out = TensorShape(shape.rows_per_sample, (shape.dims[0] * factor,))
        else:
            out = TensorShape(shape.rows_per_sample * factor, shape.dims)
        return cls((out,), axis, factor)

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        return (ctx.xp.repeat(inputs[0], self.factor, axis=1 - self.axis),)


def _stacked(spec: LayerSpec, inputs: Sequence[TensorShape]) -> tuple[int, int]:
    """Slots and summed width of 3-D inputs ``[B, S, w_k]`` of one ``B`` and ``S``."""
    expect_counts(spec, inputs, None if len(inputs) != 1 else 1, n_out=None)
    for i, shape in enumerate(inputs):
        expect_rank(spec, shape, (3,), i)
        if shape.rows_per_sample != inputs[0].rows_per_sample or shape.dims[0] != inputs[0].dims[0]:
            raise spec.error(
                f"inputs must be [B, S, w] of one B and S, got '{spec.bottoms[0]}' "
                f"{inputs[0]} and '{spec.bottoms[i]}' {shape}",
                "bottom",
            )
    return inputs[0].dims[0], sum(shape.dims[1] for shape in inputs)


@dataclass(frozen=True)
class FusedReshapeConcat(Layer):
    """DIN's split of behaviour history from target: the 3-D inputs ``[B, S, w_k]`` are
    concatenated along the width, then slots ``0 .. S-2`` become rows ``[B * (S-1), W]``
    (top 0, the history) and slot ``S-1`` becomes ``[B, W]`` (top 1, the target), as
    HugeCTR's ``fused_reshape_concat_kernel`` lays them out."""

    type_names = ("FusedReshapeConcat",)
    output_shapes: tuple[TensorShape, ...]
    slots: int

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> FusedReshapeConcat:
        slots, width = _stacked(spec, inputs)
        if len(spec.tops) != 2:
            raise spec.error(f"needs 2 tops (history, target), got {len(spec.tops)}", "top")
        if slots < 2:
            raise spec.error(f"needs at least 2 slots (history and target), got {slots}")
        rows = inputs[0].rows_per_sample
        history = TensorShape(rows * (slots - 1), (width,))
        return cls((history, TensorShape(rows, (width,))), slots)

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        ops = _one_kernel_concat(ctx)
        split = ops.split_last_slot(inputs) if ops else None  # two kernels, not n + 2 copies
        if split is not None:
            return split
        stacked = ctx.xp.concatenate(list(inputs), axis=2)
        width = stacked.shape[2]
        history = stacked[:, : self.slots - 1, :].reshape(-1, width)
        return (history, ctx.xp.ascontiguousarray(stacked[:, self.slots - 1, :]))


@dataclass(frozen=True)
class FusedReshapeConcatGeneral(Layer):
    """3-D inputs ``[B, S, w_k]`` concatenated along the width and reshaped to
    ``[B * S, W]`` (HugeCTR ``FusedReshapeConcatGeneralLayer``)."""

    type_names = ("FusedReshapeConcatGeneral",)
    output_shapes: tuple[TensorShape, ...]

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> FusedReshapeConcatGeneral:
        slots, width = _stacked(spec, inputs)
        if len(spec.tops) != 1:
            raise spec.error(f"needs 1 top, got {len(spec.tops)}", "top")
        return cls((TensorShape(inputs[0].rows_per_sample * slots, (width,)),))

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        ops = _one_kernel_concat(ctx)
        stacked = ops.concatenate(inputs, 2) if ops else None
        if stacked is None:
            stacked = ctx.xp.concatenate(list(inputs), axis=2)
        return (stacked.reshape(-1, stacked.shape[2]),)


@dataclass(frozen=True)
class Cast(Layer):
    """HugeCTR's Cast between float32 and float16, whose direction follows the model's mixed
    precision setting, not the file. Here every tensor is already in the engine's storage
    dtype (:mod:`hps_core.nn.spec.precision`), so a Cast passes its input through."""

    type_names = ("Cast",)
    output_shapes: tuple[TensorShape, ...]

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> Cast:
        expect_counts(spec, inputs, 1)
        return cls((inputs[0],))

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        return (ctx.cast(inputs[0]),)
