"""Layers with trainable parameters: InnerProduct, FusedInnerProduct, MLP, MultiCross and
WeightMultiply.

Parameter shapes and their order are HugeCTR's, which is how the dense model file lays them
out (float32 whatever the training precision): InnerProduct and FusedInnerProduct
``weight [in, out]`` then ``bias [1, out]``; MLP the same pair for each of its layers in turn;
MultiCross per cross layer ``w [1, D]``, ``b [1, D]`` (DCN v1) or ``U [D, P]``, ``V [P, D]``,
``b [1, D]`` (DCN v2, ``projection_dim`` P > 0); WeightMultiply ``weight [slots, vec]``;
BatchNorm ``gamma [C]`` then ``beta [C]`` (its running statistics are in the ``.ntp.json``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hps_core.nn.layers.base import Array, Layer, ParamShape, expect_counts, expect_rank
from hps_core.nn.spec.network_json import LayerSpec
from hps_core.nn.spec.precision import ComputeContext, Precision
from hps_core.nn.spec.shapes import TensorShape


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
        return _weight_and_bias(self.in_features, self.out_features)

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        weight, bias = params
        return (_affine(ctx, inputs[0], weight, bias, self.fuse_relu),)


def _weight_and_bias(n_in: int, n_out: int) -> tuple[ParamShape, ParamShape]:
    """A fully connected layer's tensors as HugeCTR stores them: ``[in, out]``, ``[1, out]``."""
    return ParamShape("weight", (n_in, n_out)), ParamShape("bias", (1, n_out))


def _affine(ctx: ComputeContext, x: Array, weight: Array, bias: Array | None, relu: bool) -> Array:
    """``x @ weight (+ bias)``, then ReLU if asked; each element rounded once to the storage
    dtype after the bias is added in float32 (on a GPU, one kernel: :func:`_gpu_affine`)."""
    if ctx.on_gpu:
        rows = x.reshape(-1, x.shape[-1])
        y = _gpu_affine(ctx, rows, weight, bias, relu)
        return y.reshape(*x.shape[:-1], weight.shape[-1])
    y = ctx.matmul(x, weight)
    if bias is not None:
        y += ctx.cast(bias)
    if relu:
        ctx.xp.maximum(y, 0, out=y)
    return y


_ACTIVATIONS = {"Relu": True, "None": False}


@dataclass(frozen=True)
class FusedInnerProduct(Layer):
    """HugeCTR's FusedInnerProduct (``FusedReluBiasFullyConnectedLayer``, FP16 training):
    ``act(x @ weight + bias)``, ``act`` from the layer's ``activation`` ("Relu", HugeCTR's
    default, or "None").

    In training form the layer also passes ReLU masks and bias gradients between neighbours:
    bottoms after the first and tops after the first exist only for that and are not read at
    inference (the extra tops get the output's shape). Weights as InnerProduct (HugeCTR
    ``set_weight(0, {in, out})``, ``set_weight(1, {1, out})``; NVIDIA's ``hugectr2onnx`` loader
    reads them the same way).
    """

    type_names = ("FusedInnerProduct",)
    trainable = True
    output_shapes: tuple[TensorShape, ...]
    in_features: int
    out_features: int
    relu: bool

    @classmethod
    def consumed_bottoms(cls, spec: LayerSpec) -> tuple[str, ...]:
        return spec.bottoms[:1]

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> FusedInnerProduct:
        expect_counts(spec, inputs, 1, n_out=None)
        shape = inputs[0]
        expect_rank(spec, shape, (2,), 0)
        out_features = spec.int_field("fc_param.num_output", minimum=1)
        relu = _activation(spec, "activation", spec.raw.get("activation", "Relu"))
        out = TensorShape(shape.rows_per_sample, (out_features,))
        return cls((out,) * len(spec.tops), shape.dims[0], out_features, relu)

    def param_shapes(self) -> tuple[ParamShape, ...]:
        return _weight_and_bias(self.in_features, self.out_features)

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        y = _affine(ctx, inputs[0], params[0], params[1], self.relu)
        return (y,) * len(self.output_shapes)


