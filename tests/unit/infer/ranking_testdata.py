"""Ranking models for tests: a network file plus random dense parameters, random tables and a
ps.json pairing table ``i`` with the ``i``-th embedding layer (a uniquely named module)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from ranking_reference import Keys, embedding_layers

from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.infer import SparseBatch
from hps_core.nn import build_graph, load_network_json, random_dense_params, write_dense_blob


@dataclass(frozen=True)
class RankingFiles:
    """A ranking model on disk and the rows it serves.

    Args:
        name: the ps.json model name.
        ps_json: the ps.json.
        network_file: the network JSON.
        dense_file: the dense model file.
        tables: per table, key -> float32 vector.
        defaults: per table, the default value for unknown keys.
        layers: per table, its embedding layer (see ``ranking_reference.embedding_layers``).
    """

    name: str
    ps_json: Path
    network_file: Path
    dense_file: Path
    tables: list[dict[int, np.ndarray]]
    defaults: list[float]
    layers: list[dict]

    @property
    def slot_nums(self) -> list[int]:
        return [layer["slot_num"] for layer in self.layers]

    def known_keys(self) -> list[np.ndarray]:
        return [np.array(sorted(table), dtype=np.int64) for table in self.tables]


def write_ranking_files(
    root: Path,
    network_file: Path,
    seed: int,
    name: str = "rank",
    rows: int = 400,
    max_hot: int = 3,
    max_batch_size: int = 64,
    **model: Any,
) -> RankingFiles:
    """Write dense parameters, one random table per embedding layer and a ps.json.

    Args:
        root: folder of the files (the ps.json goes here).
        network_file: the network JSON (copied into ``root``).
        seed: random seed.
        name: the model name.
        rows: rows of each table (keys spread over int64, negatives included).
        max_hot: most keys per slot a sample may have (sizes the per-sample key limits).
        max_batch_size: ps.json ``max_batch_size``.
        **model: more ps.json model fields (override the generated ones).

    Returns:
        The model.
    """
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    network = root / f"{name}.json"
    network.write_text(Path(network_file).read_text())
    graph = build_graph(load_network_json(network))
    dense_file = root / f"{name}_dense.model"
    write_dense_blob(random_dense_params(graph.dense_layout(), seed), dense_file)
    layers = embedding_layers(network)
    tables, defaults, sparse = [], [], []
    for t, layer in enumerate(layers):
        keys = (rng.choice(2 * 10**8, rows, replace=False) - 10**8) * 7919
        vectors = (0.5 * rng.standard_normal((rows, layer["vec_size"]))).astype(np.float32)
        write_sparse_table(root / f"{name}{t}_sparse", keys.astype(np.int64), vectors)
        tables.append(dict(zip(keys.tolist(), vectors, strict=True)))
        defaults.append(float(rng.choice([0.0, 0.25, -0.5])))
        sparse.append(f"{name}{t}_sparse")
    entry = {
        "model": name,
        "network_file": network.name,
        "dense_file": dense_file.name,
        "sparse_files": sparse,
        "embedding_vecsize_per_table": [layer["vec_size"] for layer in layers],
        "maxnum_catfeature_query_per_table_per_sample": [
            layer["slot_num"] * max_hot for layer in layers
        ],
        "default_value_for_each_table": defaults,
        "deployed_device_list": [0],
        "max_batch_size": max_batch_size,
        **model,
    }
    ps = {"supportlonglong": True, "volatile_db": {"type": "hash_map"}, "models": [entry]}
    (root / "ps.json").write_text(json.dumps(ps, indent=2))
    return RankingFiles(name, root / "ps.json", network, dense_file, tables, defaults, layers)


def to_sparse_batch(dense: np.ndarray, keys: Keys) -> SparseBatch:
    """The samples as a :class:`SparseBatch`, built key by key (keys grouped per table)."""
    table_keys, offsets = [], []
    for t in range(len(keys[0])):
        flat, rows = [], [0]
        for sample in keys:
            for slot in sample[t]:
                flat.extend(slot)
                rows.append(rows[-1] + len(slot))
        table_keys.append(np.array(flat, dtype=np.int64))
        offsets.append(np.array(rows, dtype=np.int64))
    return SparseBatch(np.asarray(dense, np.float32), tuple(table_keys), tuple(offsets))
