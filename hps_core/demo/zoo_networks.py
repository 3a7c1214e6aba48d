"""Network files of HugeCTR's sample models beyond DLRM, DCN and W&D, small and in the form
HugeCTR's ``graph_to_json`` writes them (``hps prepare --zoo``).

Each follows the structure of the sample of the same name in HugeCTR's ``samples/``:

- ``dlrm_mlp``: DLRM as HugeCTR's ``samples/dlrm`` builds it, bottom and top MLPs as fused
  ``MLP`` layers around the dot ``Interaction``;
- ``dlrm_v2``: MLPerf's DLRM-v2 (DLRM-DCNv2) as HugeCTR's ``samples/dlrm/train.py`` builds it:
  26 multi-hot tables of a fixed hotness each (MLPerf's), the bottom ``MLP``, the embeddings
  and its output concatenated, a low-rank ``MultiCross`` (DCN v2), the top ``MLP``
  (:func:`dlrm_v2_network` builds it at any size; ``benchmarks/make_large_dlrm.py --dcnv2``
  at MLPerf's);
- ``din``: Deep Interest Network: goods and categories of 4 past behaviours plus the target
  (``FusedReshapeConcat``), an attention unit with ``PReLU_Dice`` activations whose scores go
  through ``Softmax`` and weight the history (``Scale``, ``ElementwiseMultiply``,
  ``ReduceSum``), then a Dice MLP;
- ``bst``: Behaviour Sequence Transformer: Q/K/V projections, ``MultiHeadAttention`` masked by
  the sequence length (``SequenceMask`` of the first dense feature), residual and
  ``LayerNorm``, average pooling (``ReduceMean``);
- ``mmoe``: Multi-gate Mixture of Experts, two tasks: experts, a ``Softmax`` gate per task
  (``MatrixMultiply`` mixes the experts), a tower and a loss per task, so two predictions;
- ``ncf``: NeuMF: a GMF branch (``ElementwiseMultiply`` of user and item vectors) beside an
  MLP branch;
- ``shared_bottom``: the shared-bottom multi-task model of HugeCTR's
  ``samples/mmoe/shared_bottom.py``: shared fully connected layers with ``Dropout``, a
  ``Slice`` that hands the same tensor to two towers, and two labels (``label_dim`` ``[1, 1]``),
  so two predictions. As in that sample, tower A's ``Dropout`` reads its fully connected layer
  and not the ReLU beside it, whose output nothing reads.

All read 13 dense features (BST's first one is the sequence length) and one-hot slots, but
``dlrm_v2``, whose slots hold MLPerf's fixed numbers of keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hps_core.config import default_table_name
from hps_core.demo.ranking_networks import _data, _embedding, _layer, _loss, _mlp

Layer = dict[str, Any]
_EMBEDDING = "DistributedSlotSparseEmbeddingHash"

MLPERF_V2_HOTNESS = (
    3,
    2,
    1,
    2,
    6,
    1,
    1,
    1,
    1,
    7,
    3,
    8,
    1,
    6,
    9,
    5,
    1,
    1,
    1,
    12,
    100,
    27,
    10,
    3,
    1,
    1,
)
"""Keys per sample of each of MLPerf DLRM-v2's 26 tables (its multi-hot Criteo 1TB)."""


def dlrm_mlp_network() -> dict[str, Any]:
    """DLRM with fused MLP layers: 13 dense, 26 one-hot slots of dim 16 -> ``(B, 1)``."""
    return {
        "layers": [
            _data([("data1", 26, 1)]),
            _embedding("sparse_embedding1", _EMBEDDING, "data1", 16, "sum"),
            _layer("mlp1", "MLP", "dense", mlp_param={
                "num_output": 16, "num_outputs": [64, 32, 16], "use_bias": True,
                "activation": "Relu"}),
            _layer("interaction1", "Interaction", ["mlp1", "sparse_embedding1"]),
            _layer("mlp2", "MLP", "interaction1", mlp_param={
                "num_output": 1, "num_outputs": [64, 32, 1], "use_bias": True,
                "activations": ["Relu", "Relu", "None"]}),
            _loss("mlp2"),
        ]
    }  # fmt: skip