def _activation(spec: LayerSpec, field: str, value: object) -> bool:
    if value not in _ACTIVATIONS:
        raise spec.error(f"must be 'Relu' or 'None', got {value!r}", field)
    return _ACTIVATIONS[value]


@dataclass(frozen=True)
class MLP(Layer):
    """HugeCTR's fused MLP layer: fully connected layers in a row,
    ``y_i = act_i(y_{i-1} @ W_i + b_i)``.

    Fields (``mlp_param``, as HugeCTR's parser reads them): ``num_outputs`` (widths, required;
    the output is the last; ``num_output`` is written by HugeCTR but not used by its layer),
    ``activations`` (per layer "Relu" or "None") or ``activation`` (all layers; default
    "Relu"), ``biases`` (per layer) or ``use_bias`` (all layers; default true). A second bottom
    (the training form's ReLU mask) is not read.

    Dense file: ``W_0 [in, out_0]``, ``b_0 [1, out_0]``, ``W_1``, ``b_1``, ...: HugeCTR's
    ``MLPLayer`` calls ``set_weight(2i, {in, out})`` and ``set_weight(2i + 1, {1, out})`` for
    layer ``i`` (``HugeCTR/src/layers/mlp_layer.cu``), and a bias is allocated, hence stored,
    even for a layer without one (then it is not added).
    """

    type_names = ("MLP",)
    trainable = True
    output_shapes: tuple[TensorShape, ...]
    widths: tuple[int, ...]  # input width, then each layer's output width
    relus: tuple[bool, ...]
    biases: tuple[bool, ...]

    @classmethod
    def consumed_bottoms(cls, spec: LayerSpec) -> tuple[str, ...]:
        return spec.bottoms[:1]

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> MLP:
        expect_counts(spec, inputs, 1)
        shape = inputs[0]
        expect_rank(spec, shape, (2,), 0)
        outputs = spec.int_list_field("mlp_param.num_outputs", minimum=1)
        relus = cls._per_layer(spec, "activations", "activation", "Relu", len(outputs))
        biases = cls._per_layer(spec, "biases", "use_bias", True, len(outputs))
        out = TensorShape(shape.rows_per_sample, (outputs[-1],))
        return cls((out,), (shape.dims[0], *outputs), relus, biases)

    @staticmethod
    def _per_layer(
        spec: LayerSpec, many: str, one: str, default: object, layers: int
    ) -> tuple[bool, ...]:
        param = spec.raw.get("mlp_param", {})
        is_act = many == "activations"
        if many in param:
            values = param[many]
            if not isinstance(values, list) or len(values) != layers:
                raise spec.error(
                    f"must be a list of {layers} values (one per layer of num_outputs), "
                    f"got {values!r}",
                    f"mlp_param.{many}",
                )
        else:
            values = [param.get(one, default)] * layers
        field = f"mlp_param.{many if many in param else one}"
        if is_act:
            return tuple(_activation(spec, field, v) for v in values)
        if not all(isinstance(v, bool) for v in values):
            raise spec.error(
                f"must be true or false, got {param.get(many, param.get(one))!r}", field
            )
        return tuple(values)

    def param_shapes(self) -> tuple[ParamShape, ...]:
        shapes: list[ParamShape] = []
        for i, (n_in, n_out) in enumerate(zip(self.widths[:-1], self.widths[1:], strict=True)):
            shapes += [ParamShape(f"W{i}", (n_in, n_out)), ParamShape(f"b{i}", (1, n_out))]
        return tuple(shapes)

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        y = inputs[0]
        for i, (relu, bias) in enumerate(zip(self.relus, self.biases, strict=True)):
            y = _affine(ctx, y, params[2 * i], params[2 * i + 1] if bias else None, relu)
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
            if self.projection_dim:
                y = _product(ctx, _product(ctx, xl, p[0]), p[1])
            else:
                y = _product(ctx, xl, p[0].T)
            if ctx.on_gpu:
                from hps_core.cuda.dense_ops import cross_combine

                # Products on cuBLAS, the rest of the layer in one pass over [B, D].
                xl = cross_combine(x0, y, p[-1], xl, bool(self.projection_dim))
            elif self.projection_dim and y.dtype == x0.dtype:
                # The same operations in the same order, in the product's own [B, D] array
                # (no temporaries; a narrower product is widened as it goes, below).
                y += ctx.widen(p[-1])
                y *= x0
                y += xl
                xl = y
            elif self.projection_dim:
                xl = x0 * (y + ctx.widen(p[-1])) + xl
            else:
                xl = x0 * y + xl + ctx.widen(p[-1])
        return (ctx.cast(xl),)


