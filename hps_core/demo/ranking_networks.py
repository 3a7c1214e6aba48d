"""Network files of the demo DCN and W&D, in the form HugeCTR's ``graph_to_json`` writes.

Both read Criteo-shaped samples: 13 dense features and 26 categorical slots; W&D adds two
crossed "wide" slots. Sizes are small so the CPU machine serves them quickly, but the
structure is that of HugeCTR's samples (the demo DLRM is an exported PyTorch model, see
:mod:`hps_core.demo.dlrm`):

- DCN: multi-hot embeddings (up to 2 keys per slot, mean), a 3-layer ``MultiCross`` next to a
  deep MLP, both from one ``Slice`` of the concatenated input.
- W&D: a wide table of vector size 1 (2 one-hot slots, summed to a logit) and a deep table
  (26 multi-hot slots, sum) feeding an MLP; the two logits are added. The wide embedding
  comes first in the file, so it is table 0 of the ps.json.
"""

from __future__ import annotations

from typing import Any

DENSE_DIM = 13
SLOTS = 26
VEC_SIZE = 16

Layer = dict[str, Any]


def _data(sparse: list[tuple[str, int, int]]) -> Layer:
    """The Data layer with ``(top, slot_num, nnz_per_slot)`` sparse inputs."""
    return {
        "name": "data",
        "type": "Data",
        "label": {"top": "label", "label_dim": 1},
        "dense": {"top": "dense", "dense_dim": DENSE_DIM},
        "sparse": [
            {"top": top, "slot_num": slots, "is_fixed_length": nnz == 1, "nnz_per_slot": nnz}
            for top, slots, nnz in sparse
        ],
    }


def _layer(name: str, kind: str, bottom: str | list[str], **fields: Any) -> Layer:
    """A layer whose top is its name (``top`` in ``fields`` overrides)."""
    return {"name": name, "type": kind, "bottom": bottom, "top": name, **fields}


def _embedding(name: str, kind: str, bottom: str, vec_size: int, combiner: str) -> Layer:
    hparam = {"embedding_vec_size": vec_size, "combiner": combiner}
    return _layer(name, kind, bottom, sparse_embedding_hparam=hparam)


def _mlp(bottom: str, widths: list[int], prefix: str, relu_last: bool) -> tuple[list[Layer], str]:
    """InnerProduct (+ ReLU) layers; returns them and the name of the last top."""
    layers: list[Layer] = []
    for i, width in enumerate(widths, 1):
        fc = f"{prefix}fc{i}"
        layers.append(_layer(fc, "InnerProduct", bottom, fc_param={"num_output": width}))
        bottom = fc
        if relu_last or i < len(widths):
            bottom = f"{prefix}relu{i}"
            layers.append(_layer(bottom, "ReLU", fc))
    return layers, bottom


def _loss(bottom: str) -> Layer:
    return _layer("loss", "BinaryCrossEntropyLoss", [bottom, "label"])


def dcn_network() -> dict[str, Any]:
    """DCN: ``(B, 13)`` dense and 26 multi-hot slots (mean) -> ``(B, 1)``."""
    width = SLOTS * VEC_SIZE + DENSE_DIM
    both = [[0, width], [0, width]]  # two copies: HugeCTR reads each tensor once
    deep, deep_out = _mlp("slice12", [64, 64], "deep_", relu_last=True)
    embedding = "DistributedSlotSparseEmbeddingHash"
    return {
        "layers": [
            _data([("data1", SLOTS, 2)]),
            _embedding("sparse_embedding1", embedding, "data1", VEC_SIZE, "mean"),
            _layer("reshape1", "Reshape", "sparse_embedding1", leading_dim=SLOTS * VEC_SIZE),
            _layer("concat1", "Concat", ["reshape1", "dense"]),
            _layer("slice1", "Slice", "concat1", top=["slice11", "slice12"], ranges=both),
            _layer("multicross1", "MultiCross", "slice11", mc_param={"num_layers": 3}),
            *deep,
            _layer("concat2", "Concat", ["multicross1", deep_out]),
            _layer("fc_out", "InnerProduct", "concat2", fc_param={"num_output": 1}),
            _loss("fc_out"),
        ]
    }


def wdl_network() -> dict[str, Any]:
    """Wide & Deep: ``(B, 13)`` dense, 2 wide and 26 deep multi-hot slots -> ``(B, 1)``."""
    deep, deep_out = _mlp("concat1", [64, 32, 1], "deep_", relu_last=False)
    embedding = "DistributedSlotSparseEmbeddingHash"
    return {
        "layers": [
            _data([("wide_data", 2, 1), ("deep_data", SLOTS, 2)]),
            _embedding("wide_embedding", embedding, "wide_data", 1, "sum"),
            _embedding("deep_embedding", embedding, "deep_data", VEC_SIZE, "sum"),
            _layer("reshape1", "Reshape", "deep_embedding", leading_dim=SLOTS * VEC_SIZE),
            _layer("concat1", "Concat", ["reshape1", "dense"]),
            *deep,
            _layer("reshape2", "Reshape", "wide_embedding", leading_dim=2),
            _layer("wide_sum", "ReduceSum", "reshape2", axis=1),
            _layer("add1", "Add", [deep_out, "wide_sum"]),
            _loss("add1"),
        ]
    }
