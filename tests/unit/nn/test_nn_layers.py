"""Each dense layer against the float64 references, on random inputs of several sizes, and
each layer's refusal of fields or shapes that do not fit."""

from __future__ import annotations

import re

import numpy as np
import pytest
from nn_reference import fc, fm_order2, interaction, multi_cross, relu, sigmoid, weight_multiply
from nn_testdata import make_spec

from hps_core.errors import ConfigError
from hps_core.nn import ComputeContext, PaddedBatch, TensorShape
from hps_core.nn.layers import DENSE_LAYERS
from hps_core.nn.layers.activation import Dropout

CTX = ComputeContext(np)
BATCHES = (1, 3, 17)


def run(layer_type, bottoms, tops, input_shapes, inputs, params=(), **fields):
    """Build a layer, check its inferred shapes against the arrays it returns, return them."""
    spec = make_spec(layer_type, bottoms, tops, **fields)
    layer = DENSE_LAYERS[layer_type].build(spec, input_shapes)
    assert [p.shape for p in layer.param_shapes()] == [np.shape(p) for p in params]
    outs = layer.forward(CTX, [x.astype(np.float32) for x in inputs], params)
    batch = inputs[0].shape[0] // input_shapes[0].rows_per_sample
    assert [o.shape for o in outs] == [s.concrete(batch) for s in layer.output_shapes]
    assert all(o.dtype == np.float32 for o in outs)
    return layer, outs


def close(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=2e-5, atol=2e-5)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.mark.parametrize("batch", BATCHES)
def test_activations(rng, batch):
    x = 4 * rng.standard_normal((batch, 7))
    shape = [TensorShape(1, (7,))]
    close(run("ReLU", "a", "b", shape, [x])[1][0], relu(x))
    close(run("Sigmoid", "a", "b", shape, [x])[1][0], sigmoid(x))
    close(run("BinaryCrossEntropyLoss", ["a", "label"], "b", shape, [x])[1][0], sigmoid(x))
    dropout = run("Dropout", "a", "b", shape, [x], rate=0.5)[1][0]
    np.testing.assert_array_equal(dropout, x.astype(np.float32))


def test_sigmoid_has_no_overflow_at_extremes():
    x = np.array([[-1e4, -100.0, -30.0, 0.0, 30.0, 100.0, 1e4]])
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        out = run("Sigmoid", "a", "b", [TensorShape(1, (7,))], [x])[1][0]
    close(out, sigmoid(x))


def test_loss_layer_reads_only_its_prediction():
    spec = make_spec("MultiCrossEntropyLoss", ["pred", "label"], "loss")
    assert DENSE_LAYERS["MultiCrossEntropyLoss"].consumed_bottoms(spec) == ("pred",)
    with pytest.raises(ConfigError, match=r"test.json:7 layers\[3\] 'loss'.bottom: .*2 bottoms"):
        DENSE_LAYERS["BinaryCrossEntropyLoss"].consumed_bottoms(make_spec("x", "pred", "loss"))


def test_dropout_rate_is_checked():
    with pytest.raises(ConfigError, match=r"'d'.rate: must be in \[0, 1\)"):
        Dropout.build(make_spec("Dropout", "a", "d", rate=1.5), [TensorShape(1, (3,))])


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize(("k", "n", "rank"), [(13, 8, 2), (29, 1, 2), (6, 5, 3)])
def test_inner_product(rng, batch, k, n, rank):
    lead = (batch,) if rank == 2 else (batch, 4)
    x = rng.standard_normal((*lead, k))
    w = rng.standard_normal((k, n)).astype(np.float32)
    b = rng.standard_normal((1, n)).astype(np.float32)
    shape = TensorShape(1, x.shape[1:])
    layer, (out,) = run("InnerProduct", "a", "fc", [shape], [x], (w, b), fc_param={"num_output": n})
    close(out, fc(x, w, b))
    fused = type(layer)(layer.output_shapes, k, n, fuse_relu=True)
    close(fused.forward(CTX, [x.astype(np.float32)], (w, b))[0], relu(fc(x, w, b)))


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize(("width", "layers", "projection"), [(9, 1, 0), (16, 3, 0), (12, 2, 4)])
def test_multi_cross(rng, batch, width, layers, projection):
    x = rng.standard_normal((batch, width))
    shapes = (
        [(width, projection), (projection, width), (1, width)]
        if projection
        else [
            (1, width),
            (1, width),
        ]
    )
    per_layer = [[0.3 * rng.standard_normal(s) for s in shapes] for _ in range(layers)]
    flat = [p.astype(np.float32) for params in per_layer for p in params]
    mc = {"num_layers": layers, "projection_dim": projection}
    out = run("MultiCross", "a", "mc", [TensorShape(1, (width,))], [x], flat, mc_param=mc)[1][0]
    close(out, multi_cross(x, per_layer, projection))


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize(("slots", "vec"), [(13, 10), (5, 1)])
def test_weight_multiply(rng, batch, slots, vec):
    x = rng.standard_normal((batch, slots))
    w = rng.standard_normal((slots, vec)).astype(np.float32)
    shape = [TensorShape(1, (slots,))]
    out = run("WeightMultiply", "a", "wm", shape, [x], (w,), weight_dims=[slots, vec])[1][0]
    close(out, weight_multiply(x, w))


