"""The PyTorch DLRM that hps-triton is measured against, built from the same HugeCTR files.

Every table whole on the GPU (``nn.EmbeddingBag`` per table, one key per slot), the bottom MLP,
HugeCTR's dot interaction (the bottom output and the embeddings stacked, their Gram matrix,
its strictly lower triangle row by row, one zero), the top MLP and a sigmoid, with the weights
of the model's dense file: the same function hps-triton serves. Used in process by
``ranking_vs_pytorch.py`` and as a Triton Python-backend model by
``ranking_serve_vs_pytorch.py`` (``triton_peer/model.py``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from hps_core.config import load_ps_config
from hps_core.formats.sparse import read_sparse_table
from hps_core.infer import load_ranking_graph
from hps_core.nn import read_dense_blob


class TorchDlrm(torch.nn.Module):
    """HugeCTR's DLRM graph in PyTorch: EmbeddingBag per table, MLPs, dot interaction."""

    def __init__(self, tables: list[np.ndarray], bottom, top) -> None:
        super().__init__()
        self.tables = torch.nn.ModuleList(
            torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(t), mode="sum") for t in tables
        )
        self.bottom = torch.nn.ModuleList(_linear(w, b) for w, b in bottom)
        self.top = torch.nn.ModuleList(_linear(w, b) for w, b in top)
        n = len(tables) + 1
        i, j = np.tril_indices(n, k=-1)
        self.register_buffer("pairs", torch.from_numpy(i * n + j))

    def forward(self, dense: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        x = dense
        for layer in self.bottom:
            x = torch.relu(layer(x))
        batch = keys.shape[0]
        offsets = torch.arange(batch, device=keys.device)
        emb = [bag(keys[:, t], offsets) for t, bag in enumerate(self.tables)]
        stacked = torch.stack([x, *emb], dim=1)
        gram = torch.bmm(stacked, stacked.transpose(1, 2)).flatten(1)
        z = torch.cat([x, gram[:, self.pairs], x.new_zeros(batch, 1)], dim=1)
        for k, layer in enumerate(self.top):
            z = layer(z)
            if k < len(self.top) - 1:
                z = torch.relu(z)
        return torch.sigmoid(z)


def _linear(weight: np.ndarray, bias: np.ndarray) -> torch.nn.Linear:
    layer = torch.nn.Linear(weight.shape[0], weight.shape[1])
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(weight.T)))
        layer.bias.copy_(torch.from_numpy(bias.ravel()))
    return layer


def torch_peer(ps_json: Path, model: str, device: int = 0) -> TorchDlrm:
    """The peer of ``model`` of ``ps_json`` on GPU ``device`` (key ``i`` of a table is row
    ``i``, as ``make_large_dlrm.py`` writes them)."""
    config = load_ps_config(ps_json).model(model)
    graph, _ = load_ranking_graph(config)
    params = read_dense_blob(config.dense_file, graph.dense_layout())
    fcs = [n for n in params if "_fc" in n]
    bottom = [params[n] for n in sorted(f for f in fcs if f.startswith("bot"))]
    top = [params[n] for n in sorted(f for f in fcs if f.startswith("top"))]
    tables = []
    for table in config.tables:
        keys, vectors = read_sparse_table(table.sparse_file, table.dim)
        assert np.array_equal(keys, np.arange(len(keys))), "key i must be row i"
        tables.append(vectors)
    return TorchDlrm(tables, bottom, top).to(f"cuda:{device}").eval()