def _product(ctx: ComputeContext, x: Array, weight: Array) -> Array:
    """``x @ weight`` (2-D) in the storage dtype: on a GPU as :func:`_gpu_affine`; else
    ``ctx.matmul``."""
    if ctx.on_gpu:
        return _gpu_affine(ctx, x, weight, None, False)
    return ctx.matmul(x, weight)


def _gpu_affine(
    ctx: ComputeContext, x: Array, weight: Array, bias: Array | None, relu: bool
) -> Array:
    """``relu(x @ weight + bias)`` of 2-D ``x`` on a GPU: for one output column (a model's last
    layer, DCN v1's cross weight) ``row_dot``, a warp per row, rounding its operands as
    ``ComputeContext.matmul`` rounds them; else one cuBLASLt call with the bias and ReLU in its
    epilogue, whose large FP32 products run as 3xTF32 (:mod:`hps_core.cuda.linear`).

    Batches of one to eight samples take cuBLASLt's timed algorithms too: inside a CUDA graph on
    the H200 they ran DLRM-v2's products of one row in 1.9-9.8 us, where a kernel of our own
    that spread the weights over every SM took 2.3-11 us (``benchmarks/few_row_products.py``)."""
    cast_bias = None if bias is None else ctx.cast(bias)
    from hps_core.cuda.dense_ops import row_dot

    if weight.shape[-1] == 1:
        tf32 = ctx.precision is Precision.TF32
        return row_dot(ctx.cast(x), ctx.cast(weight), cast_bias, relu, tf32)
    from hps_core.cuda.linear import linear

    return linear(ctx.cast(x), ctx.cast(weight), cast_bias, relu, ctx.precision.value)


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


@dataclass(frozen=True)
class BatchNorm(Layer):
    """Batch normalisation in inference form: per column
    ``gamma * (x - running_mean) / sqrt(running_var + eps) + beta`` (HugeCTR
    ``BatchNormLayer::fprop`` with ``is_train=false``, cuDNN per-activation mode).

    ``bn_param.eps`` and ``bn_param.factor`` are required, as HugeCTR's reader requires them
    (the factor only matters in training). Dense file: ``gamma`` then ``beta``
    (``set_weight(0, {C, 1})``, ``set_weight(1, {C, 1})``); the running mean and variance come
    from the dense file's ``.ntp.json``, where HugeCTR prints them with six decimals.
    """

    type_names = ("BatchNorm",)
    trainable = True
    output_shapes: tuple[TensorShape, ...]
    width: int
    eps: float

    @classmethod
    def build(cls, spec: LayerSpec, inputs: Sequence[TensorShape]) -> BatchNorm:
        expect_counts(spec, inputs, 1)
        expect_rank(spec, inputs[0], (2,), 0)
        spec.float_field("bn_param.factor")
        return cls((inputs[0],), inputs[0].dims[0], spec.float_field("bn_param.eps"))

    def param_shapes(self) -> tuple[ParamShape, ...]:
        return (ParamShape("gamma", (self.width, 1)), ParamShape("beta", (self.width, 1)))

    def state_shapes(self) -> tuple[ParamShape, ...]:
        return (ParamShape("mean", (self.width,)), ParamShape("var", (self.width,)))

    def forward(
        self, ctx: ComputeContext, inputs: Sequence[Array], params: Sequence[Array]
    ) -> tuple[Array, ...]:
        gamma, beta, mean, var = (ctx.widen(p).reshape(-1) for p in params)
        scale = gamma / ctx.xp.sqrt(var + np.float32(self.eps))
        return (ctx.cast((ctx.widen(inputs[0]) - mean) * scale + beta),)