def test_weight_multiply_dims_must_match_input():
    with pytest.raises(ConfigError, match=r"'wm'.weight_dims: must be \[13, vec_size\]"):
        run(
            "WeightMultiply",
            "a",
            "wm",
            [TensorShape(1, (13,))],
            [np.ones((1, 13))],
            weight_dims=[12, 4],
        )


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize(("slots", "out_dim"), [(39, 10), (2, 3)])
def test_fm_order2(rng, batch, slots, out_dim):
    x = rng.standard_normal((batch, slots * out_dim))
    shape = [TensorShape(1, (slots * out_dim,))]
    close(run("FmOrder2", "a", "fm", shape, [x], out_dim=out_dim)[1][0], fm_order2(x, out_dim))
    with pytest.raises(ConfigError, match="not a multiple of"):
        run("FmOrder2", "a", "fm", shape, [x], out_dim=slots * out_dim + 1)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize(("n_emb", "dim"), [(26, 16), (1, 3), (5, 8)])
def test_interaction_layout(rng, batch, n_emb, dim):
    mlp = rng.standard_normal((batch, dim))
    emb = rng.standard_normal((batch, n_emb, dim))
    shapes = [TensorShape(1, (dim,)), TensorShape(1, (n_emb, dim))]
    layer, (out,) = run("Interaction", ["mlp", "emb"], "inter", shapes, [mlp, emb])
    assert layer.output_shapes[0].dims == (dim + n_emb * (n_emb + 1) // 2 + 1,)
    close(out, interaction(mlp, emb))


def test_interaction_rejects_mismatched_widths():
    shapes = [TensorShape(1, (8,)), TensorShape(1, (4, 16))]
    with pytest.raises(ConfigError, match=r"must be \[R, D\] and \[R, N, D\]"):
        DENSE_LAYERS["Interaction"].build(make_spec("Interaction", ["m", "e"], "i"), shapes)


@pytest.mark.parametrize("batch", BATCHES)
def test_add_and_multiply_three_inputs(rng, batch):
    xs = [rng.standard_normal((batch, 6)) for _ in range(3)]
    shapes = [TensorShape(1, (6,))] * 3
    close(run("Add", ["a", "b", "c"], "s", shapes, xs)[1][0], xs[0] + xs[1] + xs[2])
    product = run("ElementwiseMultiply", ["a", "b", "c"], "p", shapes, xs)[1][0]
    close(product, xs[0] * xs[1] * xs[2])


def test_elementwise_layers_need_equal_shapes_and_two_inputs():
    shapes = [TensorShape(1, (6,)), TensorShape(1, (5,))]
    with pytest.raises(ConfigError, match=r"same shape: 'a' is \(B, 6\), 'b' is \(B, 5\)"):
        DENSE_LAYERS["Add"].build(make_spec("Add", ["a", "b"], "s"), shapes)
    with pytest.raises(ConfigError, match="at least 2 bottoms"):
        DENSE_LAYERS["ElementwiseMultiply"].build(make_spec("x", "a", "p"), shapes[:1])


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("axis", [1, 2])
def test_reduce_sum(rng, batch, axis):
    x = rng.standard_normal((batch, 4, 5))
    out = run("ReduceSum", "a", "r", [TensorShape(1, (4, 5))], [x], axis=axis)[1][0]
    close(out, x.sum(axis=axis, keepdims=True))


@pytest.mark.parametrize(("axis", "message"), [(0, "reduces over the batch"), (2, "out of range")])
def test_reduce_sum_bad_axis(axis, message):
    with pytest.raises(ConfigError, match=message):
        DENSE_LAYERS["ReduceSum"].build(
            make_spec("ReduceSum", "a", "r", axis=axis), [TensorShape(1, (4,))]
        )


@pytest.mark.parametrize("batch", BATCHES)
def test_reshape_general_and_time_step(rng, batch):
    x = rng.standard_normal((batch, 26, 11))
    shape = [TensorShape(1, (26, 11))]
    layer, (out,) = run("Reshape", "a", "r", shape, [x], leading_dim=11)
    assert str(layer.output_shapes[0]) == "(26B, 11)"
    close(out, x.reshape(batch * 26, 11))
    layer, (out,) = run("Reshape", "a", "r", shape, [x], leading_dim=11, time_step=13)
    assert str(layer.output_shapes[0]) == "(2B, 13, 11)"
    close(out, x.reshape(batch * 2, 13, 11))
    layer, (out,) = run("Reshape", "a", "r", shape, [x])
    assert str(layer.output_shapes[0]) == "(B, 286)"
    back = run("Reshape", "a", "r", [TensorShape(26, (11,))], [x.reshape(-1, 11)], leading_dim=286)
    close(back[1][0], x.reshape(batch, 286))


@pytest.mark.parametrize("batch", BATCHES)
def test_reshape_selected_slots(rng, batch):
    x = rng.standard_normal((batch, 6, 4))
    out = run("Reshape", "a", "r", [TensorShape(1, (6, 4))], [x], selected=[4, 0, 4])[1][0]
    close(out, np.concatenate([x[:, 4], x[:, 0], x[:, 4]], axis=1))
    everything = run("Reshape", "a", "r", [TensorShape(1, (6, 4))], [x], selected=[])[1][0]
    close(everything, x.reshape(batch, 24))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"leading_dim": 7}, "not a multiple of 7; the reshape would mix samples"),
        ({"leading_dim": 0}, r"leading_dim: must be an integer >= 1, got 0"),
        ({"selected": [6]}, "slot 6 out of range"),
    ],
)
def test_reshape_errors(fields, message):
    with pytest.raises(ConfigError, match=message):
        DENSE_LAYERS["Reshape"].build(
            make_spec("Reshape", "a", "r", **fields), [TensorShape(1, (6, 4))]
        )


