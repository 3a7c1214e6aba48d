"""Activations (ReLU, Sigmoid, ELU, DIN's Dice, Softmax), Dropout (the identity at inference)
and loss layers.

At inference HugeCTR replaces ``BinaryCrossEntropyLoss`` and ``MultiCrossEntropyLoss`` by a
Sigmoid on their first bottom (the prediction), and ``CrossEntropyLoss`` by a Softmax; the
second bottom is the label, which inference does not have.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from hps_core.nn.layers.base import Array, Layer, expect_counts, expect_rank
from hps_core.nn.spec.network_json import LayerSpec
from hps_core.nn.spec.precision import ComputeContext
from hps_core.nn.spec.shapes import TensorShape


@dataclass(frozen=True)
class ReLU(Layer):
    """``max(x, 0)``."""

    type_names = ("ReLU",)
    output_shapes: tuple[TensorShape, ...]

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> ReLU:
        expect_counts(spec, inputs, 1)
        return cls((inputs[0],))

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        return (ctx.xp.maximum(inputs[0], 0),)


@dataclass(frozen=True)
class Sigmoid(Layer):
    """``1 / (1 + exp(-x))``, evaluated in float32 without overflow."""

    type_names = ("Sigmoid",)
    output_shapes: tuple[TensorShape, ...]

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> Sigmoid:
        expect_counts(spec, inputs, 1)
        return cls((inputs[0],))

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        if ctx.on_gpu:
            from hps_core.cuda.dense_ops import sigmoid

            return (sigmoid(inputs[0], ctx.dtype),)
        xp = ctx.xp
        x = ctx.widen(inputs[0])
        # exp(-|x|) never overflows; the two branches are the same function rearranged.
        e = xp.exp(-xp.abs(x))
        y = xp.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
        return (ctx.cast(y),)


@dataclass(frozen=True)
class LossAsSigmoid(Sigmoid):
    """A training loss layer, which inference turns into a Sigmoid on its prediction."""

    type_names = ("BinaryCrossEntropyLoss", "MultiCrossEntropyLoss")

    @classmethod
    def consumed_bottoms(cls, spec: LayerSpec) -> tuple[str, ...]:
        if len(spec.bottoms) != 2:
            raise spec.error(
                f"a loss layer needs 2 bottoms (prediction, label), got {len(spec.bottoms)}",
                "bottom",
            )
        return spec.bottoms[:1]


@dataclass(frozen=True)
class Dropout(Layer):
    """The identity: HugeCTR's dropout scales at training time, so inference passes through."""

    type_names = ("Dropout",)
    output_shapes: tuple[TensorShape, ...]

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> Dropout:
        expect_counts(spec, inputs, 1)
        rate = spec.float_field("rate", default=0.5)
        if not 0.0 <= rate < 1.0:
            raise spec.error(f"must be in [0, 1), got {rate}", "rate")
        return cls((inputs[0],))

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        return (inputs[0],)


@dataclass(frozen=True)
class ELU(Layer):
    """``alpha * (exp(x) - 1)`` where ``x < 0``, else ``x`` (HugeCTR ``elu_param.alpha``)."""

    type_names = ("ELU",)
    output_shapes: tuple[TensorShape, ...]
    alpha: float

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> ELU:
        expect_counts(spec, inputs, 1)
        return cls((inputs[0],), spec.float_field("elu_param.alpha"))

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        xp, x = ctx.xp, ctx.widen(inputs[0])
        # HugeCTR computes exp(x) - 1 (not expm1); so does this.
        y = xp.where(x < 0, np.float32(self.alpha) * (xp.exp(xp.minimum(x, 0)) - 1), x)
        return (ctx.cast(y),)