def dlrm_v2_network(
    dim: int = 16,
    hotness: Sequence[int] = MLPERF_V2_HOTNESS,
    bottom: Sequence[int] = (64, 32, 16),
    top: Sequence[int] = (64, 32, 1),
    cross_layers: int = 3,
    projection_dim: int = 32,
) -> dict[str, Any]:
    """MLPerf DLRM-v2: 13 dense features, one table per sparse input of ``hotness[t]`` keys
    in every sample (``is_fixed_length``, summed) -> ``(B, top[-1])``.

    The layers of HugeCTR's ``samples/dlrm/train.py`` (MLPerf's defaults: ``dim`` 128, bottom
    ``512, 256, 128``, top ``1024, 1024, 512, 256, 1``, 3 cross layers of projection 512),
    written as a network file can hold them: one ``LocalizedSlotSparseEmbeddingHash`` per
    table where the sample has an ``EmbeddingCollection``, their outputs stacked (``Concat`` on
    axis 1) and flattened (``Reshape``), then ``Concat`` with the bottom MLP's output (the
    embeddings first, as in the sample), ``MultiCross`` with ``projection_dim`` (DCN v2), the
    top ``MLP`` (no activation on its last layer) and the loss, which inference turns into a
    sigmoid.
    """
    tables = range(len(hotness))
    data = _data([(f"data{t}", 1, h) for t, h in zip(tables, hotness, strict=True)])
    for sparse in data["sparse"]:
        sparse["is_fixed_length"] = True
    names = [default_table_name(t) for t in tables]
    activations = ["Relu"] * (len(top) - 1) + ["None"]
    return {
        "layers": [
            data,
            *(_embedding(names[t], "LocalizedSlotSparseEmbeddingHash", f"data{t}", dim, "sum")
              for t in tables),
            _layer("embeddings", "Concat", names, axis=1),
            _layer("embeddings_flat", "Reshape", "embeddings", leading_dim=len(hotness) * dim),
            _layer("mlp1", "MLP", "dense", mlp_param={
                "num_output": bottom[-1], "num_outputs": list(bottom), "use_bias": True,
                "activation": "Relu"}),
            _layer("concat1", "Concat", ["embeddings_flat", "mlp1"]),
            _layer("interaction1", "MultiCross", "concat1", mc_param={
                "num_layers": cross_layers, "projection_dim": projection_dim}),
            _layer("mlp2", "MLP", "interaction1", mlp_param={
                "num_output": top[-1], "num_outputs": list(top), "use_bias": True,
                "activations": activations}),
            _loss("mlp2"),
        ]
    }  # fmt: skip


def din_network() -> dict[str, Any]:
    """DIN: a user, 5 goods and 5 categories (4 behaviours + the target) -> ``(B, 1)``."""
    dice = {"alpha": 0.2, "eps": 1e-8}
    return {
        "layers": [
            _data([("user", 1, 1), ("good", 5, 1), ("cate", 5, 1)]),
            _embedding("user_emb", _EMBEDDING, "user", 8, "sum"),
            _embedding("good_emb", _EMBEDDING, "good", 8, "sum"),
            _embedding("cate_emb", _EMBEDDING, "cate", 8, "sum"),
            _layer("split", "FusedReshapeConcat", ["good_emb", "cate_emb"], top=["his", "item"]),
            _layer("item_rep", "Scale", "item", scale_param={"axis": 1, "factor": 4.0}),
            _layer("sub", "Sub", ["item_rep", "his"]),
            _layer("mul", "ElementwiseMultiply", ["item_rep", "his"]),
            _layer("att_in", "Concat", ["item_rep", "his", "sub", "mul"]),
            _layer("att_fc1", "InnerProduct", "att_in", fc_param={"num_output": 16}),
            _layer("att_dice1", "PReLU_Dice", "att_fc1", prelu_dice_param=dice),
            _layer("att_fc2", "InnerProduct", "att_dice1", fc_param={"num_output": 1}),
            _layer("scores", "Reshape", "att_fc2", leading_dim=4),
            _layer("weights", "Softmax", "scores", factor=1.0),
            _layer("weights_rep", "Scale", "weights", scale_param={"axis": 0, "factor": 16.0}),
            _layer("his_flat", "Reshape", "his", leading_dim=64),
            _layer("weighted", "ElementwiseMultiply", ["weights_rep", "his_flat"]),
            _layer("weighted_3d", "Reshape", "weighted", leading_dim=16, time_step=4),
            _layer("pooled_3d", "ReduceSum", "weighted_3d", axis=1),
            _layer("pooled", "Reshape", "pooled_3d", leading_dim=16),
            _layer("user_flat", "Reshape", "user_emb", leading_dim=8),
            _layer("features", "Concat", ["user_flat", "item", "pooled"]),
            _layer("fc1", "InnerProduct", "features", fc_param={"num_output": 32}),
            _layer("dice1", "PReLU_Dice", "fc1", prelu_dice_param=dice),
            _layer("fc2", "InnerProduct", "dice1", fc_param={"num_output": 1}),
            _loss("fc2"),
        ]
    }  # fmt: skip