@pytest.mark.parametrize("batch", BATCHES)
def test_concat_2d_and_3d(rng, batch):
    a, b = rng.standard_normal((batch, 5)), rng.standard_normal((batch, 3))
    two_d = [TensorShape(1, (5,)), TensorShape(1, (3,))]
    close(run("Concat", ["a", "b"], "c", two_d, [a, b])[1][0], np.hstack([a, b]))
    c, d = rng.standard_normal((batch, 2, 4)), rng.standard_normal((batch, 3, 4))
    slots = [TensorShape(1, (2, 4)), TensorShape(1, (3, 4))]
    close(run("Concat", ["c", "d"], "e", slots, [c, d], axis=1)[1][0], np.concatenate([c, d], 1))
    e = rng.standard_normal((batch, 2, 7))
    widths = [TensorShape(1, (2, 4)), TensorShape(1, (2, 7))]
    close(run("Concat", ["c", "e"], "f", widths, [c, e], axis=2)[1][0], np.concatenate([c, e], 2))


def test_concat_rejects_mismatches():
    spec = make_spec("Concat", ["a", "b"], "c", axis=2)
    with pytest.raises(
        ConfigError, match=r"cannot concatenate 'a' \(B, 2, 4\) and 'b' \(B, 3, 4\)"
    ):
        DENSE_LAYERS["Concat"].build(spec, [TensorShape(1, (2, 4)), TensorShape(1, (3, 4))])
    rows = [TensorShape(1, (4,)), TensorShape(26, (4,))]
    with pytest.raises(ConfigError, match="cannot concatenate"):
        DENSE_LAYERS["Concat"].build(make_spec("Concat", ["a", "b"], "c"), rows)


@pytest.mark.parametrize("batch", BATCHES)
def test_slice_overlapping_ranges(rng, batch):
    x = rng.standard_normal((batch, 13))
    ranges = [[0, 13], [2, 5], [12, 13]]
    outs = run("Slice", "a", ["s0", "s1", "s2"], [TensorShape(1, (13,))], [x], ranges=ranges)[1]
    for out, (start, end) in zip(outs, ranges, strict=True):
        close(out, x[:, start:end])


