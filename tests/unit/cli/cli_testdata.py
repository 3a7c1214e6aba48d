"""A HugeCTR-style model folder (ps.json + sparse tables) for the command-line tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from hps_core.formats.sparse_writer import write_sparse_table

# (folder relative to the ps.json, rows, dim) of each table of model "wdl".
TABLES = (("wdl/0_sparse", 20_000, 16), ("wdl/1_sparse", 3_000, 1))


def ps_document(sparse_files: list[str], dims: list[int], **model: Any) -> dict[str, Any]:
    """A ps.json document with one model ``wdl``."""
    return {
        "supportlonglong": True,
        "volatile_db": {"type": "hash_map"},
        "models": [
            {
                "model": "wdl",
                "sparse_files": sparse_files,
                "deployed_device_list": [0],
                "default_value_for_each_table": [0.0] * len(sparse_files),
                "maxnum_catfeature_query_per_table_per_sample": [2] * len(sparse_files),
                "embedding_vecsize_per_table": dims,
                **model,
            }
        ],
    }


def write_model(folder: Path, seed: int = 3) -> tuple[Path, list[tuple[np.ndarray, np.ndarray]]]:
    """Write the tables of ``TABLES`` and ``folder/ps.json``; return it and the rows."""
    rng = np.random.default_rng(seed)
    data = []
    for path, rows, dim in TABLES:
        keys = rng.permutation(np.arange(rows, dtype=np.int64) * 7 - 1000)
        vectors = rng.standard_normal((rows, dim), dtype=np.float32)
        write_sparse_table(folder / path, keys, vectors)
        data.append((keys, vectors))
    doc = ps_document([p for p, _, _ in TABLES], [d for _, _, d in TABLES])
    return write_ps(folder / "ps.json", doc), data


def write_ps(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2))
    return path


def edit_ps(path: Path, **model: Any) -> Path:
    """Rewrite model fields of the ps.json at ``path``."""
    doc = json.loads(path.read_text())
    doc["models"][0].update(model)
    return write_ps(path, doc)
