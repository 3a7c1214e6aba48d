"""Independent references for the ranking tests (a uniquely named module, imported by the infer,
backend_ranking and integration tests).

Samples are plain Python: ``keys[b][t][s]`` is the list of keys of sample ``b``, table ``t``,
slot ``s``. Everything here is written from HugeCTR's definitions with loops and ``json``,
sharing no code with ``hps_core.infer`` or ``triton_backend``: the request encoders, the
pooling (float64), the pairing of tables with embedding layers (table ``i`` feeds the ``i``-th
embedding layer of the file), and a PyTorch forward of a dlrm state dict.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from hps_core.config import ModelConfig, load_ps_config
from hps_core.formats.sparse import read_sparse_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nn"))
from nn_reference import network_forward

EMBEDDING_TYPES = {
    "DistributedSlotSparseEmbeddingHash",
    "LocalizedSlotSparseEmbeddingHash",
    "LocalizedSlotSparseEmbeddingOneHot",
}

Keys = list[list[list[list[int]]]]  # [sample][table][slot] -> keys


def model_tables(ps_json: Path, name: str) -> tuple[ModelConfig, list[dict[int, np.ndarray]]]:
    """Model ``name`` of ``ps_json`` and each of its tables read back as ``{key: vector}``."""
    model = load_ps_config(ps_json).model(name)
    tables = []
    for table in model.tables:
        keys, vectors = read_sparse_table(table.sparse_file, table.dim)
        tables.append(dict(zip(keys.tolist(), vectors, strict=True)))
    return model, tables


def embedding_layers(network_file: Path) -> list[dict]:
    """Per embedding layer in file order: name, slot_num (of its bottom), vec_size, combiner."""
    layers = json.loads(Path(network_file).read_text())["layers"]
    slots = {s["top"]: s["slot_num"] for s in layers[0]["sparse"]}
    out = []
    for layer in layers[1:]:
        if layer["type"] in EMBEDDING_TYPES:
            bottom = layer["bottom"] if isinstance(layer["bottom"], str) else layer["bottom"][0]
            hparam = layer["sparse_embedding_hparam"]
            out.append(
                {
                    "name": layer.get("name", layer["top"]),
                    "slot_num": slots[bottom],
                    "vec_size": hparam["embedding_vec_size"],
                    "combiner": {0: "sum", 1: "mean"}.get(hparam["combiner"], hparam["combiner"]),
                }
            )
    return out


def random_keys(
    rng: np.random.Generator,
    batch: int,
    slot_nums: Sequence[int],
    known: Sequence[np.ndarray],
    max_hot: int | Sequence[int] = 1,
    empty: float = 0.0,
    unknown: float = 0.0,
) -> Keys:
    """Random samples: 1..max_hot keys per slot (one value, or one per table; 0 keys with
    probability ``empty``), each drawn from the table's keys, or with probability ``unknown``
    a key the table lacks."""
    keys: Keys = []
    known_sets = [set(k.tolist()) for k in known]
    hot = [max_hot] * len(slot_nums) if isinstance(max_hot, int) else list(max_hot)
    for _ in range(batch):
        sample = []
        for t, slots in enumerate(slot_nums):
            table = []
            for _ in range(slots):
                n = 0 if rng.random() < empty else int(rng.integers(1, hot[t] + 1))
                slot = []
                for _ in range(n):
                    if rng.random() < unknown:
                        key = int(rng.integers(-(2**62), 2**62))
                        while key in known_sets[t]:
                            key += 1
                    else:
                        key = int(known[t][rng.integers(len(known[t]))])
                    slot.append(key)
                table.append(slot)
            sample.append(table)
        keys.append(sample)
    return keys


def encode_hugectr(dense: np.ndarray, keys: Keys) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``DES``, ``CATCOLUMN``, ``ROWINDEX`` of one request, as ``[1, N]`` arrays.

    Keys sample-major (sample 0: table 0 slot by slot, table 1, ...), offsets one CSR array
    per table over (sample, slot), each from 0.
    """
    catcolumn = [k for sample in keys for table in sample for slot in table for k in slot]
    rowindex: list[int] = []
    for t in range(len(keys[0])):
        offsets = [0]
        for sample in keys:
            for slot in sample[t]:
                offsets.append(offsets[-1] + len(slot))
        rowindex.extend(offsets)
    return (
        np.asarray(dense, np.float32).reshape(1, -1),
        np.array([catcolumn], dtype=np.int64).reshape(1, -1),
        np.array([rowindex], dtype=np.int32),
    )


