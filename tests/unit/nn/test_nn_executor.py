"""Whole networks: the four HugeCTR fixtures and a network using every layer, run by the
executor and compared with the independent float64 interpreter of ``nn_reference``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from network_files import requires_hugectr
from nn_reference import network_forward, pool
from nn_testdata import FIXTURES, graph_inputs, network_text, random_csr

from hps_core.errors import ConfigError, ModelFileError, NotAvailableError, RequestError
from hps_core.nn import (
    DenseExecutor,
    UnpooledEmbedding,
    build_graph,
    load_network_json,
    random_dense_params,
    read_dense_blob,
    write_dense_blob,
)

EVERY_LAYER = [
    {
        "name": "e1",
        "type": "LocalizedSlotSparseEmbeddingHash",
        "bottom": "keys",
        "top": "e1",
        "sparse_embedding_hparam": {"embedding_vec_size": 8, "combiner": "mean"},
    },
    {
        "name": "e2",
        "type": "DistributedSlotSparseEmbeddingHash",
        "bottom": "keys2",
        "top": "e2",
        "sparse_embedding_hparam": {"embedding_vec_size": 8, "combiner": "sum"},
    },
    {"type": "Concat", "bottom": ["e1", "e2"], "top": "slots", "axis": 1},
    {"type": "InnerProduct", "bottom": "slots", "top": "fc3d", "fc_param": {"num_output": 4}},
    {"type": "Reshape", "bottom": "fc3d", "top": "picked", "selected": [0, 7, 3]},
    {"type": "Reshape", "bottom": "slots", "top": "flat", "leading_dim": 64},
    {"type": "Reshape", "bottom": "flat", "top": "steps", "leading_dim": 16, "time_step": 2},
    {"type": "Reshape", "bottom": "steps", "top": "back", "leading_dim": 64},
    {"type": "InnerProduct", "bottom": "dense", "top": "fc1", "fc_param": {"num_output": 12}},
    {"type": "ReLU", "bottom": "fc1", "top": "relu1"},
    {"type": "ElementwiseMultiply", "bottom": ["relu1", "picked"], "top": "mul"},
    {
        "type": "MLP",
        "bottom": "dense",
        "top": "mlp",
        "mlp_param": {
            "num_output": 1,  # written by HugeCTR, not read by its layer
            "num_outputs": [10, 9, 12],
            "activations": ["Relu", "None", "Relu"],
            "biases": [False, True, True],
        },
    },
    {
        "type": "FusedInnerProduct",
        "bottom": "mlp",
        "top": ["fip", "fip_mask", "fip_drelu", "fip_db"],
        "position": "Head",
        "activation": "Relu",
        "fc_param": {"num_output": 12},
    },
    {"type": "Add", "bottom": ["fc1", "mul", "fip"], "top": "add0"},
    {"type": "Concat", "bottom": ["add0", "back"], "top": "cat"},
    {"type": "MultiCross", "bottom": "cat", "top": "mc1", "mc_param": {"num_layers": 2}},
    {
        "type": "MultiCross",
        "bottom": "cat",
        "top": "mc2",
        "mc_param": {"num_layers": 2, "projection_dim": 5},
    },
    {"type": "Add", "bottom": ["mc1", "mc2"], "top": "both"},
    {"type": "Dropout", "bottom": "both", "top": "drop", "rate": 0.3},
    {"type": "InnerProduct", "bottom": "drop", "top": "fc2", "fc_param": {"num_output": 1}},
    {"type": "BinaryCrossEntropyLoss", "bottom": ["fc2", "label"], "top": "loss"},
]
SPARSE = (("keys", 5, 3), ("keys2", 3, 2))
# HugeCTR's samples/dlrm: bottom and top MLPs as fused MLP layers around the Interaction.
DLRM_MLP = [
    {
        "name": "sparse_embedding",
        "type": "LocalizedSlotSparseEmbeddingHash",
        "bottom": "keys",
        "top": "sparse_embedding",
        "sparse_embedding_hparam": {"embedding_vec_size": 16, "combiner": "sum"},
    },
    {
        "type": "MLP",
        "bottom": "dense",
        "top": "mlp1",
        "mlp_param": {"num_output": 16, "num_outputs": [32, 24, 16], "activation": "Relu"},
    },
    {"type": "Interaction", "bottom": ["mlp1", "sparse_embedding"], "top": "interaction1"},
    {
        "type": "MLP",
        "bottom": "interaction1",
        "top": "mlp2",
        "mlp_param": {
            "num_output": 1,
            "num_outputs": [64, 32, 1],
            "activations": ["Relu", "Relu", "None"],
            "use_bias": True,
        },
    },
    {"type": "BinaryCrossEntropyLoss", "bottom": ["mlp2", "label"], "top": "loss"},
]

# HugeCTR's samples/din (attention over 10 behaviours of goods and categories, Dice
# activations), with the remaining DIN-family layers on a side branch.
DIN = [
    *(
        {
            "name": name,
            "type": "DistributedSlotSparseEmbeddingHash",
            "bottom": bottom,
            "top": name,
            "sparse_embedding_hparam": {"embedding_vec_size": 6, "combiner": "sum"},
        }
        for name, bottom in (("user", "user_keys"), ("good", "good_keys"), ("cate", "cate_keys"))
    ),
    {"type": "FusedReshapeConcat", "bottom": ["good", "cate"], "top": ["his", "item"]},
    {"type": "Scale", "bottom": "item", "top": "item_rep",
     "scale_param": {"axis": 1, "factor": 4.0}},
    {"type": "Sub", "bottom": ["item_rep", "his"], "top": "sub"},
    {"type": "DotProduct", "bottom": ["item_rep", "his"], "top": "mul"},
    {"type": "Concat", "bottom": ["item_rep", "his", "sub", "mul"], "top": "att_in"},
    {"type": "InnerProduct", "bottom": "att_in", "top": "att_fc1", "fc_param": {"num_output": 8}},
    {"type": "PReLU_Dice", "bottom": "att_fc1", "top": "att_dice",
     "prelu_dice_param": {"alpha": 0.2, "eps": 1e-8}},
    {"type": "InnerProduct", "bottom": "att_dice", "top": "att_fc2", "fc_param": {"num_output": 1}},
    {"type": "Reshape", "bottom": "att_fc2", "top": "scores", "leading_dim": 4},
    {"type": "Softmax", "bottom": "scores", "top": "weights", "factor": 1.0},
    {"type": "Scale", "bottom": "weights", "top": "weights_rep",
     "scale_param": {"axis": 0, "factor": 12}},
    {"type": "Reshape", "bottom": "his", "top": "his_flat", "leading_dim": 48},
    {"type": "ElementwiseMultiply", "bottom": ["weights_rep", "his_flat"], "top": "weighted"},
    {"type": "Reshape", "bottom": "weighted", "top": "weighted_3d", "leading_dim": 12,
     "time_step": 4},
    {"type": "ReduceSum", "bottom": "weighted_3d", "top": "pooled_3d", "axis": 1},
    {"type": "Reshape", "bottom": "pooled_3d", "top": "pooled", "leading_dim": 12},
    {"type": "Reshape", "bottom": "weights", "top": "weights_3d", "leading_dim": 4,
     "time_step": 1},
    {"type": "Reshape", "bottom": "his", "top": "his_3d", "leading_dim": 12, "time_step": 4},
    {"type": "MatrixMultiply", "bottom": ["weights_3d", "his_3d"], "top": "att_mm"},
    {"type": "ReduceMean", "bottom": "att_mm", "top": "att_mean", "axis": 1},
    {"type": "Reshape", "bottom": "att_mean", "top": "att_vec", "leading_dim": 12},
    {"type": "FusedReshapeConcatGeneral", "bottom": ["good", "cate"], "top": "all_rows"},
    {"type": "ELU", "bottom": "all_rows", "top": "all_elu", "elu_param": {"alpha": 0.7}},
    {"type": "Reshape", "bottom": "all_elu", "top": "all_flat", "leading_dim": 60},
    {"type": "Cast", "bottom": "all_flat", "top": "all_cast"},
    {"type": "Reshape", "bottom": "user", "top": "user_flat", "leading_dim": 6},
    {"type": "Concat", "bottom": ["user_flat", "item", "pooled", "att_vec", "all_cast"],
     "top": "features"},
    {"type": "InnerProduct", "bottom": "features", "top": "fc1", "fc_param": {"num_output": 16}},
    {"type": "PReLU_Dice", "bottom": "fc1", "top": "dice1",
     "prelu_dice_param": {"elu_alpha": 0.1, "eps": 1e-6}},
    {"type": "InnerProduct", "bottom": "dice1", "top": "fc2", "fc_param": {"num_output": 1}},
    {"type": "BinaryCrossEntropyLoss", "bottom": ["fc2", "label"], "top": "loss"},
]  # fmt: skip
DIN_SPARSE = (("user_keys", 1, 1), ("good_keys", 5, 1), ("cate_keys", 5, 1))
# HugeCTR's samples/mmoe: two experts, a softmax gate per task, one tower and loss per task.
MMOE = [
    {"name": "emb", "type": "DistributedSlotSparseEmbeddingHash", "bottom": "keys", "top": "emb",
     "sparse_embedding_hparam": {"embedding_vec_size": 4, "combiner": "sum"}},
    {"type": "Reshape", "bottom": "emb", "top": "flat", "leading_dim": 12},
    {"type": "Concat", "bottom": ["flat", "dense"], "top": "x"},
    *({"type": "InnerProduct", "bottom": "x", "top": f"expert{i}", "fc_param": {"num_output": 6}}
      for i in range(2)),
    {"type": "Reshape", "bottom": "expert0", "top": "e0", "leading_dim": 6, "time_step": 1},
    {"type": "Reshape", "bottom": "expert1", "top": "e1", "leading_dim": 6, "time_step": 1},
    {"type": "Concat", "bottom": ["e0", "e1"], "top": "experts", "axis": 1},
    *({"type": "InnerProduct", "bottom": "x", "top": f"gate_fc{t}", "fc_param": {"num_output": 2}}
      for t in "AB"),
    *({"type": "Softmax", "bottom": f"gate_fc{t}", "top": f"gate{t}"} for t in "AB"),
    *({"type": "Reshape", "bottom": f"gate{t}", "top": f"g{t}", "leading_dim": 2, "time_step": 1}
      for t in "AB"),
    *({"type": "MatrixMultiply", "bottom": [f"g{t}", "experts"], "top": f"mix{t}"} for t in "AB"),
    *({"type": "Reshape", "bottom": f"mix{t}", "top": f"tower_in{t}", "leading_dim": 6}
      for t in "AB"),
    *({"type": "InnerProduct", "bottom": f"tower_in{t}", "top": f"{t}_fc2",
       "fc_param": {"num_output": 1}} for t in "AB"),
    *({"type": "BinaryCrossEntropyLoss", "bottom": [f"{t}_fc2", f"label_{t}"],
       "top": f"loss_{t}"} for t in "AB"),
]  # fmt: skip

# HugeCTR's samples/bst: projections, masked multi-head attention over the behaviour sequence
# (its length is the dense feature), residual + LayerNorm, average pooling; plus an unmasked
# attention branch.
BST = [
    {"name": "seq", "type": "DistributedSlotSparseEmbeddingHash", "bottom": "seq_keys",
     "top": "seq", "sparse_embedding_hparam": {"embedding_vec_size": 8, "combiner": "sum"}},
    {"type": "SequenceMask", "bottom": ["dense", "dense"], "top": "mask",
     "max_sequence_len_from": 5, "max_sequence_len_to": 5},
    *({"type": "InnerProduct", "bottom": "seq", "top": name, "fc_param": {"num_output": 8}}
      for name in ("q", "k", "v")),
    {"type": "MultiHeadAttention", "bottom": ["q", "k", "v", "mask"], "top": "att",
     "num_attention_heads": 2, "transpose_b": False},
    {"type": "Add", "bottom": ["att", "seq"], "top": "res"},
    {"type": "LayerNorm", "bottom": "res", "top": "norm", "ln_param": {"eps": 1e-5}},
    {"type": "ReduceMean", "bottom": "norm", "top": "pooled_3d", "axis": 1},
    {"type": "Reshape", "bottom": "pooled_3d", "top": "pooled", "leading_dim": 8},
    {"type": "MultiHeadAttention", "bottom": ["q", "k", "v"], "top": "att2",
     "num_attention_heads": 4},
    {"type": "ReduceMean", "bottom": "att2", "top": "pooled2_3d", "axis": 1},
    {"type": "Reshape", "bottom": "pooled2_3d", "top": "pooled2", "leading_dim": 8},
    {"type": "Concat", "bottom": ["pooled", "pooled2"], "top": "features"},
    {"type": "InnerProduct", "bottom": "features", "top": "fc", "fc_param": {"num_output": 1}},
    {"type": "BinaryCrossEntropyLoss", "bottom": ["fc", "label"], "top": "loss"},
]  # fmt: skip


@pytest.fixture(scope="module")
def networks(tmp_path_factory):
    """(network file, dense file) for each fixture and for the every-layer network."""
    root = tmp_path_factory.mktemp("networks")
    every = root / "every_layer.json"
    every.write_text(network_text(EVERY_LAYER, dense_dim=6, sparse=SPARSE))
    dlrm_mlp = root / "dlrm_mlp.json"
    dlrm_mlp.write_text(network_text(DLRM_MLP, dense_dim=13, sparse=(("keys", 26, 1),)))
    din = root / "din.json"
    din.write_text(network_text(DIN, dense_dim=0, sparse=DIN_SPARSE))
    out = {}
    for path in [*FIXTURES, every, dlrm_mlp, din]:
        graph = build_graph(load_network_json(path))
        dense_file = root / f"{path.stem}_dense.model"
        write_dense_blob(random_dense_params(graph.dense_layout(), seed=11), dense_file)
        out[path.stem] = (path, dense_file)
    return out


def reference(path, dense_file, dense, pooled):
    return network_forward(path, np.fromfile(dense_file, dtype="<f4"), dense, pooled)


NAMES = [p.stem for p in FIXTURES] + ["every_layer", "dlrm_mlp", "din"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("batch", [1, 7, 33])
def test_fp32_matches_reference(networks, name, batch):
    path, dense_file = networks[name]
    executor = DenseExecutor.from_files(path, dense_file)
    dense, pooled = graph_inputs(executor.graph, batch, np.random.default_rng(batch))
    out = executor.forward(dense, pooled)
    assert out.shape == (batch, 1) and out.dtype == np.float32
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(
        out, reference(path, dense_file, dense, pooled), rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize(
    "name",
    [
        "every_layer", "wdl", "dcn",
        *(pytest.param(n, marks=requires_hugectr) for n in ("wdl_1gpu", "dcn_inference")),
    ],
)  # fmt: skip
def test_unpooled_inputs_are_pooled_per_slot(networks, name):
    path, dense_file = networks[name]
    executor = DenseExecutor.from_files(path, dense_file)
    rng = np.random.default_rng(3)
    batch = 5
    dense, _ = graph_inputs(executor.graph, batch, rng)
    unpooled, pooled = {}, {}
    for layer, layer_name in zip(executor.embedding_layers, executor.embedding_names, strict=True):
        values, offsets = random_csr(rng, batch * layer.slot_num, 3, layer.vec_size)
        unpooled[layer_name] = UnpooledEmbedding(0.3 * values, offsets)
        pooled[layer_name] = pool(0.3 * values, offsets, layer.slot_num, layer.combiner.value)
    out = executor.forward(dense, unpooled)
    np.testing.assert_allclose(
        out, reference(path, dense_file, dense, pooled), rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize("name", NAMES)
def test_fp16_accuracy_against_float64(networks, name, record_property):
    path, dense_file = networks[name]
    fp32 = DenseExecutor.from_files(path, dense_file)
    fp16 = DenseExecutor.from_files(path, dense_file, precision="fp16")
    dense, pooled = graph_inputs(fp32.graph, 64, np.random.default_rng(8))
    expected = reference(path, dense_file, dense, pooled)
    error16 = np.abs(fp16.forward(dense, pooled) - expected).max()
    error32 = np.abs(fp32.forward(dense, pooled) - expected).max()
    record_property("max_abs_error_fp16", float(error16))
    record_property("max_abs_error_fp32", float(error32))
    # Measured on these networks at batch 64: 1.6e-4 (DCN) to 6.6e-4 (DeepFM) on probabilities
    # for fp16, about 1e-7 for fp32. The second bound shows the fp16 path really is float16.
    assert error16 < 3e-3
    assert error32 < 1e-5
    assert error16 > 10 * error32
    assert fp16.forward(dense, pooled).dtype == np.float32


def test_a_padded_batch_scores_its_real_samples_as_alone(networks):
    """DIN (Dice takes statistics over the batch) given its embeddings for a batch padded to 8
    samples, 5 real, and the count: the real samples score as the batch of 5 alone, whatever
    the padding holds; without the count the padding changes them."""
    path, dense_file = networks["din"]
    executor = DenseExecutor.from_files(path, dense_file)
    assert executor.batch_dependent
    rng = np.random.default_rng(12)
    dense, pooled = graph_inputs(executor.graph, 8, rng)
    tops = dict(zip(executor.embedding_names, executor.embedding_tops(), strict=True))
    given = {tops[name]: value.copy() for name, value in pooled.items()}
    for value in given.values():
        value[5:] = 5 * rng.standard_normal(value[5:].shape)
    alone = executor.forward(dense[:5], {name: value[:5] for name, value in pooled.items()})
    got = executor.forward_given(dense, given, samples=np.array([5], np.int32))
    np.testing.assert_allclose(got[:5], alone, rtol=1e-6, atol=1e-7)
    unpadded = executor.forward_given(dense, given)
    assert np.abs(unpadded[:5] - alone).max() > 1e-4


def test_relu_fusion_keeps_results_and_skips_shared_outputs(networks):
    path, dense_file = networks["every_layer"]
    executor = DenseExecutor.from_files(path, dense_file)
    fused = {
        step.name: step.layer.fuse_relu
        for step in executor._steps
        if hasattr(step.layer, "fuse_relu")
    }
    # fc1 feeds both relu1 and add0, so it must not be fused; nothing else feeds a ReLU.
    assert fused == {"fc3d": False, "fc1": False, "fc2": False}
    # The exported DLRM: every ReLU follows the one InnerProduct it reads, so none is left.
    dlrm_path, dlrm_dense = networks["dlrm"]
    dlrm = DenseExecutor.from_files(dlrm_path, dlrm_dense)
    assert not [step.name for step in dlrm._steps if step.layer_type == "ReLU"]
    assert sum(getattr(step.layer, "fuse_relu", False) for step in dlrm._steps) >= 2


@requires_hugectr
def test_relu_fusion_in_hugectrs_dlrm(networks):
    dlrm_path, dlrm_dense = networks["dlrm_1gpu"]
    dlrm = DenseExecutor.from_files(dlrm_path, dlrm_dense)
    names = [step.name for step in dlrm._steps]
    assert "relu1" not in names and all(step.layer.fuse_relu for step in dlrm._steps[1:4])


def test_out_buffer_is_fully_written(networks):
    path, dense_file = networks["deepfm"]
    executor = DenseExecutor.from_files(path, dense_file)
    dense, pooled = graph_inputs(executor.graph, 9, np.random.default_rng(0))
    out = np.full((9, 1), np.nan, dtype=np.float32)
    assert executor.forward(dense, pooled, out=out) is out
    np.testing.assert_array_equal(out, executor.forward(dense, pooled))
    with pytest.raises(RequestError, match=r"out must be C-contiguous float32 \(9, 1\)"):
        executor.forward(dense, pooled, out=np.empty((9, 2), dtype=np.float32))


def test_request_errors_name_the_input(networks):
    path, dense_file = networks["wdl"]
    executor = DenseExecutor.from_files(path, dense_file)
    dense, pooled = graph_inputs(executor.graph, 4, np.random.default_rng(0))
    with pytest.raises(RequestError, match=r"dense input 'dense' must be numeric \[batch, 13\]"):
        executor.forward(dense[:, :12], pooled)
    with pytest.raises(RequestError, match=r"missing \['deep_embedding'\], unexpected \['x'\]"):
        executor.forward(dense, {"wide_embedding": pooled["wide_embedding"], "x": 1})
    short = dict(pooled, deep_embedding=pooled["deep_embedding"][:3])
    with pytest.raises(RequestError, match="'deep_embedding' has 3 samples, the dense input has 4"):
        executor.forward(dense, short)


def test_parameter_errors_name_the_layer(networks):
    path, _ = networks["dcn"]
    graph = build_graph(load_network_json(path))
    params = random_dense_params(graph.dense_layout())
    with pytest.raises(ModelFileError, match=r"'deep_fc1' .*needs 2 parameter tensors, got none"):
        DenseExecutor(graph, {k: v for k, v in params.items() if k != "deep_fc1"})
    fc2 = params["deep_fc2"]
    bad = dict(params, deep_fc2=(fc2[0].T[:, :5], fc2[1]))
    with pytest.raises(ModelFileError, match=r"'deep_fc2' .* weight must have shape \(64, 64\)"):
        DenseExecutor(graph, bad)
    with pytest.raises(ModelFileError, match=r"layers the network has not: \['fc9'\]"):
        DenseExecutor(graph, dict(params, fc9=()))


def test_unrunnable_networks_and_precisions_are_refused(networks, tmp_path):
    path, dense_file = networks["dcn"]
    with pytest.raises(ConfigError, match="unknown precision 'fp8'"):
        DenseExecutor.from_files(path, dense_file, precision="fp8")
    doc = json.loads(path.read_text())
    doc["layers"][5]["type"] = "Gather"
    name = doc["layers"][5]["name"]
    bad = tmp_path / "elu.json"
    bad.write_text(json.dumps(doc, indent=2))
    with pytest.raises(
        NotAvailableError, match=rf"elu.json:\d+ layers\[5\] '{name}'.type: type 'Gather'"
    ):
        DenseExecutor.from_files(bad, dense_file)


@pytest.mark.parametrize(
    ("precision", "tolerance"), [("fp32", 1e-5), ("tf32", 2e-3), ("fp16", 1e-2)]
)
def test_bst_attention_network_matches_reference(tmp_path, precision, tolerance):
    network = tmp_path / "bst.json"
    network.write_text(network_text(BST, dense_dim=1, sparse=(("seq_keys", 5, 1),)))
    graph = build_graph(load_network_json(network))
    params = random_dense_params(graph.dense_layout(), seed=5)
    dense_file = tmp_path / "bst_dense.model"
    write_dense_blob(params, dense_file)
    executor = DenseExecutor.from_files(network, dense_file, precision=precision)
    rng = np.random.default_rng(6)
    batch = 33
    _, pooled = graph_inputs(executor.graph, batch, rng)
    # Sequence lengths 0 .. 6: empty sequences (every query row masked) and full ones.
    lengths = rng.integers(0, 7, size=(batch, 1)).astype(np.float32) + 0.5
    out = executor.forward(lengths, pooled)
    want = reference(network, dense_file, lengths, pooled)
    np.testing.assert_allclose(out, want, rtol=tolerance, atol=tolerance)


def test_multi_task_network_predicts_every_task(tmp_path):
    text = network_text(MMOE, dense_dim=3, sparse=(("keys", 3, 1),))
    doc = json.loads(text)
    doc["layers"][0]["label"] = {"top": ["label_A", "label_B"], "label_dim": [1, 1]}
    network = tmp_path / "mmoe.json"
    network.write_text(json.dumps(doc, indent=2))
    graph = build_graph(load_network_json(network))
    assert graph.output == "multi_task_combined_pred" and graph.output_shape.dims == (2,)
    params = random_dense_params(graph.dense_layout(), seed=8)
    dense_file = tmp_path / "mmoe_dense.model"
    write_dense_blob(params, dense_file)
    executor = DenseExecutor.from_files(network, dense_file)
    dense, pooled = graph_inputs(executor.graph, 9, np.random.default_rng(9))
    out = executor.forward(dense, pooled)
    assert out.shape == (9, 2)
    np.testing.assert_allclose(
        out, reference(network, dense_file, dense, pooled), rtol=1e-5, atol=1e-6
    )


# NVIDIA's onnx-converter DLRM test network: BatchNorm after fully connected layers.
BATCH_NORM = [
    {"type": "InnerProduct", "bottom": "dense", "top": "fc1", "fc_param": {"num_output": 9}},
    {"type": "BatchNorm", "bottom": "fc1", "top": "bn1",
     "bn_param": {"factor": 1.0, "eps": 1e-5, "gamma_init": "Ones", "beta_init": "Zeros"}},
    {"type": "ReLU", "bottom": "bn1", "top": "relu1"},
    {"type": "InnerProduct", "bottom": "relu1", "top": "fc2", "fc_param": {"num_output": 5}},
    {"type": "BatchNorm", "bottom": "fc2", "top": "bn2", "bn_param": {"factor": 1.0, "eps": 1e-3}},
    {"type": "InnerProduct", "bottom": "bn2", "top": "fc3", "fc_param": {"num_output": 1}},
    {"type": "BinaryCrossEntropyLoss", "bottom": ["fc3", "label"], "top": "loss"},
]  # fmt: skip


@pytest.fixture
def batch_norm_files(tmp_path):
    network = tmp_path / "bn.json"
    network.write_text(network_text(BATCH_NORM, dense_dim=6, sparse=()))
    graph = build_graph(load_network_json(network))
    layout = graph.dense_layout()
    dense_file = tmp_path / "bn_dense.model"
    write_dense_blob(random_dense_params(layout, seed=4), dense_file, layout)
    return network, dense_file


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16"])
def test_batch_norm_uses_the_running_statistics_of_the_ntp_file(batch_norm_files, precision):
    network, dense_file = batch_norm_files
    ntp = dense_file.with_name(dense_file.name + ".ntp.json")
    entries = json.loads(ntp.read_text())["layers"]
    assert [e["type"] for e in entries] == ["BatchNorm", "BatchNorm"]
    assert len(entries[0]["mean"]) == 9 and len(entries[1]["var"]) == 5
    # gamma and beta are in the dense file; mean and var are not.
    assert dense_file.stat().st_size == 4 * (6 * 9 + 9 + 2 * 9 + 9 * 5 + 5 + 2 * 5 + 5 + 1)
    executor = DenseExecutor.from_files(network, dense_file, precision=precision)
    dense = np.random.default_rng(1).standard_normal((17, 6)).astype(np.float32)
    want = network_forward(network, np.fromfile(dense_file, "<f4"), dense, {}, ntp)
    tolerance = {"fp32": 1e-5, "tf32": 1e-3, "fp16": 5e-3}[precision]
    np.testing.assert_allclose(executor.forward(dense, {}), want, rtol=tolerance, atol=tolerance)


def test_missing_or_wrong_ntp_file_names_the_problem(batch_norm_files):
    network, dense_file = batch_norm_files
    ntp = dense_file.with_name(dense_file.name + ".ntp.json")
    entries = json.loads(ntp.read_text())["layers"]
    ntp.write_text(json.dumps({"layers": entries[:1]}))
    with pytest.raises(ModelFileError, match="holds 1 layer entries, the network has 2"):
        DenseExecutor.from_files(network, dense_file)
    entries[1]["var"] = entries[1]["var"][:-1]
    ntp.write_text(json.dumps({"layers": entries}))
    with pytest.raises(ModelFileError, match=r"layers\[1\].var must be 5 numbers"):
        DenseExecutor.from_files(network, dense_file)
    ntp.unlink()
    with pytest.raises(ModelFileError, match="cannot read the running statistics of 'bn1'"):
        DenseExecutor.from_files(network, dense_file)


def test_non_trainable_params_file_names_where_the_statistics_are(batch_norm_files):
    """ps.json's non_trainable_params_file is read instead of ``<dense>.ntp.json``."""
    network, dense_file = batch_norm_files
    layout = build_graph(load_network_json(network)).dense_layout()
    beside = dense_file.with_name(dense_file.name + ".ntp.json")
    entries = json.loads(beside.read_text())["layers"]
    moved = beside.with_name("elsewhere.json")
    entries[0]["mean"] = [m + 1.0 for m in entries[0]["mean"]]
    moved.write_text(json.dumps({"layers": entries}))
    bn1 = 2  # gamma, beta, then the running mean
    default = read_dense_blob(dense_file, layout)["bn1"][bn1]
    given = read_dense_blob(dense_file, layout, moved)["bn1"][bn1]
    np.testing.assert_allclose(given, default + 1.0, rtol=1e-6)
    beside.unlink()
    moved.write_text(json.dumps({"layers": entries[:1]}))
    with pytest.raises(ModelFileError, match=r"elsewhere\.json: holds 1 layer entries"):
        read_dense_blob(dense_file, layout, moved)


def test_cross_entropy_loss_is_a_softmax_and_reduce_mean_defaults_to_axis_1(tmp_path):
    layers = [
        {"type": "InnerProduct", "bottom": "dense", "top": "fc", "fc_param": {"num_output": 6}},
        {"type": "Reshape", "bottom": "fc", "top": "fc3d", "leading_dim": 3, "time_step": 2},
        {"type": "ReduceMean", "bottom": "fc3d", "top": "mean3d"},  # no axis: HugeCTR's 1
        {"type": "Reshape", "bottom": "mean3d", "top": "logits", "leading_dim": 3},
        {"type": "CrossEntropyLoss", "bottom": ["logits", "label"], "top": "loss"},
    ]
    network = tmp_path / "ce.json"
    network.write_text(network_text(layers, dense_dim=4, sparse=()))
    graph = build_graph(load_network_json(network))
    assert graph.output_shape.dims == (3,)
    dense_file = tmp_path / "ce_dense.model"
    write_dense_blob(random_dense_params(graph.dense_layout(), seed=2), dense_file)
    executor = DenseExecutor.from_files(network, dense_file)
    dense = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    out = executor.forward(dense, {})
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(out, reference(network, dense_file, dense, {}), rtol=1e-5, atol=1e-7)
