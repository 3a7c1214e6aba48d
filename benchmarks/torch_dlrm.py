"""The PyTorch DLRMs that hps-triton is measured against, built from the same HugeCTR files.

- :class:`TorchDlrm` (MLPerf DLRM v1): every table whole on the GPU (``nn.EmbeddingBag`` per
  table, one key per slot), the bottom MLP, HugeCTR's dot interaction (the bottom output and
  the embeddings stacked, their Gram matrix, its strictly lower triangle row by row, one zero),
  the top MLP and a sigmoid.
- :class:`TorchDlrmV2` (MLPerf DLRM-v2, ``make_large_dlrm.py --dcnv2``): an ``nn.EmbeddingBag``
  per table fed its fixed number of keys per sample with offsets (made once per batch size, on
  the GPU), the bottom MLP, the pooled vectors and its output concatenated, the low-rank cross
  layers as matmuls (``x0 * (xl U V + b) + xl``), the top MLP and a sigmoid.

Both take the weights of the model's dense file: the same function hps-triton serves, fed the
keys as requests carry them, ``[B, K]`` sample-major. Used in process by
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
from hps_core.nn.layers import MLP, MultiCross


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
        self.key_width = len(tables)  # keys per sample

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


class TorchDlrmV2(torch.nn.Module):
    """MLPerf DLRM-v2 in PyTorch: EmbeddingBag per table (with offsets), MLPs, low-rank cross.

    Args:
        tables: each table's rows (row ``i`` is key ``i``).
        hotness: keys per sample of each table.
        bottom, top: ``(weight [in, out], bias [1, out], relu)`` per layer of each MLP.
        cross: ``(U [D, P], V [P, D], b [1, D])`` per cross layer.
    """

    def __init__(self, tables, hotness, bottom, cross, top) -> None:
        super().__init__()
        self.tables = torch.nn.ModuleList(
            torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(t), mode="sum") for t in tables
        )
        self.hotness = tuple(int(h) for h in hotness)
        self.starts = tuple(int(c) for c in np.cumsum((0, *self.hotness))[:-1])
        self.key_width = sum(self.hotness)
        self.bottom = torch.nn.ModuleList(_linear(w, b) for w, b, _ in bottom)
        self.bottom_relu = tuple(relu for *_, relu in bottom)
        self.top = torch.nn.ModuleList(_linear(w, b) for w, b, _ in top)
        self.top_relu = tuple(relu for *_, relu in top)
        self.cross = torch.nn.ParameterList(
            torch.nn.Parameter(torch.from_numpy(np.ascontiguousarray(a)), requires_grad=False)
            for layer in cross
            for a in (layer[0], layer[1], layer[2].reshape(-1))
        )
        self._offsets: dict[tuple[int, int], torch.Tensor] = {}

    def offsets(self, batch: int, hot: int, device: torch.device) -> torch.Tensor:
        """Bag offsets of ``batch`` samples of ``hot`` keys, kept on the GPU per size."""
        key = (batch, hot)
        if key not in self._offsets:
            self._offsets[key] = torch.arange(0, batch * hot, hot, device=device)
        return self._offsets[key]

    def pooled(self, keys: torch.Tensor) -> torch.Tensor:
        """Every table's bags of ``keys`` (``[B, K]`` sample-major), side by side."""
        batch = keys.shape[0]
        return torch.cat([
            bag(keys[:, c : c + h].reshape(-1), self.offsets(batch, h, keys.device))
            for bag, c, h in zip(self.tables, self.starts, self.hotness, strict=True)
        ], dim=1)  # fmt: skip

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        """``dense`` ``[B, 13]`` and ``sparse`` ``[B, K]`` (the samples contract's names)."""
        x = dense
        for layer, relu in zip(self.bottom, self.bottom_relu, strict=True):
            x = layer(x)
            if relu:
                x = torch.relu(x)
        x0 = torch.cat([self.pooled(sparse), x], dim=1)
        xl = x0
        for i in range(0, len(self.cross), 3):
            u, v, b = self.cross[i], self.cross[i + 1], self.cross[i + 2]
            xl = x0 * torch.addmm(b, xl @ u, v) + xl
        z = xl
        for layer, relu in zip(self.top, self.top_relu, strict=True):
            z = layer(z)
            if relu:
                z = torch.relu(z)
        return torch.sigmoid(z)


def _linear(weight: np.ndarray, bias: np.ndarray) -> torch.nn.Linear:
    layer = torch.nn.Linear(weight.shape[0], weight.shape[1])
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(weight.T)))
        layer.bias.copy_(torch.from_numpy(bias.ravel()))
    return layer


