"""The CuPy path of the dense engine against its NumPy path on the same inputs: each layer,
pooling, and whole HugeCTR networks, in FP32 and FP16. Skipped without CuPy and a CUDA device."""

from __future__ import annotations

import numpy as np
import pytest
from network_files import NETWORKS, network_id

from hps_core.nn import (
    Combiner,
    ComputeContext,
    DenseExecutor,
    LayerSpec,
    PaddedBatch,
    Precision,
    TensorShape,
    UnpooledEmbedding,
    build_graph,
    load_network_json,
    pool_embeddings,
    random_dense_params,
)
from hps_core.nn.layers import DENSE_LAYERS

cupy = pytest.importorskip("cupy")
try:
    HAVE_DEVICE = cupy.cuda.runtime.getDeviceCount() > 0
except Exception:  # no driver or no device: the CUDA runtime raises its own error types
    HAVE_DEVICE = False
if not HAVE_DEVICE:
    pytest.skip("no CUDA device", allow_module_level=True)

pytestmark = pytest.mark.gpu

FIXTURES = NETWORKS  # the project's networks, and HugeCTR's where they are here
TOLERANCE = {Precision.FP32: 2e-5, Precision.FP16: 2e-2}

# (type, bottoms, tops, fields, input shapes as (rows_per_sample, dims))
LAYER_CASES = [
    ("ReLU", ["a"], ["o"], {}, [(1, (37,))]),
    ("Sigmoid", ["a"], ["o"], {}, [(1, (37,))]),
    ("Dropout", ["a"], ["o"], {"rate": 0.5}, [(1, (37,))]),
    ("BinaryCrossEntropyLoss", ["a", "label"], ["o"], {}, [(1, (1,))]),
    ("InnerProduct", ["a"], ["o"], {"fc_param": {"num_output": 33}}, [(1, (70,))]),
    ("InnerProduct", ["a"], ["o"], {"fc_param": {"num_output": 5}}, [(1, (4, 9))]),
    ("MultiCross", ["a"], ["o"], {"mc_param": {"num_layers": 3}}, [(1, (40,))]),
    (
        "MLP",
        ["a"],
        ["o"],
        {
            "mlp_param": {
                "num_outputs": [64, 17, 1],
                "activations": ["Relu", "None", "Relu"],
                "biases": [True, False, True],
            }
        },
        [(1, (70,))],
    ),
    (
        "FusedInnerProduct",
        ["a"],
        ["o", "mask", "drelu", "db"],
        {"fc_param": {"num_output": 33}, "activation": "Relu"},
        [(1, (70,))],
    ),
    (
        "MultiCross",
        ["a"],
        ["o"],
        {"mc_param": {"num_layers": 2, "projection_dim": 8}},
        [(1, (40,))],
    ),
    ("WeightMultiply", ["a"], ["o"], {"weight_dims": [13, 10]}, [(1, (13,))]),
    ("Scale", ["a"], ["o"], {"scale_param": {"axis": 0, "factor": 3}}, [(1, (7,))]),
    ("Scale", ["a"], ["o"], {"scale_param": {"axis": 1, "factor": 3}}, [(1, (7,))]),
    ("Sub", ["a", "b"], ["o"], {}, [(1, (6,))] * 2),
    ("ReduceMean", ["a"], ["o"], {"axis": 1}, [(1, (4, 5))]),
    ("FusedReshapeConcat", ["a", "b"], ["h", "t"], {}, [(1, (5, 3)), (1, (5, 2))]),
    ("FusedReshapeConcatGeneral", ["a", "b"], ["o"], {}, [(1, (5, 3)), (1, (5, 2))]),
    ("MatrixMultiply", ["a", "b"], ["o"], {}, [(1, (1, 10)), (1, (10, 36))]),
    ("MatrixMultiply", ["a", "b"], ["o"], {}, [(1, (2, 3, 4)), (1, (2, 4, 5))]),
    ("ELU", ["a"], ["o"], {"elu_param": {"alpha": 0.7}}, [(1, (37,))]),
    ("PReLU_Dice", ["a"], ["o"], {"prelu_dice_param": {"alpha": 0.2, "eps": 1e-8}}, [(1, (37,))]),
    ("Softmax", ["a"], ["o"], {}, [(1, (3, 10))]),
    ("Softmax", ["a", "m"], ["o"], {"factor": 0.5}, [(1, (2, 4, 5)), (1, (1, 4, 5))]),
    (
        "SequenceMask",
        ["a", "b"],
        ["o"],
        {"max_sequence_len_from": 4, "max_sequence_len_to": 5},
        [(1, (1,)), (1, (1,))],
    ),
    (
        "MultiHeadAttention",
        ["q", "k", "v"],
        ["o"],
        {"num_attention_heads": 2},
        [(1, (4, 8)), (1, (6, 8)), (1, (6, 8))],
    ),
    (
        "MultiHeadAttention",
        ["q", "k", "v", "m"],
        ["o"],
        {"num_attention_heads": 4},
        [(1, (4, 8)), (1, (6, 8)), (1, (6, 8)), (1, (1, 4, 6))],
    ),
    ("LayerNorm", ["a"], ["o"], {"ln_param": {"eps": 1e-5}}, [(1, (5, 16))]),
    ("BatchNorm", ["a"], ["o"], {"bn_param": {"factor": 1.0, "eps": 1e-5}}, [(1, (16,))]),
    ("FmOrder2", ["a"], ["o"], {"out_dim": 10}, [(1, (390,))]),
    ("Interaction", ["a", "b"], ["o"], {}, [(1, (16,)), (1, (26, 16))]),
    ("Add", ["a", "b", "c"], ["o"], {}, [(1, (6,))] * 3),
    ("ElementwiseMultiply", ["a", "b"], ["o"], {}, [(1, (6,))] * 2),
    ("ReduceSum", ["a"], ["o"], {"axis": 2}, [(1, (4, 5))]),
    ("Reshape", ["a"], ["o"], {"leading_dim": 11}, [(1, (26, 11))]),
    ("Reshape", ["a"], ["o"], {"selected": [3, 0]}, [(1, (6, 4))]),
    ("Concat", ["a", "b"], ["o"], {"axis": 2}, [(1, (3, 4)), (1, (3, 2))]),
    ("Slice", ["a"], ["o", "p"], {"ranges": [[0, 10], [4, 13]]}, [(1, (13,))]),
]


