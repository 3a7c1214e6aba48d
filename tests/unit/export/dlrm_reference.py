"""A small ``DLRM_Net``-style PyTorch model and the helpers that run it both ways (a uniquely
named module, imported by the export tests).

The model is written here in facebookresearch/dlrm's style, not imported from it: ``emb_l``
of ``nn.EmbeddingBag(mode="sum")``, ``bot_l`` / ``top_l`` ``nn.Sequential`` of Linear layers
each followed by a ReLU (Sigmoid after the last top layer), and the dot interaction without
self-interaction (``x`` then ``Z[i, j]`` for ``i > j``, row by row).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from hps_core.config import load_ps_config
from hps_core.formats.sparse import read_sparse_table
from hps_core.nn import DenseExecutor, UnpooledEmbedding


def _mlp(widths: Sequence[int], last: type[nn.Module]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        layers.append(last() if i == len(widths) - 2 else nn.ReLU())
    return nn.Sequential(*layers)


class ReferenceDLRM(nn.Module):
    """DLRM with dot interaction: the PyTorch side of every comparison.

    Args:
        dim: embedding width (also the bottom MLP's last width).
        rows: rows of each table.
        bottom: bottom MLP widths, dense width first.
        top: top MLP widths after the interaction (dlrm's ``--arch-mlp-top``).
        seed: torch seed of the random weights.
        mode: EmbeddingBag pooling mode.
    """

    def __init__(
        self,
        dim: int,
        rows: Sequence[int],
        bottom: Sequence[int],
        top: Sequence[int],
        seed: int = 0,
        mode: str = "sum",
    ) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.emb_l = nn.ModuleList(nn.EmbeddingBag(n, dim, mode=mode) for n in rows)
        n = len(rows) + 1
        self.bot_l = _mlp(bottom, nn.ReLU)
        self.top_l = _mlp([n * (n - 1) // 2 + bottom[-1], *top], nn.Sigmoid)
        with torch.no_grad():
            # dlrm's initialisation scales, which keep the predictions away from 0 and 1.
            for table in self.emb_l:
                bound = table.num_embeddings**-0.5
                table.weight.uniform_(-bound, bound, generator=generator)
            for layer in [*self.bot_l, *self.top_l]:
                if isinstance(layer, nn.Linear):
                    out, inp = layer.weight.shape
                    layer.weight.normal_(0.0, (2 / (out + inp)) ** 0.5, generator=generator)
                    layer.bias.normal_(0.0, out**-0.5, generator=generator)

    def interact_features(self, x: torch.Tensor, ly: Sequence[torch.Tensor]) -> torch.Tensor:
        batch, d = x.shape
        t = torch.cat([x, *ly], dim=1).view(batch, -1, d)
        z = torch.bmm(t, t.transpose(1, 2))
        n = t.shape[1]
        li = torch.tensor([i for i in range(n) for _ in range(i)], dtype=torch.long)
        lj = torch.tensor([j for i in range(n) for j in range(i)], dtype=torch.long)
        return torch.cat([x, z[:, li, lj]], dim=1)

    def forward(
        self,
        dense: torch.Tensor,
        offsets: Sequence[torch.Tensor],
        indices: Sequence[torch.Tensor],
    ) -> torch.Tensor:
        x = self.bot_l(dense)
        ly = [table(i, o) for table, i, o in zip(self.emb_l, indices, offsets, strict=True)]
        return self.top_l(self.interact_features(x, ly))


@dataclass(frozen=True)
class Batch:
    """Random inputs: dense features and, per table, CSR indices (rows) and offsets."""

    dense: np.ndarray
    indices: tuple[np.ndarray, ...]
    offsets: tuple[np.ndarray, ...]


def random_batch(
    rng: np.random.Generator, batch: int, dense_dim: int, rows: Sequence[int], max_hot: int
) -> Batch:
    """Dense features in [0, 1) and 0..max_hot row indices per (sample, table); with
    ``max_hot`` 1 every sample has exactly one index per table (one-hot)."""
    dense = rng.random((batch, dense_dim), dtype=np.float32)
    indices, offsets = [], []
    for n in rows:
        counts = np.ones(batch, np.int64) if max_hot == 1 else rng.integers(0, max_hot + 1, batch)
        offsets.append(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
        indices.append(rng.integers(0, n, int(counts.sum())).astype(np.int64))
    return Batch(dense, tuple(indices), tuple(offsets))


def torch_predict(model: ReferenceDLRM, batch: Batch) -> np.ndarray:
    """The reference model's predictions."""
    with torch.no_grad():
        out = model(
            torch.from_numpy(batch.dense),
            [torch.from_numpy(o[:-1]) for o in batch.offsets],
            [torch.from_numpy(i) for i in batch.indices],
        )
    return out.numpy()


def hps_predict(
    ps_json: Path, model_name: str, batch: Batch, key_maps: Mapping[int, np.ndarray] | None = None
) -> np.ndarray:
    """Predictions from the exported files as the ps.json names them: table ``t`` read back
    with ``read_sparse_table`` feeds embedding layer ``t``; each sample's keys are looked up
    by key (not by row); ``DenseExecutor`` runs the network."""
    model = load_ps_config(ps_json).model(model_name)
    executor = DenseExecutor.from_files(model.network_file, model.dense_file)
    assert len(executor.embedding_names) == len(model.tables)
    embeddings = {}
    for table, name in zip(model.tables, executor.embedding_names, strict=True):
        keys, vectors = read_sparse_table(table.sparse_file, table.dim)
        wanted = batch.indices[table.index]
        if key_maps and table.index in key_maps:
            wanted = key_maps[table.index][wanted]
        order = np.argsort(keys)
        found = order[np.minimum(np.searchsorted(keys, wanted, sorter=order), keys.size - 1)]
        assert np.array_equal(keys[found], wanted), f"{table.sparse_file}: a key is missing"
        embeddings[name] = UnpooledEmbedding(vectors[found], batch.offsets[table.index])
    return executor.forward(batch.dense, embeddings)
