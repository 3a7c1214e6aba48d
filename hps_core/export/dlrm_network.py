"""A ``DLRM_Net`` as a HugeCTR network: the graph JSON and the dense parameters in its layout.

Tables and embedding layers (the mapping a ranking session relies on):
    dlrm table ``t`` (``emb_l[t]``) becomes sparse input ``data{t}`` of the ``Data`` layer
    (``slot_num`` 1, ``nnz_per_slot`` its most keys per sample) feeding its own embedding layer
    ``sparse_embedding{t}`` (``LocalizedSlotSparseEmbeddingHash``, combiner ``sum``), and
    ``sparse_files[t]`` of the ps.json. Embedding layers appear in table order, which is
    HugeCTR's rule for matching ps.json tables to embedding layers
    (:attr:`hps_core.nn.NetworkGraph.embeddings`), and their names equal HugeCTR's default
    table names, so matching by order or by name gives the same answer. A ``Concat`` on axis 1
    stacks the ``[B, 1, D]`` outputs into ``[B, tables, D]`` for the ``Interaction`` layer
    (left out for a single table). The embedding layers come right after ``Data``: HugeCTR's
    inference parser takes the layers up to the first non-embedding one as the embeddings.
    One embedding layer with ``slot_num`` = tables would put every table into one ps.json
    table, so each dlrm table gets its own instead.

Dense layers:
    ``bot_fc{i}`` + ``bot_relu{i}`` for every Linear of ``bot_l`` (dlrm ends the bottom MLP
    with a ReLU too), ``interaction``, ``top_fc{i}`` + ``top_relu{i}``, and ``sigmoid`` after
    the last ``top_fc``. PyTorch's Linear weight is ``[out, in]``; HugeCTR's InnerProduct
    weight is ``[in, out]`` and its bias ``[1, out]``.

Interaction layout:
    dlrm's ``interact_features`` returns the bottom MLP output ``x`` followed by the dot
    products ``Z[i, j]`` for ``i > j`` in row-major order (``li``/``lj``). HugeCTR's
    Interaction (``gather_concat_fprop_kernel`` in fp32, ``dotBasedInteractFwdKernel`` in
    fp16) writes ``x``, the same strictly lower triangle in the same order, then one padding
    column (``D + n(n-1)/2 + 1`` wide). :func:`interaction_source_rows` maps each HugeCTR
    column to dlrm's; the first top-layer weight gets its rows from that map and a zero row
    for the padding column.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hps_core.config import default_table_name
from hps_core.export.dlrm_arch import DlrmArch
from hps_core.nn import DenseLayout, DenseParams

DENSE_INPUT = "dense"
LABEL = "label"
INTERACTION = "interaction"
PREDICTION = "sigmoid"
_STACKED_EMBEDDINGS = "embeddings"


def sparse_input_name(table: int) -> str:
    """Name of the ``Data`` sparse input that carries the keys of ``table``."""
    return f"data{table}"


def embedding_layer_name(table: int) -> str:
    """Name of the embedding layer of ``table`` (HugeCTR's default ps.json table name)."""
    return default_table_name(table)


def interaction_source_rows(num_vectors: int, dim: int) -> np.ndarray:
    """For each column of HugeCTR's Interaction output, the dlrm column it holds.

    Args:
        num_vectors: ``n``, the bottom MLP output plus one vector per table.
        dim: ``D``.

    Returns:
        int64 ``[D + n(n-1)/2 + 1]``: the index into dlrm's ``[D + n(n-1)/2]`` interaction
        output, or -1 for HugeCTR's padding column.

    Example:
        >>> interaction_source_rows(3, 2).tolist()
        [0, 1, 2, 3, 4, -1]
    """
    # dlrm: li = [i for i in range(n) for j in range(i)], lj likewise with j.
    dlrm_pairs = [(i, j) for i in range(num_vectors) for j in range(i)]
    dlrm_column = {pair: dim + k for k, pair in enumerate(dlrm_pairs)}
    # HugeCTR: pair (i, j), j < i, is at offset i (i - 1) / 2 + j after the D copied columns.
    rows, cols = np.tril_indices(num_vectors, k=-1)
    hugectr_pairs = sorted(zip(rows.tolist(), cols.tolist(), strict=True), key=_hugectr_offset)
    return np.array(
        [*range(dim), *(dlrm_column[pair] for pair in hugectr_pairs), -1], dtype=np.int64
    )


def _hugectr_offset(pair: tuple[int, int]) -> int:
    i, j = pair
    return i * (i - 1) // 2 + j


def dlrm_network_json(arch: DlrmArch, max_keys_per_table: Sequence[int]) -> dict[str, Any]:
    """The HugeCTR network JSON document (graph form) of ``arch``.

    Args:
        arch: the model.
        max_keys_per_table: most keys one sample looks up in each table (``nnz_per_slot``).

    Returns:
        A JSON-serialisable dict with a ``layers`` array.
    """
    tables = range(arch.num_tables)
    data = {
        "name": "data",
        "type": "Data",
        "label": {"top": LABEL, "label_dim": arch.label_dim},
        "dense": {"top": DENSE_INPUT, "dense_dim": arch.dense_dim},
        "sparse": [
            {
                "top": sparse_input_name(t),
                "slot_num": 1,
                "is_fixed_length": False,
                "nnz_per_slot": int(max_keys_per_table[t]),
            }
            for t in tables
        ],
    }
    layers: list[dict[str, Any]] = [data]
    for t in tables:
        layers.append(
            {
                "name": embedding_layer_name(t),
                "type": "LocalizedSlotSparseEmbeddingHash",
                "bottom": sparse_input_name(t),
                "top": embedding_layer_name(t),
                "sparse_embedding_hparam": {
                    "embedding_vec_size": arch.sparse_feature_size,
                    "combiner": "sum",
                },
            }
        )
    embeddings = embedding_layer_name(0)
    if arch.num_tables > 1:
        embeddings = _STACKED_EMBEDDINGS
        layers.append(
            {
                "name": embeddings,
                "type": "Concat",
                "bottom": [embedding_layer_name(t) for t in tables],
                "top": embeddings,
                "axis": 1,
            }
        )
    bottom_out = _mlp(layers, "bot", DENSE_INPUT, arch.bottom_mlp[1:], last_relu=True)
    layers.append(
        {
            "name": INTERACTION,
            "type": "Interaction",
            "bottom": [bottom_out, embeddings],
            "top": INTERACTION,
        }
    )
    top_out = _mlp(layers, "top", INTERACTION, arch.top_mlp, last_relu=False)
    layers.append({"name": PREDICTION, "type": "Sigmoid", "bottom": top_out, "top": PREDICTION})
    return {"layers": layers}


def _mlp(
    layers: list[dict[str, Any]], part: str, bottom: str, widths: Sequence[int], last_relu: bool
) -> str:
    """Append InnerProduct (+ ReLU) layers; return the name of the last top."""
    for i, width in enumerate(widths):
        fc = f"{part}_fc{i}"
        layers.append(
            {
                "name": fc,
                "type": "InnerProduct",
                "bottom": bottom,
                "top": fc,
                "fc_param": {"num_output": int(width)},
            }
        )
        bottom = fc
        if last_relu or i < len(widths) - 1:
            relu = f"{part}_relu{i}"
            layers.append({"name": relu, "type": "ReLU", "bottom": fc, "top": relu})
            bottom = relu
    return bottom


def hugectr_dense_params(
    arch: DlrmArch, dense: Mapping[str, np.ndarray], layout: DenseLayout
) -> DenseParams:
    """Convert the MLP tensors of a ``DLRM_Net`` to HugeCTR's dense layout.

    Args:
        arch: the model.
        dense: the MLP tensors by state-dict key, PyTorch layout (``bot_l.0.weight``
            ``[out, in]``, ``bot_l.0.bias`` ``[out]``, ...), already checked against ``arch``.
        layout: the dense layout of :func:`dlrm_network_json`'s graph, which fixes the order.

    Returns:
        HugeCTR layer name -> ``(weight [in, out], bias [1, out])`` float32, in ``layout``
        order, ready for :func:`hps_core.nn.write_dense_blob`.
    """
    converted: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for part, mlp in (("bot", "bot_l"), ("top", "top_l")):
        for i, prefix in enumerate(arch.linear_prefixes(mlp)):
            weight = np.asarray(dense[f"{prefix}.weight"], dtype=np.float32).T
            bias = np.asarray(dense[f"{prefix}.bias"], dtype=np.float32).reshape(1, -1)
            if part == "top" and i == 0:
                weight = _interaction_weight(arch, weight)
            converted[f"{part}_fc{i}"] = (np.ascontiguousarray(weight), bias)
    return {layer.layer: converted[layer.layer] for layer in layout.layers}


def _interaction_weight(arch: DlrmArch, weight: np.ndarray) -> np.ndarray:
    """Rows of the first top-layer weight ``[dlrm width, out]`` in HugeCTR's input order."""
    source = interaction_source_rows(arch.num_vectors, arch.sparse_feature_size)
    out = np.zeros((source.size, weight.shape[1]), dtype=np.float32)
    present = source >= 0
    out[present] = weight[source[present]]
    return out
