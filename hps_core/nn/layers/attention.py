"""BST's attention layers: SequenceMask, the masked Softmax, MultiHeadAttention and LayerNorm.

Semantics are HugeCTR's (``HugeCTR/src/layers/{sequence_mask,masked_softmax,
multi_head_attention,layer_norm}_layer.cu``), including where they differ from its docs: the
mask is ``[B, 1, Sf, St]`` (query and key lengths), masked scores get ``-10000`` added (not
``-inf``) after scaling, the softmax denominator has ``+1e-6``, so a query row that is wholly
masked becomes the plain softmax over all keys, as in HugeCTR.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hps_core.nn.layers.base import Array, Layer, ParamShape, expect_counts, expect_rank
from hps_core.nn.spec.network_json import LayerSpec
from hps_core.nn.spec.precision import ComputeContext
from hps_core.nn.spec.shapes import TensorShape

MASKED_SCORE = np.float32(10000.0)
"""What HugeCTR subtracts from the score of a masked position."""
SOFTMAX_EPS = np.float32(1e-6)
"""What HugeCTR's masked softmax adds to its denominator."""


def masked_softmax(xp: object, scores: Array, mask: Array, factor: float) -> Array:
    """HugeCTR's masked softmax over the last axis, in float32.

    Args:
        xp: ``numpy`` or ``cupy``.
        scores: ``[B, H, Sf, St]``.
        mask: ``[B, 1, Sf, St]`` of 1 (keep) and 0 (mask), broadcast over heads.
        factor: scale of the scores.

    Returns:
        float32 of ``scores``'s shape.
    """
    z = scores * np.float32(factor) - (1 - mask) * MASKED_SCORE
    e = xp.exp(z - z.max(axis=-1, keepdims=True))
    return e / (e.sum(axis=-1, keepdims=True) + SOFTMAX_EPS)


def _masked_softmax(ctx: ComputeContext, scores: Array, mask: Array, factor: float) -> Array:
    """:func:`masked_softmax`, in one kernel on a GPU."""
    if ctx.on_gpu:
        from hps_core.cuda import dense_ops

        if dense_ops.fits_rows(scores) and dense_ops.fits_rows(mask):
            return dense_ops.softmax(scores, mask, factor, float(SOFTMAX_EPS))
    return masked_softmax(ctx.xp, scores, mask, factor)


@dataclass(frozen=True)
class SequenceMask(Layer):
    """``mask[b, 0, i, j] = i < len_from[b] and j < len_to[b]`` from two ``[B, 1]`` length
    inputs (float, truncated to integers), ``[B, 1, max_sequence_len_from,
    max_sequence_len_to]``."""

    type_names = ("SequenceMask",)
    output_shapes: tuple[TensorShape, ...]
    len_from: int
    len_to: int

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> SequenceMask:
        expect_counts(spec, inputs, 2)
        for i, shape in enumerate(inputs):
            if shape.rank != 2 or shape.dims != (1,) or shape.rows_per_sample != 1:
                raise spec.error(
                    f"input '{spec.bottoms[i]}' must be [B, 1] lengths, got {shape}", "bottom"
                )
        len_from = spec.int_field("max_sequence_len_from", minimum=1)
        len_to = spec.int_field("max_sequence_len_to", minimum=1)
        return cls((TensorShape(1, (1, len_from, len_to)),), len_from, len_to)

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        xp = ctx.xp
        lengths = [ctx.widen(x).reshape(-1).astype(np.int32) for x in inputs]
        rows = xp.arange(self.len_from, dtype=np.int32)[None, :, None] < lengths[0][:, None, None]
        cols = xp.arange(self.len_to, dtype=np.int32)[None, None, :] < lengths[1][:, None, None]
        return (ctx.cast((rows & cols)[:, None, :, :]),)


def softmax_last_axis(ctx: ComputeContext, x: Array) -> Array:
    """Softmax over the last axis in float32 (the maximum subtracted first), in one kernel on a
    GPU."""
    if ctx.on_gpu:
        from hps_core.cuda import dense_ops

        if dense_ops.fits_rows(x):
            return dense_ops.softmax(x)
    e = ctx.xp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@dataclass(frozen=True)
class MaskedSoftmax(Layer):
    """HugeCTR's Softmax with two bottoms: scores ``[B, H, Sf, St]`` and a mask
    ``[B, 1, Sf, St]`` (see :func:`masked_softmax`; ``factor`` scales the scores)."""

    type_names = ()  # built by Softmax when it has two bottoms
    output_shapes: tuple[TensorShape, ...]
    factor: float

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> MaskedSoftmax:
        expect_counts(spec, inputs, 2)
        scores, mask = inputs
        expect_rank(spec, scores, (4,), 0)
        if mask.rank != 4 or mask.dims != (1, *scores.dims[1:]):
            raise spec.error(
                f"the mask must be [B, 1, {scores.dims[1]}, {scores.dims[2]}] for scores "
                f"{scores}, got {mask}",
                "bottom",
            )
        return cls((scores,), spec.float_field("factor", default=1.0))

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        scores, mask = (ctx.widen(x) for x in inputs)
        return (ctx.cast(_masked_softmax(ctx, scores, mask, self.factor)),)