@pytest.mark.parametrize(
    ("ranges", "tops", "message"),
    [
        ([[0, 14]], ["s0"], r"range \[0, 14\) is not inside \[0, 13\)"),
        ([[3, 3]], ["s0"], "is not inside"),
        ([[0, 2], [2, 4]], ["s0"], "needs one top per range"),
        ([[0]], ["s0"], r"ranges: must be a non-empty list of \[int, int\] pairs"),
    ],
)
def test_slice_errors(ranges, tops, message):
    with pytest.raises(ConfigError, match=message):
        DENSE_LAYERS["Slice"].build(
            make_spec("Slice", "a", tops, ranges=ranges), [TensorShape(1, (13,))]
        )


def test_wrong_input_count_and_rank_name_the_layer():
    with pytest.raises(ConfigError, match=r"'fc'.bottom: needs 1 bottom\(s\), got 2"):
        DENSE_LAYERS["InnerProduct"].build(
            make_spec("InnerProduct", ["a", "b"], "fc", fc_param={"num_output": 2}),
            [TensorShape(1, (3,))] * 2,
        )
    with pytest.raises(ConfigError, match=r"input 'a' must be 2-D, got shape \(B, 2, 3\)"):
        DENSE_LAYERS["FmOrder2"].build(
            make_spec("FmOrder2", "a", "fm", out_dim=3), [TensorShape(1, (2, 3))]
        )
    with pytest.raises(ConfigError, match=r"'fc'.fc_param.num_output: is required"):
        DENSE_LAYERS["InnerProduct"].build(
            make_spec("InnerProduct", "a", "fc"), [TensorShape(1, (3,))]
        )


@pytest.mark.parametrize(
    ("param", "field", "words"),
    [
        ({"num_output": 4}, "mlp_param.num_outputs", "is required"),
        ({"num_outputs": [4, 2], "activations": ["Relu"]}, "activations", "list of 2 values"),
        ({"num_outputs": [4], "activation": "Tanh"}, "activation", "'Relu' or 'None'"),
        ({"num_outputs": [4, 2], "biases": [True, 1]}, "biases", "true or false"),
        ({"num_outputs": [4], "use_bias": "yes"}, "use_bias", "true or false"),
    ],
)
def test_mlp_fields_are_checked(param, field, words) -> None:
    spec = make_spec("MLP", "x", "y", mlp_param=param)
    with pytest.raises(ConfigError, match=rf"'y'.*{field}.*{words}"):
        DENSE_LAYERS["MLP"].build(spec, [TensorShape(1, (6,))])


def test_mlp_defaults_and_parameter_layout() -> None:
    # HugeCTR defaults: ReLU after every layer, a bias in every layer; W_i then b_i per layer.
    spec = make_spec("MLP", ["x", "mask"], "y", mlp_param={"num_outputs": [4, 3]})
    assert DENSE_LAYERS["MLP"].consumed_bottoms(spec) == ("x",)
    layer = DENSE_LAYERS["MLP"].build(spec, [TensorShape(1, (6,))])
    assert layer.relus == (True, True) and layer.biases == (True, True)
    assert [p.shape for p in layer.param_shapes()] == [(6, 4), (1, 4), (4, 3), (1, 3)]
    assert layer.output_shapes == (TensorShape(1, (3,)),)


def test_fused_inner_product_activation() -> None:
    shapes = [TensorShape(1, (5,))]
    tops = ["y", "mask", "drelu", "db"]
    relu = DENSE_LAYERS["FusedInnerProduct"].build(
        make_spec("FusedInnerProduct", "x", tops, fc_param={"num_output": 3}), shapes
    )
    assert relu.relu and len(relu.output_shapes) == 4
    plain = DENSE_LAYERS["FusedInnerProduct"].build(
        make_spec("FusedInnerProduct", "x", "y", activation="None", fc_param={"num_output": 3}),
        shapes,
    )
    assert not plain.relu
    with pytest.raises(ConfigError, match=r"'y'.activation: must be 'Relu' or 'None'"):
        DENSE_LAYERS["FusedInnerProduct"].build(
            make_spec("FusedInnerProduct", "x", "y", activation="Gelu", fc_param={"num_output": 3}),
            shapes,
        )