def encode_samples(dense: np.ndarray, keys: Keys) -> tuple[np.ndarray, np.ndarray]:
    """``dense`` ``[B, D]`` and ``sparse`` ``[B, K]`` of samples with a fixed number of keys
    per slot of each table (the same in every sample): every key, table by table, slot by
    slot."""
    sparse = [[key for table in sample for slot in table for key in slot] for sample in keys]
    counts = {tuple(len(slot) for table in sample for slot in table) for sample in keys}
    assert len(counts) <= 1, "samples differ in their number of keys per slot"
    return np.asarray(dense, np.float32), np.array(sparse, dtype=np.int64)


def pooled_reference(
    layer: Mapping, table: Mapping[int, np.ndarray], default: float, keys: Keys, t: int
) -> np.ndarray:
    """float64 ``[B, slots, vec]`` pooled vectors of table ``t`` (default for unknown keys)."""
    out = np.zeros((len(keys), layer["slot_num"], layer["vec_size"]))
    for b, sample in enumerate(keys):
        for s, slot in enumerate(sample[t]):
            for key in slot:
                row = table.get(key)
                out[b, s] += default if row is None else row.astype(np.float64)
            if slot and layer["combiner"] == "mean":
                out[b, s] /= len(slot)
    return out


def predict_reference(
    network_file: Path,
    dense_file: Path,
    tables: Sequence[Mapping[int, np.ndarray]],
    defaults: Sequence[float],
    dense: np.ndarray,
    keys: Keys,
) -> np.ndarray:
    """float64 ``[B, label_dim]`` predictions: table ``i`` feeds the ``i``-th embedding layer."""
    layers = embedding_layers(network_file)
    assert len(layers) == len(tables)
    pooled = {
        layer["name"]: pooled_reference(layer, tables[t], defaults[t], keys, t)
        for t, layer in enumerate(layers)
    }
    flat = np.fromfile(dense_file, dtype="<f4")
    return network_forward(network_file, flat, np.asarray(dense, np.float64), pooled)


def torch_dlrm_predict(state: Mapping[str, np.ndarray], dense: np.ndarray, keys: Keys):
    """A ``DLRM_Net``'s forward, in PyTorch, from its state dict (float32).

    Bottom MLP with a ReLU after every Linear, ``EmbeddingBag`` sum per table (key = row),
    dot interaction without self-interaction (``x``, then ``Z[i, j]`` for ``i > j`` row by
    row), top MLP with ReLUs and a final sigmoid.
    """
    import torch
    import torch.nn.functional as F

    def mlp(prefix: str, x, last):
        i = 0
        while f"{prefix}.{i}.weight" in state:
            x = F.linear(x, torch.from_numpy(state[f"{prefix}.{i}.weight"]),
                         torch.from_numpy(state[f"{prefix}.{i}.bias"]))  # fmt: skip
            i += 2
            x = last(x) if f"{prefix}.{i}.weight" not in state else torch.relu(x)
        return x

    with torch.no_grad():
        x = mlp("bot_l", torch.from_numpy(np.asarray(dense, np.float32)), torch.relu)
        vectors = [x]
        t = 0
        while f"emb_l.{t}.weight" in state:
            rows = [k for sample in keys for k in sample[t][0]]
            offsets = np.cumsum([0] + [len(sample[t][0]) for sample in keys])[:-1]
            vectors.append(
                F.embedding_bag(
                    torch.tensor(rows, dtype=torch.long),
                    torch.from_numpy(state[f"emb_l.{t}.weight"]),
                    torch.tensor(offsets, dtype=torch.long),
                    mode="sum",
                )
            )
            t += 1
        stacked = torch.stack(vectors, dim=1)
        z = torch.bmm(stacked, stacked.transpose(1, 2))
        n = stacked.shape[1]
        li = [i for i in range(n) for _ in range(i)]
        lj = [j for i in range(n) for j in range(i)]
        features = torch.cat([x, z[:, li, lj]], dim=1)
        return mlp("top_l", features, torch.sigmoid).numpy()