def spec(layer_type, bottoms, tops, fields):
    raw = {"type": layer_type, "bottom": bottoms, "top": tops, **fields}
    return LayerSpec(1, 1, "gpu.json", tops[0], layer_type, tuple(bottoms), tuple(tops), raw)


def build(case):
    """The layer of a ``LAYER_CASES`` / ``CONCAT_CASES`` entry, and its input shapes."""
    layer_type, bottoms, tops, fields, raw_shapes = case
    shapes = [TensorShape(rows, dims) for rows, dims in raw_shapes]
    return DENSE_LAYERS[layer_type].build(spec(layer_type, bottoms, tops, fields), shapes), shapes


@pytest.mark.parametrize("precision", [Precision.FP32, Precision.FP16])
@pytest.mark.parametrize("real", [0, 3, 8])
def test_dice_of_a_padded_batch_equals_numpy(real, precision):
    """Dice on CuPy and on NumPy given the same batch padded to 8 samples of 3 rows (``real``
    of them real, the padding NaN) and its count of real samples: equal on the real rows
    (with none real, on every row of finite values: both take means of 0)."""
    fields = {"prelu_dice_param": {"alpha": 0.2, "eps": 1e-3}}
    layer, _ = build(("PReLU_Dice", ["a"], ["o"], fields, [(3, (40,))]))
    rng = np.random.default_rng(real)
    x = rng.standard_normal((24, 40)).astype(np.float32)
    if real:
        x[3 * real :] = np.nan
    count = np.array([real], np.int32)
    cpu_ctx = ComputeContext(np, precision, padded=PaddedBatch(count, 8))
    gpu_ctx = ComputeContext(cupy, precision, padded=PaddedBatch(cupy.asarray(count), 8))
    want = layer.forward(cpu_ctx, [cpu_ctx.cast(x)], ())[0]
    got = layer.forward(gpu_ctx, [gpu_ctx.cast(cupy.asarray(x))], ())[0]
    rows = 3 * real or 24
    assert_close(got[:rows], want[:rows], precision)


def assert_close(gpu, cpu, precision):
    tol = TOLERANCE[precision]
    np.testing.assert_allclose(cupy.asnumpy(gpu), cpu, rtol=tol, atol=tol)


@pytest.mark.parametrize("precision", [Precision.FP32, Precision.FP16])
@pytest.mark.parametrize("case", LAYER_CASES, ids=lambda c: f"{c[0]}-{c[3]}")
@pytest.mark.parametrize("batch", [1, 64])
def test_layer_parity(case, precision, batch):
    layer, shapes = build(case)
    rng = np.random.default_rng(batch)
    cpu_ctx, gpu_ctx = ComputeContext(np, precision), ComputeContext(cupy, precision)
    inputs = [rng.standard_normal(s.concrete(batch)).astype(cpu_ctx.dtype) for s in shapes]
    params = [
        (0.2 * rng.standard_normal(p.shape)).astype(cpu_ctx.dtype) for p in layer.param_shapes()
    ]
    # Running statistics (BatchNorm): variances must be positive.
    params += [
        (np.abs(rng.standard_normal(p.shape)) + 0.5).astype(cpu_ctx.dtype)
        for p in layer.state_shapes()
    ]
    cpu = layer.forward(cpu_ctx, inputs, params)
    gpu = layer.forward(
        gpu_ctx, [cupy.asarray(x) for x in inputs], [cupy.asarray(p) for p in params]
    )
    for g, c in zip(gpu, cpu, strict=True):
        assert isinstance(g, cupy.ndarray) and g.dtype == c.dtype and g.shape == c.shape
        assert_close(g, c, precision)


