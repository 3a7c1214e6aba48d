"""A two-model ps.json with random tables, and the dict references of its lookups."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hps_core.formats.sparse_writer import write_sparse_table

INT64_MIN = int(np.iinfo(np.int64).min)
INT64_MAX = int(np.iinfo(np.int64).max)

# model -> (rows, dim, default value) of each table.
MODELS = {
    "wdl": ((400, 1, 0.0), (3000, 16, 0.25)),
    "dcn": ((1500, 8, -1.0),),
}


@dataclass
class TableData:
    """One table as written: keys, vectors, the ps.json default, and key -> row."""

    keys: np.ndarray
    vectors: np.ndarray
    default: float

    def __post_init__(self) -> None:
        self.rows = {k: i for i, k in enumerate(self.keys.tolist())}

    def expected(self, queries: np.ndarray) -> np.ndarray:
        """The vectors a lookup of ``queries`` must return (dict reference)."""
        out = np.full((len(queries), self.vectors.shape[1]), self.default, np.float32)
        for i, q in enumerate(queries.tolist()):
            row = self.rows.get(q)
            if row is not None:
                out[i] = self.vectors[row]
        return out

    def queries(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Hits, misses over the whole int64 range, and duplicates of both, shuffled."""
        hits = rng.choice(self.keys, size=n // 2)
        misses = rng.integers(INT64_MIN, INT64_MAX, size=n // 4, dtype=np.int64, endpoint=True)
        some = np.concatenate([hits, misses, [INT64_MIN, INT64_MAX, -1, 0]])
        return rng.permutation(np.concatenate([some, rng.choice(some, size=n // 4)]))


def write_models(
    folder: Path, seed: int = 7, models: dict[str, tuple[tuple[int, int, float], ...]] = MODELS
) -> tuple[Path, dict[str, list[TableData]]]:
    """Write the tables of ``models`` (default ``MODELS``) and a ps.json with relative sparse
    paths.

    Returns:
        The ps.json path and, per model, its tables' data.
    """
    rng = np.random.default_rng(seed)
    data: dict[str, list[TableData]] = {}
    entries = []
    for name, tables in models.items():
        data[name] = []
        for t, (rows, dim, default) in enumerate(tables):
            keys = np.unique(rng.integers(INT64_MIN, INT64_MAX, 2 * rows, np.int64))[:rows]
            keys = rng.permutation(keys)
            vectors = rng.standard_normal((rows, dim), dtype=np.float32)
            write_sparse_table(folder / name / f"t{t}", keys, vectors)
            data[name].append(TableData(keys, vectors, default))
        entries.append(
            {
                "model": name,
                "sparse_files": [f"{name}/t{t}" for t in range(len(tables))],
                "deployed_device_list": [0],
                "default_value_for_each_table": [d for _, _, d in tables],
                "maxnum_catfeature_query_per_table_per_sample": [4] * len(tables),
                "embedding_vecsize_per_table": [dim for _, dim, _ in tables],
            }
        )
    ps = folder / "ps.json"
    ps.write_text(json.dumps({"supportlonglong": True, "models": entries}))
    return ps, data
