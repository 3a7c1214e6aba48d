"""Feature-interaction layers: DLRM's dot Interaction, DeepFM's FmOrder2 and DIN's
MatrixMultiply."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hps_core.nn.layers.base import Array, Layer, expect_counts, expect_rank
from hps_core.nn.spec.network_json import LayerSpec
from hps_core.nn.spec.precision import ComputeContext, Precision
from hps_core.nn.spec.shapes import TensorShape


@dataclass(frozen=True)
class Interaction(Layer):
    """DLRM dot interaction, laid out as HugeCTR does.

    Inputs: the bottom MLP ``[R, D]`` and the embeddings ``[R, N, D]``. With the ``n = N + 1``
    vectors stacked (MLP first), the output row is the MLP vector, then the strictly lower
    triangle of their Gram matrix row by row (``G[1,0], G[2,0], G[2,1], G[3,0], ...``), then
    one zero of padding: width ``D + N(N+1)/2 + 1``.

    HugeCTR's FP16 training form gives the layer a second top (``interaction_grad``: the
    buffer its backward pass writes the MLP's gradient into), which the next MLP names as its
    second bottom and does not read forward (``HugeCTR/src/layers/interaction_layer.cu``;
    ``test/scripts/dlrm_fp16_1gpu.json`` and the MLPerf DLRM files). Inference gives that top
    the output's shape and never computes it: no layer reads it.
    """

    type_names = ("Interaction",)
    output_shapes: tuple[TensorShape, ...]
    num_vectors: int
    # Flat indices of the lower triangle, uploaded once per array module.
    _device_index: dict[str, Any] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> Interaction:
        expect_counts(spec, inputs, 2, n_out=None)
        if len(spec.tops) not in (1, 2):
            raise spec.error(
                f"needs 1 top (or 2 in HugeCTR's FP16 training form), got {len(spec.tops)}",
                "top",
            )
        mlp, emb = inputs
        expect_rank(spec, mlp, (2,), 0)
        expect_rank(spec, emb, (3,), 1)
        if mlp.rows_per_sample != emb.rows_per_sample or mlp.dims[0] != emb.dims[1]:
            raise spec.error(
                f"inputs must be [R, D] and [R, N, D], got '{spec.bottoms[0]}' {mlp} and "
                f"'{spec.bottoms[1]}' {emb}",
                "bottom",
            )
        n = emb.dims[0] + 1
        width = mlp.dims[0] + n * (n - 1) // 2 + 1
        return cls((TensorShape(mlp.rows_per_sample, (width,)),) * len(spec.tops), n)

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        xp = ctx.xp
        mlp, emb = inputs
        rows, n = mlp.shape[0], self.num_vectors
        if ctx.on_gpu:
            from hps_core.cuda import dense_ops

            if dense_ops.interaction_fits(n, mlp.shape[1]):
                tf32 = ctx.precision is Precision.TF32
                out = dense_ops.interaction(ctx.cast(mlp), ctx.cast(emb), tf32)
                return (out,) * len(self.output_shapes)
        stacked = xp.concatenate([mlp[:, None, :], emb], axis=1)
        gram = ctx.matmul(stacked, stacked.transpose(0, 2, 1)).reshape(rows, n * n)
        pairs = xp.take(gram, self._lower_triangle(xp), axis=1)
        padding = xp.zeros((rows, 1), dtype=pairs.dtype)
        out = xp.concatenate([ctx.cast(mlp), pairs, padding], axis=1)
        return (out,) * len(self.output_shapes)

    def _lower_triangle(self, xp: Any) -> Array:
        index = self._device_index.get(xp.__name__)
        if index is None:
            i, j = np.tril_indices(self.num_vectors, k=-1)
            index = xp.asarray(i * self.num_vectors + j)
            self._device_index[xp.__name__] = index
        return index


@dataclass(frozen=True)
class FmOrder2(Layer):
    """Second-order factorization machine: with the input seen as ``[R, slots, out_dim]``,
    ``0.5 * ((sum_i x_i)^2 - sum_i x_i^2)``."""

    type_names = ("FmOrder2",)
    output_shapes: tuple[TensorShape, ...]
    out_dim: int

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> FmOrder2:
        expect_counts(spec, inputs, 1)
        shape = inputs[0]
        expect_rank(spec, shape, (2,), 0)
        out_dim = spec.int_field("out_dim", minimum=1)
        if shape.dims[0] % out_dim:
            raise spec.error(
                f"input width {shape.dims[0]} is not a multiple of {out_dim}", "out_dim"
            )
        return cls((TensorShape(shape.rows_per_sample, (out_dim,)),), out_dim)

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        x = ctx.widen(inputs[0])
        x = x.reshape(x.shape[0], -1, self.out_dim)
        total = x.sum(axis=1)
        return (ctx.cast(0.5 * (total * total - (x * x).sum(axis=1))),)


@dataclass(frozen=True)
class MatrixMultiply(Layer):
    """Batched matrix product of two 3-D or 4-D inputs of one leading shape:
    ``[B, m, n] @ [B, n, k] -> [B, m, k]`` (HugeCTR ``MatrixMultiplyLayer``, float32 GEMMs;
    DIN's attention-weighted sum of the behaviour history). HugeCTR's 2-D forms multiply
    across the batch rows, which has no per-sample meaning at inference, and are refused."""

    type_names = ("MatrixMultiply",)
    output_shapes: tuple[TensorShape, ...]

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> MatrixMultiply:
        expect_counts(spec, inputs, 2)
        a, b = inputs
        expect_rank(spec, a, (3, 4), 0)
        if (
            b.rank != a.rank
            or b.rows_per_sample != a.rows_per_sample
            or b.dims[:-2] != a.dims[:-2]
            or b.dims[-2] != a.dims[-1]
        ):
            raise spec.error(
                f"inputs must be [B, ..., m, n] and [B, ..., n, k], got '{spec.bottoms[0]}' "
                f"{a} and '{spec.bottoms[1]}' {b}",
                "bottom",
            )
        return cls((TensorShape(a.rows_per_sample, (*a.dims[:-1], b.dims[-1])),))

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        a, b = inputs
        if a.ndim == 4:  # [B, H, m, n]: one batch of B * H products
            lead = a.shape[:2]
            a = a.reshape(-1, *a.shape[2:])
            b = b.reshape(-1, *b.shape[2:])
            return (ctx.matmul(a, b).reshape(*lead, a.shape[1], b.shape[2]),)
        return (ctx.matmul(a, b),)