@pytest.mark.parametrize(
    ("layer_type", "bottoms", "tops", "fields", "shapes", "words"),
    [
        ("Scale", "x", "y", {"scale_param": {"axis": 2, "factor": 3}}, [(1, (4,))], "0 or 1"),
        ("Scale", "x", "y", {"scale_param": {"axis": 0, "factor": 0.5}}, [(1, (4,))], "at least"),
        ("Scale", "x", "y", {"scale_param": {"axis": 0, "factor": 2}}, [(1, (2, 4))], "2-D"),
        ("FusedReshapeConcat", ["a", "b"], "y", {}, [(1, (5, 3)), (1, (5, 2))], "2 tops"),
        ("FusedReshapeConcat", ["a", "b"], ["h", "t"], {}, [(1, (5, 3)), (1, (4, 2))], "one B"),
        ("MatrixMultiply", ["a", "b"], "y", {}, [(1, (2, 3)), (1, (4, 5))], "[B, ..., n, k]"),
        ("MatrixMultiply", ["a", "b"], "y", {}, [(1, (3,)), (1, (3,))], "3-D or 4-D"),
        ("Softmax", ["x", "mask"], "y", {}, [(1, (2, 3, 4)), (1, (1, 1, 4))], "mask must be"),
        ("ReduceMean", "x", "y", {"axis": 1}, [(1, (2, 3, 4))], "2-D or 3-D"),
        ("ReduceMean", "x", "y", {"axis": 3}, [(1, (2, 3))], "out of range"),
        ("Sub", ["a", "b"], "y", {}, [(1, (3,)), (1, (4,))], "same shape"),
        ("ELU", "x", "y", {}, [(1, (3,))], "elu_param.alpha: is required"),
        ("PReLU_Dice", "x", "y", {"prelu_dice_param": {"alpha": 0.1}}, [(1, (3,))], "eps"),
    ],
)
def test_din_family_fields_and_shapes_are_checked(layer_type, bottoms, tops, fields, shapes, words):
    spec = make_spec(layer_type, bottoms, tops, **fields)
    inputs = [TensorShape(rows, dims) for rows, dims in shapes]
    with pytest.raises(ConfigError, match=re.escape(words)):
        DENSE_LAYERS[layer_type].build(spec, inputs)


def test_din_family_shapes() -> None:
    def build(layer_type, bottoms, tops, shapes, **fields):
        spec = make_spec(layer_type, bottoms, tops, **fields)
        layer = DENSE_LAYERS[layer_type].build(spec, [TensorShape(r, d) for r, d in shapes])
        return [str(s) for s in layer.output_shapes]

    assert build("Scale", "x", "y", [(1, (4,))], scale_param={"axis": 0, "factor": 3.0}) == [
        "(B, 12)"
    ]
    assert build("Scale", "x", "y", [(1, (4,))], scale_param={"axis": 1, "factor": 3}) == [
        "(3B, 4)"
    ]
    assert build("FusedReshapeConcat", ["a", "b"], ["h", "t"], [(1, (5, 3)), (1, (5, 2))]) == [
        "(4B, 5)",
        "(B, 5)",
    ]
    assert build("FusedReshapeConcatGeneral", ["a"], "y", [(1, (5, 3))]) == ["(5B, 3)"]
    assert build("MatrixMultiply", ["a", "b"], "y", [(1, (2, 1, 3)), (1, (2, 3, 6))]) == [
        "(B, 2, 1, 6)"
    ]
    # HugeCTR writes Dice's alpha as "alpha" and reads it as "elu_alpha": both are accepted.
    dice = DENSE_LAYERS["PReLU_Dice"].build(
        make_spec("PReLU_Dice", "x", "y", prelu_dice_param={"elu_alpha": 0.3, "eps": 1e-8}),
        [TensorShape(1, (3,))],
    )
    assert dice.alpha == 0.3 and dice.batch_dependent
    assert DENSE_LAYERS["DotProduct"] is DENSE_LAYERS["ElementwiseMultiply"]


def test_dice_uses_the_batch_statistics() -> None:
    spec = make_spec("PReLU_Dice", "x", "y", prelu_dice_param={"alpha": 0.25, "eps": 1e-8})
    layer = DENSE_LAYERS["PReLU_Dice"].build(spec, [TensorShape(1, (2,))])
    ctx = ComputeContext(np)
    one = np.array([[2.0, -4.0]], np.float32)
    # One sample: zero variance, p = sigmoid(0) = 1/2, so 0.5 * (1 + alpha) * x.
    np.testing.assert_allclose(layer.forward(ctx, [one], ())[0], 0.625 * one, rtol=1e-6)
    two = np.array([[2.0, -4.0], [0.0, 4.0]], np.float32)
    got = layer.forward(ctx, [two], ())[0]
    assert not np.allclose(got[0], 0.625 * one[0])  # the other sample changed the result