@dataclass(frozen=True)
class PReLUDice(Layer):
    """DIN's Dice activation: ``p * x + (1 - p) * alpha * x`` with
    ``p = sigmoid((x - mean) / sqrt(var + eps))``.

    As in HugeCTR (``PRelu_Dice_Layer::fprop``), the mean and the (population) variance
    ``E[x^2] - E[x]^2`` are taken per column over the rows of the batch being computed, at
    inference too: a sample's prediction depends on the other samples of its batch, and a
    batch of one sample gets ``0.5 * (1 + alpha) * x``. A padded batch's padding
    (``ctx.padded``) is left out of the statistics. Fields ``prelu_dice_param.alpha`` and
    ``eps`` (HugeCTR writes ``alpha`` but its own reader asks for ``elu_alpha``; both are read).
    """

    type_names = ("PReLU_Dice",)
    batch_dependent: ClassVar[bool] = True
    output_shapes: tuple[TensorShape, ...]
    alpha: float
    eps: float

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> PReLUDice:
        expect_counts(spec, inputs, 1)
        expect_rank(spec, inputs[0], (2,), 0)
        name = "alpha" if spec.has("prelu_dice_param.alpha") else "elu_alpha"
        alpha = spec.float_field(f"prelu_dice_param.{name}")
        return cls((inputs[0],), alpha, spec.float_field("prelu_dice_param.eps"))

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        count, per_sample = None, 1
        if ctx.padded is not None:
            count, per_sample = ctx.padded.count, ctx.padded.rows_per_sample(inputs[0].shape[0])
        if ctx.on_gpu:
            from hps_core.cuda.dense_ops import dice

            return (dice(inputs[0], self.alpha, self.eps, ctx.dtype, count, per_sample),)
        xp, x = ctx.xp, ctx.widen(inputs[0])
        real = x if count is None else x[: max(int(count[0]), 0) * per_sample]
        # No real row: means 0 (as on the GPU), not the NaN of an empty mean.
        mean = real.sum(axis=0, dtype=np.float32) / np.float32(max(real.shape[0], 1))
        square = (real * real).sum(axis=0, dtype=np.float32) / np.float32(max(real.shape[0], 1))
        # E[x^2] - E[x]^2 may round below zero (one sample, constant columns): a variance
        # is never negative, and sqrt of a negative one would be NaN.
        var = xp.maximum(square - mean * mean, 0)
        # exp overflowing to infinity (x far below the mean) gives p = 0, its limit.
        with np.errstate(over="ignore"):
            p = 1 / (1 + xp.exp((mean - x) / xp.sqrt(var + np.float32(self.eps))))
        return (ctx.cast(p * x + (1 - p) * np.float32(self.alpha) * x),)


@dataclass(frozen=True)
class Softmax(Layer):
    """Softmax over the last axis (HugeCTR ``SoftmaxLayer``; one bottom, any rank).

    HugeCTR exponentiates without subtracting the row maximum; the maximum is subtracted here,
    which gives the same values wherever HugeCTR's are finite. With two bottoms (scores and a
    mask, BST) the layer is :class:`~hps_core.nn.layers.attention.MaskedSoftmax`, whose
    ``factor`` scales the scores; with one, ``factor`` is ignored, as in HugeCTR.
    """

    type_names = ("Softmax",)
    output_shapes: tuple[TensorShape, ...]

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> Layer:
        if len(inputs) == 2:  # HugeCTR builds its MaskedSoftmaxLayer for two bottoms
            from hps_core.nn.layers.attention import MaskedSoftmax

            return MaskedSoftmax.build(spec, inputs)
        expect_counts(spec, inputs, 1)
        return cls((inputs[0],))

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        from hps_core.nn.layers.attention import softmax_last_axis

        return (ctx.cast(softmax_last_axis(ctx, ctx.widen(inputs[0]))),)


@dataclass(frozen=True)
class LossAsSoftmax(Softmax):
    """``CrossEntropyLoss``, which inference turns into a Softmax over its prediction's last
    axis (HugeCTR's removed inference parser did so)."""

    type_names = ("CrossEntropyLoss",)

    @classmethod
    def consumed_bottoms(cls, spec: LayerSpec) -> tuple[str, ...]:
        return LossAsSigmoid.consumed_bottoms(spec)

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> Layer:
        expect_counts(spec, inputs, 1)
        return cls((inputs[0],))