@dataclass(frozen=True)
class MultiHeadAttention(Layer):
    """Scaled dot-product attention over ``num_attention_heads`` heads, without projections
    (models add InnerProducts around it): Q ``[B, Sf, D]``, K and V ``[B, St, D]``, an optional
    mask ``[B, 1, Sf, St]``; heads split the hidden axis head-major (``d = D / H``), scores
    ``Q K^T / sqrt(d)``, (masked) softmax over the keys, heads merged back: ``[B, Sf, D]``.
    ``transpose_b`` is ignored, as HugeCTR ignores it."""

    type_names = ("MultiHeadAttention",)
    output_shapes: tuple[TensorShape, ...]
    heads: int

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> MultiHeadAttention:
        if len(inputs) not in (3, 4):
            raise spec.error(f"needs 3 or 4 bottoms (Q, K, V, mask), got {len(inputs)}", "bottom")
        if len(spec.tops) != 1:
            raise spec.error(f"needs 1 top, got {len(spec.tops)}", "top")
        q, k, v = inputs[:3]
        for i, shape in enumerate((q, k, v)):
            expect_rank(spec, shape, (3,), i)
        heads = spec.int_field("num_attention_heads", default=1, minimum=1)
        width = q.dims[1]
        if k.dims != v.dims or k.dims[1] != width or width % heads:
            raise spec.error(
                f"Q, K, V must be [B, Sf, D], [B, St, D], [B, St, D] with D a multiple of "
                f"{heads} heads, got {q}, {k}, {v}",
                "bottom",
            )
        if len(inputs) == 4 and inputs[3].dims != (1, q.dims[0], k.dims[0]):
            raise spec.error(
                f"the mask must be [B, 1, {q.dims[0]}, {k.dims[0]}], got {inputs[3]}", "bottom"
            )
        return cls((q,), heads)

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        q, k, v = inputs[:3]
        batch, s_from, width = q.shape
        s_to, heads = k.shape[1], self.heads
        d = width // heads

        def split(x: Array, steps: int) -> Array:  # [B, S, D] -> [B * H, S, d]
            return x.reshape(batch, steps, heads, d).transpose(0, 2, 1, 3).reshape(-1, steps, d)

        qh, kh, vh = split(q, s_from), split(k, s_to), split(v, s_to)
        scores = ctx.widen(ctx.matmul(qh, kh.transpose(0, 2, 1))) * np.float32(1 / np.sqrt(d))
        scores = scores.reshape(batch, heads, s_from, s_to)
        if len(inputs) == 4:
            probs = _masked_softmax(ctx, scores, ctx.widen(inputs[3]), 1.0)
        else:
            probs = softmax_last_axis(ctx, scores)
        out = ctx.matmul(ctx.cast(probs).reshape(-1, s_from, s_to), vh)
        merged = out.reshape(batch, heads, s_from, d).transpose(0, 2, 1, 3)
        return (ctx.xp.ascontiguousarray(merged).reshape(batch, s_from, width),)


@dataclass(frozen=True)
class LayerNorm(Layer):
    """``(x - mean) / sqrt(var + eps) * gamma + beta`` over the last axis (biased variance,
    float32; ``ln_param.eps`` required, as HugeCTR's reader requires it).

    Dense file: ``gamma [N]`` then ``beta [N]`` (HugeCTR ``set_weight(0, {N, 1})``,
    ``set_weight(1, {N, 1})``; NVIDIA's hugectr2onnx loader reads the same)."""

    type_names = ("LayerNorm",)
    trainable = True
    output_shapes: tuple[TensorShape, ...]
    width: int
    eps: float

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> LayerNorm:
        expect_counts(spec, inputs, 1)
        expect_rank(spec, inputs[0], (2, 3, 4), 0)
        return cls((inputs[0],), inputs[0].dims[-1], spec.float_field("ln_param.eps"))

    def param_shapes(self) -> tuple[ParamShape, ...]:
        return (ParamShape("gamma", (self.width, 1)), ParamShape("beta", (self.width, 1)))

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        xp, x = ctx.xp, ctx.widen(inputs[0])
        gamma, beta = (ctx.widen(p).reshape(-1) for p in params)
        if ctx.on_gpu:
            from hps_core.cuda import dense_ops

            if dense_ops.fits_rows(x):
                return (ctx.cast(dense_ops.layer_norm(x, gamma, beta, self.eps)),)
        mean = x.mean(axis=-1, keepdims=True)
        centred = x - mean
        var = (centred * centred).mean(axis=-1, keepdims=True)
        y = centred / xp.sqrt(var + np.float32(self.eps)) * gamma + beta
        return (ctx.cast(y),)