def bst_network() -> dict[str, Any]:
    """BST: a behaviour sequence of 6 one-hot slots whose length is the first dense feature,
    and 26 other slots -> ``(B, 1)``."""
    return {
        "layers": [
            _data([("seq", 6, 1), ("other", 26, 1)]),
            _embedding("seq_emb", _EMBEDDING, "seq", 16, "sum"),
            _embedding("other_emb", _EMBEDDING, "other", 4, "sum"),
            _layer("lengths", "Slice", "dense", top=["len_from", "len_to", "features"],
                   ranges=[[0, 1], [0, 1], [1, 13]]),
            _layer("mask", "SequenceMask", ["len_from", "len_to"],
                   max_sequence_len_from=6, max_sequence_len_to=6),
            *(_layer(name, "InnerProduct", "seq_emb", fc_param={"num_output": 16})
              for name in ("query", "key", "value")),
            _layer("attention", "MultiHeadAttention", ["query", "key", "value", "mask"],
                   num_attention_heads=2, transpose_b=False),
            _layer("residual", "Add", ["attention", "seq_emb"]),
            _layer("norm", "LayerNorm", "residual", ln_param={"eps": 1e-5}),
            _layer("pooled_3d", "ReduceMean", "norm", axis=1),
            _layer("pooled", "Reshape", "pooled_3d", leading_dim=16),
            _layer("other_flat", "Reshape", "other_emb", leading_dim=26 * 4),
            _layer("concat1", "Concat", ["pooled", "other_flat", "features"]),
            *_mlp("concat1", [64, 32, 1], "", relu_last=False)[0],
            _loss("fc3"),
        ]
    }  # fmt: skip


def mmoe_network() -> dict[str, Any]:
    """MMoE: 13 dense and 26 one-hot slots, 3 experts, tasks A and B -> ``(B, 2)``."""
    experts = [f"expert{i}" for i in range(3)]
    layers: list[Layer] = [
        _data([("data1", 26, 1)]),
        _embedding("sparse_embedding1", _EMBEDDING, "data1", 4, "sum"),
        _layer("flat", "Reshape", "sparse_embedding1", leading_dim=26 * 4),
        _layer("x", "Concat", ["flat", "dense"]),
    ]
    for e in experts:
        layers += [
            _layer(e, "InnerProduct", "x", fc_param={"num_output": 16}),
            _layer(f"{e}_relu", "ReLU", e),
            _layer(f"{e}_3d", "Reshape", f"{e}_relu", leading_dim=16, time_step=1),
        ]
    layers.append(_layer("experts", "Concat", [f"{e}_3d" for e in experts], axis=1))
    for task in "AB":
        layers += [
            _layer(f"{task}_gate_fc", "InnerProduct", "x", fc_param={"num_output": 3}),
            _layer(f"{task}_gate", "Softmax", f"{task}_gate_fc"),
            _layer(f"{task}_gate_3d", "Reshape", f"{task}_gate", leading_dim=3, time_step=1),
            _layer(f"{task}_mix", "MatrixMultiply", [f"{task}_gate_3d", "experts"]),
            _layer(f"{task}_tower_in", "Reshape", f"{task}_mix", leading_dim=16),
            _layer(f"{task}_fc1", "InnerProduct", f"{task}_tower_in", fc_param={"num_output": 8}),
            _layer(f"{task}_relu1", "ReLU", f"{task}_fc1"),
            _layer(f"{task}_fc2", "InnerProduct", f"{task}_relu1", fc_param={"num_output": 1}),
        ]
    layers += [
        _layer(f"{task}_loss", "BinaryCrossEntropyLoss", [f"{task}_fc2", "label"]) for task in "AB"
    ]
    return {"layers": layers}