CONCAT_CASES = [
    ("Concat", ["a", "b", "c"], ["o"], {}, [(1, (3,)), (1, (16,)), (1, (5,))]),
    ("Concat", ["a", "b"], ["o"], {"axis": 1}, [(1, (1, 4)), (1, (3, 4))]),
    ("Concat", ["a", "b"], ["o"], {"axis": 2}, [(1, (3, 4)), (1, (3, 2))]),
    ("Concat", list("abcdefghijk"), ["o"], {}, [(1, (2,))] * 11),  # two launches
    ("FusedReshapeConcat", ["a", "b"], ["h", "t"], {}, [(1, (5, 3)), (1, (5, 2))]),
    ("FusedReshapeConcatGeneral", ["a", "b"], ["o"], {}, [(1, (5, 3)), (1, (5, 2))]),
]


@pytest.mark.parametrize("precision", [Precision.FP32, Precision.FP16])
@pytest.mark.parametrize("case", CONCAT_CASES, ids=lambda c: f"{c[0]}-{len(c[1])}-{c[3]}")
@pytest.mark.parametrize("batch", [1, 37])
def test_concat_layers_in_one_kernel_equal_numpy(case, precision, batch, monkeypatch):
    """The Concat layers on CuPy: NumPy's values exactly (they only move data), from
    ``concat_rows`` launches."""
    from hps_core.cuda import dense_ops

    launches = []
    concat_rows = dense_ops._concat_rows

    def counted(*args, **kwargs):
        launches.append(concat_rows(*args, **kwargs))
        return launches[-1]

    monkeypatch.setattr(dense_ops, "_concat_rows", counted)
    layer, shapes = build(case)
    rng = np.random.default_rng(batch)
    cpu_ctx, gpu_ctx = ComputeContext(np, precision), ComputeContext(cupy, precision)
    inputs = [rng.standard_normal(s.concrete(batch)).astype(cpu_ctx.dtype) for s in shapes]
    cpu = layer.forward(cpu_ctx, inputs, [])
    gpu = layer.forward(gpu_ctx, [cupy.asarray(x) for x in inputs], [])
    assert launches and all(launches)
    for g, c in zip(gpu, cpu, strict=True):
        assert g.dtype == c.dtype and g.shape == c.shape
        np.testing.assert_array_equal(cupy.asnumpy(g), c)


@pytest.mark.parametrize("combiner", list(Combiner))
@pytest.mark.parametrize("fixed", [True, False])
def test_pooling_parity(combiner, fixed):
    rng = np.random.default_rng(7)
    rows, slots, dim = 512 * 26, 26, 16
    counts = np.full(rows, 2) if fixed else rng.integers(0, 5, size=rows)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    values = rng.standard_normal((int(offsets[-1]), dim)).astype(np.float32)
    cpu = pool_embeddings(np, values, offsets, slots, combiner)
    out = cupy.full(cpu.shape, cupy.nan, dtype=cupy.float32)
    gpu = pool_embeddings(
        cupy, cupy.asarray(values), cupy.asarray(offsets), slots, combiner, out=out
    )
    assert gpu is out
    np.testing.assert_allclose(cupy.asnumpy(gpu), cpu, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("precision", [Precision.FP32, Precision.FP16])
@pytest.mark.parametrize("path", FIXTURES, ids=network_id)
def test_network_parity(path, precision):
    graph = build_graph(load_network_json(path))
    params = random_dense_params(graph.dense_layout(), seed=2)
    cpu = DenseExecutor(graph, params, np, precision)
    gpu = DenseExecutor(graph, params, cupy, precision)
    rng = np.random.default_rng(4)
    batch = 256
    dense = (0.3 * rng.standard_normal((batch, graph.spec.data.dense_dim))).astype(np.float32)
    unpooled = {}
    for name, layer in zip(cpu.embedding_names, cpu.embedding_layers, strict=True):
        counts = rng.integers(0, 4, size=batch * layer.slot_num)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        values = (0.3 * rng.standard_normal((int(offsets[-1]), layer.vec_size))).astype(np.float32)
        unpooled[name] = (values, offsets)
    expected = cpu.forward(dense, {k: UnpooledEmbedding(*v) for k, v in unpooled.items()})
    on_device = {
        k: UnpooledEmbedding(cupy.asarray(v), cupy.asarray(o)) for k, (v, o) in unpooled.items()
    }
    out = cupy.full(expected.shape, cupy.nan, dtype=cupy.float32)
    got = gpu.forward(cupy.asarray(dense), on_device, out=out)
    assert got is out and bool(cupy.all(cupy.isfinite(out)))
    assert_close(out, expected, precision)
