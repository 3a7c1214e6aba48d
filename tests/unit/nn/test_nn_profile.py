"""Per-layer profiling of the executor (host clock on NumPy) and the FLOP count of each layer,
checked against counts written out by hand from the layer's arithmetic."""

from __future__ import annotations

import numpy as np
import pytest
from network_files import OWN, network_id
from nn_testdata import FIXTURES, graph_inputs, make_spec

from hps_core.errors import RequestError
from hps_core.nn import (
    DenseExecutor,
    Precision,
    TensorShape,
    build_graph,
    layer_flops,
    load_network_json,
    random_dense_params,
)
from hps_core.nn.layers import DENSE_LAYERS


def executor_for(path, precision=Precision.FP32) -> DenseExecutor:
    graph = build_graph(load_network_json(path))
    return DenseExecutor(graph, random_dense_params(graph.dense_layout(), seed=3), np, precision)


@pytest.mark.parametrize("path", FIXTURES, ids=network_id)
def test_profile_has_one_entry_per_step_covering_every_layer_once(path):
    executor = executor_for(path)
    dense, pooled = graph_inputs(executor.graph, 8, np.random.default_rng(0))
    profile = executor.profile(dense, pooled)
    used = [node for node in executor.graph.nodes if node.used]
    covered = [name for entry in profile.layers for name in entry.layers]
    assert sorted(covered) == sorted(node.spec.name for node in used)
    types = {node.spec.name: node.spec.type for node in used}
    for entry in profile.layers:
        assert entry.step == entry.layers[0] and entry.layer_type == types[entry.step]
        # A step covering two layers is an InnerProduct with the ReLU fused into it.
        if len(entry.layers) == 2:
            assert (entry.layer_type, types[entry.layers[1]]) == ("InnerProduct", "ReLU")
        assert entry.seconds >= 0
    assert profile.batch == 8


@pytest.mark.parametrize("path", FIXTURES, ids=network_id)
def test_profile_returns_the_forward_predictions_and_its_flops(path):
    executor = executor_for(path, Precision.FP16)
    dense, pooled = graph_inputs(executor.graph, 5, np.random.default_rng(1))
    profile = executor.profile(dense, pooled)
    np.testing.assert_array_equal(profile.predictions, executor.forward(dense, pooled))
    flops = executor.step_flops(5)
    assert [name for name, _ in flops] == [entry.step for entry in profile.layers]
    assert [count for _, count in flops] == [entry.flops for entry in profile.layers]
    assert profile.flops == sum(count for _, count in flops) > 0


def test_layer_times_add_up_to_the_whole_pass():
    executor = executor_for(OWN["dlrm"])
    dense, pooled = graph_inputs(executor.graph, 512, np.random.default_rng(2))
    executor.forward(dense, pooled)  # warm-up
    profile = executor.profile(dense, pooled)
    # Only input checks and the output conversion lie outside the steps.
    assert 0.8 * profile.total_seconds <= profile.layer_seconds <= profile.total_seconds


def test_profile_checks_inputs_like_forward():
    executor = executor_for(FIXTURES[0])
    dense, pooled = graph_inputs(executor.graph, 4, np.random.default_rng(0))
    with pytest.raises(RequestError, match="must be numeric"):
        executor.profile(dense[:, :1], pooled)


def built(layer_type, shapes, **fields):
    bottoms = [f"in{i}" for i in range(len(shapes))]
    tops = ["o", "p"] if layer_type == "Slice" else ["o"]
    spec = make_spec(layer_type, bottoms, tops, **fields)
    return DENSE_LAYERS[layer_type].build(spec, shapes)


B = 6
# (type, input shapes, fields, FLOPs for B samples written out from the layer's arithmetic)
CASES = [
    # 2-D: B rows x 33 outputs, each 70 multiply-adds and a bias add.
    ("InnerProduct", [(1, (70,))], {"fc_param": {"num_output": 33}}, B * 33 * (2 * 70 + 1)),
    # 3-D: B*4 rows of 9 features.
    ("InnerProduct", [(1, (4, 9))], {"fc_param": {"num_output": 5}}, B * 4 * 5 * (2 * 9 + 1)),
    # The full 27 x 27 Gram matrix of 16-wide vectors per sample.
    ("Interaction", [(1, (16,)), (1, (26, 16))], {}, B * 27 * 27 * 16 * 2),
    # DCN v1: per cross layer a 40-wide dot product, then 3 element-wise ops on 40 values.
    ("MultiCross", [(1, (40,))], {"mc_param": {"num_layers": 3}}, 3 * B * (2 * 40 + 3 * 40)),
    # DCN v2: 40 -> 8 -> 40 products, then 3 element-wise ops.
    (
        "MultiCross",
        [(1, (40,))],
        {"mc_param": {"num_layers": 2, "projection_dim": 8}},
        2 * B * (2 * 40 * 8 + 2 * 8 * 40 + 3 * 40),
    ),
    ("FmOrder2", [(1, (390,))], {"out_dim": 10}, B * (3 * 390 + 3 * 10)),
    ("WeightMultiply", [(1, (13,))], {"weight_dims": [13, 10]}, B * 130),
    ("Add", [(1, (6,))] * 3, {}, 2 * B * 6),
    ("ElementwiseMultiply", [(1, (6,))] * 2, {}, B * 6),
    ("ReduceSum", [(1, (4, 5))], {"axis": 2}, B * 20),
    ("ReLU", [(26, (11,))], {}, 26 * B * 11),
    ("Sigmoid", [(1, (3,))], {}, 4 * B * 3),
    ("Reshape", [(1, (26, 11))], {"leading_dim": 11}, 0),
    ("Concat", [(1, (3, 4)), (1, (3, 2))], {"axis": 2}, 0),
    ("Slice", [(1, (13,))], {"ranges": [[0, 10], [4, 13]]}, 0),
    ("Dropout", [(1, (7,))], {"rate": 0.5}, 0),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{len(c[2])}")
def test_layer_flops_match_hand_counts(case):
    layer_type, raw_shapes, fields, expected = case
    shapes = [TensorShape(rows, dims) for rows, dims in raw_shapes]
    assert layer_flops(built(layer_type, shapes, **fields), shapes, B) == expected


def test_fused_relu_adds_one_operation_per_output():
    shapes = [TensorShape(1, (70,))]
    layer = built("InnerProduct", shapes, fc_param={"num_output": 33})
    fused = type(layer)(layer.output_shapes, 70, 33, fuse_relu=True)
    assert layer_flops(fused, shapes, B) - layer_flops(layer, shapes, B) == B * 33


def test_dlrm_flops_are_its_products_plus_element_wise_work():
    executor = executor_for(OWN["dlrm"])
    batch = 32
    counts = dict(executor.step_flops(batch))
    # Every InnerProduct from the dense file's weight shapes [in, out]; a ReLU follows each
    # one except the last, which feeds the loss (a Sigmoid at inference).
    layout = [p for p in executor.graph.dense_layout().layers if p.type == "InnerProduct"]
    for i, params in enumerate(layout):
        fan_in, fan_out = params.params[0].shape
        relu = 1 if i != len(layout) - 1 else 0
        assert counts[params.layer] == batch * fan_out * (2 * fan_in + 1 + relu)
    interaction = next(s for s in executor._steps if s.layer_type == "Interaction")
    n, width = interaction.layer.num_vectors, interaction.input_shapes[0].dims[0]
    assert counts[interaction.name] == 2 * batch * n * n * width