def torch_peer(ps_json: Path, model: str, device: int | str = 0) -> TorchDlrm | TorchDlrmV2:
    """The peer of ``model`` of ``ps_json`` on GPU ``device`` (or a torch device name such as
    ``"cpu"``; key ``i`` of a table is row ``i``, as ``make_large_dlrm.py`` writes them):
    DLRM-v2 when the network has a ``MultiCross`` layer, else DLRM v1."""
    where = device if isinstance(device, str) else f"cuda:{device}"
    config = load_ps_config(ps_json).model(model)
    graph, layout = load_ranking_graph(config)
    params = read_dense_blob(config.dense_file, graph.dense_layout())
    tables = []
    for table in config.tables:
        keys, vectors = read_sparse_table(table.sparse_file, table.dim)
        assert np.array_equal(keys, np.arange(len(keys))), "key i must be row i"
        tables.append(vectors)
    layers = {node.spec.name: node.layer for node in graph.nodes if node.used}
    if "interaction1" in layers and isinstance(layers["interaction1"], MultiCross):
        net = TorchDlrmV2(
            tables,
            [t.max_keys_per_sample for t in layout.tables],
            _mlp_layers(layers["mlp1"], params["mlp1"]),
            [params["interaction1"][i : i + 3] for i in range(0, len(params["interaction1"]), 3)],
            _mlp_layers(layers["mlp2"], params["mlp2"]),
        )
        return net.to(where).eval()
    fcs = [n for n in params if "_fc" in n]
    bottom = [params[n] for n in sorted(f for f in fcs if f.startswith("bot"))]
    top = [params[n] for n in sorted(f for f in fcs if f.startswith("top"))]
    return TorchDlrm(tables, bottom, top).to(where).eval()


def _mlp_layers(layer: MLP, tensors) -> list[tuple[np.ndarray, np.ndarray, bool]]:
    """``(weight, bias, relu)`` per layer of a HugeCTR MLP layer (every layer has a bias)."""
    assert all(layer.biases), "the peer's MLP layers all have biases"
    return [(tensors[2 * i], tensors[2 * i + 1], relu) for i, relu in enumerate(layer.relus)]


class HpsTablesDlrmV2(TorchDlrmV2):
    """:class:`TorchDlrmV2` with its tables in the HPS: one ``hps_torchrec``
    ``EmbeddingBagCollection`` over the ps.json model's tables (every table in one lookup
    call) instead of an ``nn.EmbeddingBag`` per table; the same dense weights and forward
    otherwise. The PyTorch model that ``torch_model_serve.py`` serves through ``hps
    repo-torch`` beside the HugeCTR-file model."""

    def __init__(self, ps_json: Path, model: str, hotness, bottom, cross, top) -> None:
        from hps_core import hps_torchrec

        config = load_ps_config(ps_json).model(model)
        placeholders = [np.zeros((1, t.dim), np.float32) for t in config.tables]
        super().__init__(placeholders, hotness, bottom, cross, top)
        del self.tables  # the HPS holds them
        self.names = [f"slot_{t}" for t in range(len(config.tables))]
        specs = [hps_torchrec.TableSpec(t.name, t.dim, (f"slot_{i}",))
                 for i, t in enumerate(config.tables)]  # fmt: skip
        self.collection = hps_torchrec.EmbeddingBagCollection(ps_json, model, specs)

    def pooled(self, keys: torch.Tensor) -> torch.Tensor:
        """Every table's bags of ``keys``: one call of the collection."""
        from hps_core.jagged import KeyedJaggedTensor

        batch = keys.shape[0]
        # TorchRec's layout: every sample's keys of table 0, then of table 1, ...
        values = torch.cat([keys[:, c : c + h].reshape(-1)
                            for c, h in zip(self.starts, self.hotness, strict=True)])  # fmt: skip
        lengths = torch.tensor(self.hotness, device=keys.device).repeat_interleave(batch)
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=self.names, values=values, lengths=lengths)
        return self.collection(kjt).values()


def hps_tables_dlrm_v2(ps_json: Path, model: str, device: str = "cpu") -> HpsTablesDlrmV2:
    """The DLRM-v2 of ``model`` of ``ps_json`` in PyTorch, its dense weights from the dense
    file and its tables the HPS's (``make_large_dlrm.py --dcnv2``'s files)."""
    config = load_ps_config(ps_json).model(model)
    graph, layout = load_ranking_graph(config)
    params = read_dense_blob(config.dense_file, graph.dense_layout())
    layers = {node.spec.name: node.layer for node in graph.nodes if node.used}
    if not isinstance(layers.get("interaction1"), MultiCross):
        raise ValueError(f"model '{model}' of {ps_json} is not a DLRM-v2 (no MultiCross layer)")
    net = HpsTablesDlrmV2(
        ps_json,
        model,
        [t.max_keys_per_sample for t in layout.tables],
        _mlp_layers(layers["mlp1"], params["mlp1"]),
        [params["interaction1"][i : i + 3] for i in range(0, len(params["interaction1"]), 3)],
        _mlp_layers(layers["mlp2"], params["mlp2"]),
    )
    return net.to(device).eval()
