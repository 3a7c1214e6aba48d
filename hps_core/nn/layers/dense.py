"""Layers with trainable parameters: InnerProduct, MultiCross and WeightMultiply.

Parameter shapes and their order are HugeCTR's, which is how the dense model file lays them
out: InnerProduct ``weight [in, out]`` then ``bias [1, out]``; MultiCross per cross layer
``w [1, D]``, ``b [1, D]`` (DCN v1) or ``U [D, P]``, ``V [P, D]``, ``b [1, D]`` (DCN v2,
``projection_dim`` P > 0); WeightMultiply ``weight [slots, vec]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hps_core.nn.layers.base import Array, Layer, ParamShape, expect_counts, expect_rank
from hps_core.nn.network_json import LayerSpec
from hps_core.nn.precision import ComputeContext
from hps_core.nn.shapes import TensorShape


@dataclass(frozen=True)
class InnerProduct(Layer):
    """``x @ weight + bias`` over the last axis (2-D or 3-D input), optionally fused with ReLU.

    ``fuse_relu`` is set by the executor when the only consumer of the output is a ReLU, so
    the activation is applied in place instead of in a separate pass.
    """

    type_names = ("InnerProduct",)
    trainable = True
    output_shapes: tuple[TensorShape, ...]
    in_features: int
    out_features: int
    fuse_relu: bool = False

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> InnerProduct:
        expect_counts(spec, inputs, 1)
        shape = inputs[0]
        expect_rank(spec, shape, (2, 3), 0)
        out_features = spec.int_field("fc_param.num_output", minimum=1)
        out = TensorShape(shape.rows_per_sample, (*shape.dims[:-1], out_features))
        return cls((out,), shape.dims[-1], out_features)

    def param_shapes(self) -> tuple[ParamShape, ...]:
        return (
            ParamShape("weight", (self.in_features, self.out_features)),
            ParamShape("bias", (1, self.out_features)),
        )

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        weight, bias = params
        y = ctx.matmul(inputs[0], weight)
        if ctx.on_gpu:
            from hps_core.gpu.dense_ops import bias_activation

            return (bias_activation(y, ctx.cast(bias), self.fuse_relu),)
        # In place on the product, which is in the storage dtype: under FP16 each element is
        # added in float32 and rounded once (the fused GPU kernel does the same).
        y += ctx.cast(bias)
        if self.fuse_relu:
            ctx.xp.maximum(y, 0, out=y)
        return (y,)


@dataclass(frozen=True)
class MultiCross(Layer):
    """DCN cross network: ``x_{l+1} = x0 * (x_l . w_l) + x_l + b_l`` (v1) or
    ``x_{l+1} = x0 * (x_l @ U_l @ V_l + b_l) + x_l`` (v2), accumulated in float32."""

    type_names = ("MultiCross",)
    trainable = True
    output_shapes: tuple[TensorShape, ...]
    width: int
    num_layers: int
    projection_dim: int

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> MultiCross:
        expect_counts(spec, inputs, 1)
        expect_rank(spec, inputs[0], (2,), 0)
        num_layers = spec.int_field("mc_param.num_layers", minimum=1)
        projection_dim = spec.int_field("mc_param.projection_dim", default=0, minimum=0)
        return cls((inputs[0],), inputs[0].dims[0], num_layers, projection_dim)

    def param_shapes(self) -> tuple[ParamShape, ...]:
        d, p = self.width, self.projection_dim
        shapes: list[ParamShape] = []
        for i in range(self.num_layers):
            if p:
                shapes += [ParamShape(f"U{i}", (d, p)), ParamShape(f"V{i}", (p, d))]
            else:
                shapes.append(ParamShape(f"w{i}", (1, d)))
            shapes.append(ParamShape(f"b{i}", (1, d)))
        return tuple(shapes)

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        x0 = ctx.widen(inputs[0])
        xl = x0
        per_layer = 3 if self.projection_dim else 2
        for i in range(self.num_layers):
            p = params[i * per_layer : (i + 1) * per_layer]
            bias = ctx.widen(p[-1])
            if self.projection_dim:
                xl = x0 * (ctx.matmul(ctx.matmul(xl, p[0]), p[1]) + bias) + xl
            else:
                xl = x0 * ctx.matmul(xl, p[0].T) + xl + bias
        return (ctx.cast(xl),)


@dataclass(frozen=True)
class WeightMultiply(Layer):
    """``out[r, i * vec + j] = x[r, i] * weight[i, j]``: each feature scales its own vector."""

    type_names = ("WeightMultiply",)
    trainable = True
    output_shapes: tuple[TensorShape, ...]
    slots: int
    vec_size: int

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> WeightMultiply:
        expect_counts(spec, inputs, 1)
        shape = inputs[0]
        expect_rank(spec, shape, (2,), 0)
        dims = spec.int_list_field("weight_dims", minimum=1)
        if len(dims) != 2 or dims[0] != shape.dims[0]:
            raise spec.error(
                f"must be [{shape.dims[0]}, vec_size] for input {shape}, got {list(dims)}",
                "weight_dims",
            )
        out = TensorShape(shape.rows_per_sample, (dims[0] * dims[1],))
        return cls((out,), dims[0], dims[1])

    def param_shapes(self) -> tuple[ParamShape, ...]:
        return (ParamShape("weight", (self.slots, self.vec_size)),)

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        x = inputs[0]
        out = x[:, :, None] * params[0][None, :, :]
        return (out.reshape(x.shape[0], self.slots * self.vec_size),)