@pytest.mark.parametrize("real", [0, 1, 3, 4])
@pytest.mark.parametrize("per_sample", [1, 3])
def test_dice_leaves_a_padded_batch_s_padding_out(real: int, per_sample: int) -> None:
    """A batch padded to 4 samples (``per_sample`` rows each, as DIN's attention rows) with
    ``real`` real ones: its real rows equal Dice over them alone, whatever the padding holds
    (NaN and huge values); with no real sample the means are 0, not NaN."""
    spec = make_spec("PReLU_Dice", "x", "y", prelu_dice_param={"alpha": 0.25, "eps": 1e-2})
    layer = DENSE_LAYERS["PReLU_Dice"].build(spec, [TensorShape(1, (5,))])
    rng = np.random.default_rng(real * 10 + per_sample)
    x = rng.standard_normal((4 * per_sample, 5)).astype(np.float32)
    rows = real * per_sample
    padded = PaddedBatch(np.array([real, 99], np.int32), rows=4)
    if rows:
        x[rows::2] = np.nan
        x[rows + 1 :: 2] = 1e30
        got = layer.forward(ComputeContext(np, padded=padded), [x], ())[0]
        alone = layer.forward(ComputeContext(np), [x[:rows]], ())[0]
        np.testing.assert_array_equal(got[:rows], alone)
    else:
        got = layer.forward(ComputeContext(np, padded=padded), [x], ())[0].astype(np.float64)
        p = 1 / (1 + np.exp(-x / np.sqrt(1e-2)))  # mean 0, variance 0
        np.testing.assert_allclose(got, p * x + (1 - p) * 0.25 * x, rtol=1e-5, atol=1e-7)


def test_a_padded_batch_needs_whole_rows_per_sample() -> None:
    padded = PaddedBatch(np.array([2], np.int32), rows=4)
    assert padded.rows_per_sample(12) == 3
    with pytest.raises(ValueError, match="10 rows is not whole rows per sample of a batch of 4"):
        padded.rows_per_sample(10)


def test_masked_softmax_follows_hugectr() -> None:
    from hps_core.nn.layers.attention import masked_softmax

    scores = np.array([[[[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]]], np.float32)  # [1, 1, 2, 3]
    mask = np.array([[[[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]]], np.float32)
    got = masked_softmax(np, scores, mask, 2.0)
    kept = np.exp(2.0 * np.array([1.0, 2.0]) - 4.0)
    np.testing.assert_allclose(got[0, 0, 0, :2], kept / (kept.sum() + 1e-6), rtol=1e-6)
    assert got[0, 0, 0, 2] < 1e-30  # masked: 10000 below the rest
    # A row with every key masked is the plain softmax over all of them, as in HugeCTR.
    plain = np.exp(2.0 * np.array([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(got[0, 0, 1], plain / plain.sum(), rtol=1e-5)


@pytest.mark.parametrize(
    ("layer_type", "bottoms", "fields", "shapes", "words"),
    [
        ("MultiHeadAttention", ["q", "k", "v"], {"num_attention_heads": 3},
         [(1, (5, 8)), (1, (5, 8)), (1, (5, 8))], "multiple of 3 heads"),
        ("MultiHeadAttention", ["q", "k"], {}, [(1, (5, 8)), (1, (5, 8))], "3 or 4 bottoms"),
        ("MultiHeadAttention", ["q", "k", "v", "m"], {},
         [(1, (5, 8)), (1, (4, 8)), (1, (4, 8)), (1, (1, 5, 5))], "mask must be [B, 1, 5, 4]"),
        ("SequenceMask", ["a", "b"], {"max_sequence_len_from": 3, "max_sequence_len_to": 3},
         [(1, (2,)), (1, (1,))], "must be [B, 1] lengths"),
        ("SequenceMask", ["a", "b"], {"max_sequence_len_from": 3},
         [(1, (1,)), (1, (1,))], "max_sequence_len_to: is required"),
        ("LayerNorm", ["x"], {}, [(1, (4,))], "ln_param.eps: is required"),
    ],
)  # fmt: skip
def test_attention_fields_and_shapes_are_checked(layer_type, bottoms, fields, shapes, words):
    spec = make_spec(layer_type, bottoms, "y", **fields)
    with pytest.raises(ConfigError, match=re.escape(words)):
        DENSE_LAYERS[layer_type].build(spec, [TensorShape(r, d) for r, d in shapes])