def ncf_network() -> dict[str, Any]:
    """NeuMF: one-hot user and item, GMF and MLP branches -> ``(B, 1)``."""
    mlp, mlp_out = _mlp("mlp_in", [32, 16], "mlp_", relu_last=True)
    return {
        "layers": [
            _data([("user", 1, 1), ("item", 1, 1)]),
            *(_embedding(f"{name}_emb", _EMBEDDING, name, 16, "sum") for name in ("user", "item")),
            _layer("user_flat", "Reshape", "user_emb", leading_dim=16),
            _layer("item_flat", "Reshape", "item_emb", leading_dim=16),
            _layer("gmf", "ElementwiseMultiply", ["user_flat", "item_flat"]),
            _layer("mlp_in", "Concat", ["user_flat", "item_flat"]),
            *mlp,
            _layer("neumf", "Concat", ["gmf", mlp_out]),
            _layer("fc_out", "InnerProduct", "neumf", fc_param={"num_output": 1}),
            _loss("fc_out"),
        ]
    }  # fmt: skip


def shared_bottom_network() -> dict[str, Any]:
    """Shared bottom, towers A and B (HugeCTR's ``samples/mmoe/shared_bottom.py``) -> ``(B, 2)``."""
    data = _data([("data1", 26, 1)])
    data["label"] = {"top": ["label_a", "label_b"], "label_dim": [1, 1]}
    layers: list[Layer] = [
        data,
        _embedding("sparse_embedding1", _EMBEDDING, "data1", 4, "sum"),
        _layer("flat", "Reshape", "sparse_embedding1", leading_dim=26 * 4),
        _layer("x", "Concat", ["flat", "dense"]),
        _layer("shared1", "InnerProduct", "x", fc_param={"num_output": 32}),
        _layer("relu1", "ReLU", "shared1"),
        _layer("dropout1", "Dropout", "relu1", rate=0.5),
        _layer("shared2", "InnerProduct", "dropout1", fc_param={"num_output": 16}),
        _layer("relu2", "ReLU", "shared2"),
        _layer("dropout2", "Dropout", "relu2", rate=0.5),
        _layer("slice", "Slice", "dropout2", top=["slice_a", "slice_b"], ranges=[[0, 16], [0, 16]]),
    ]
    for task in "ab":
        # The sample's tower A drops out its fully connected layer's output, not the ReLU's.
        dropped = f"{task}_fc1" if task == "a" else f"{task}_relu1"
        layers += [
            _layer(f"{task}_fc1", "InnerProduct", f"slice_{task}", fc_param={"num_output": 8}),
            _layer(f"{task}_relu1", "ReLU", f"{task}_fc1"),
            _layer(f"{task}_dropout1", "Dropout", dropped, rate=0.5),
            _layer(f"{task}_out", "InnerProduct", f"{task}_dropout1", fc_param={"num_output": 1}),
        ]
    layers += [
        _layer(f"loss_{task}", "BinaryCrossEntropyLoss", [f"{task}_out", f"label_{task}"])
        for task in "ab"
    ]
    return {"layers": layers}
