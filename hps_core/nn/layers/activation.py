"""Element-wise activations, Dropout (the identity at inference) and loss layers.

At inference HugeCTR replaces ``BinaryCrossEntropyLoss`` and ``MultiCrossEntropyLoss`` by a
Sigmoid on their first bottom (the prediction); the second bottom is the label, which
inference does not have.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hps_core.nn.layers.base import Array, Layer, expect_counts
from hps_core.nn.network_json import LayerSpec
from hps_core.nn.precision import ComputeContext
from hps_core.nn.shapes import TensorShape


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
