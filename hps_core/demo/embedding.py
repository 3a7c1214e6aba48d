"""``hps_embedding``: a two-table embedding-lookup model (HugeCTR ``hps`` contract)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hps_core.config import parse_ps_config
from hps_core.errors import HPSError
from hps_core.formats.sparse import inspect_sparse_table
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.triton_repo import ServingOptions, write_embedding_model

NAME = "hps_embedding"
# (rows, dim) of each table; keys are 0..rows-1.
TABLES = ((100_000, 16), (20_000, 32))
SEED = 20261129


def table_vectors(index: int) -> tuple[np.ndarray, np.ndarray]:
    """Keys and vectors of demo table ``index`` (deterministic).

    Args:
        index: table index.

    Returns:
        ``(keys, vectors)``: int64 ``[rows]`` and float32 ``[rows, dim]``.
    """
    rows, dim = TABLES[index]
    rng = np.random.default_rng([SEED, index])
    keys = np.arange(rows, dtype=np.int64)
    return keys, rng.standard_normal((rows, dim), dtype=np.float32)


def _data_ok(folder: Path, dim: int) -> bool:
    try:
        inspect_sparse_table(folder, dim)
    except HPSError:  # missing, truncated or wrong dim: write it again
        return False
    return True


def write_embedding_demo(repo: Path, options: ServingOptions | None = None) -> Path:
    """Write the ``hps_embedding`` model folder into ``repo``; data only if missing.

    Args:
        repo: the model repository.
        options: batching and placement.

    Returns:
        The model folder.
    """
    folder = (repo / NAME).resolve()
    sparse = [folder / "data" / f"table{i}" for i in range(len(TABLES))]
    for i, path in enumerate(sparse):
        if not _data_ok(path, TABLES[i][1]):
            write_sparse_table(path, *table_vectors(i), overwrite=True)
    ps = {
        "supportlonglong": True,
        "volatile_db": {"type": "hash_map"},
        "models": [
            {
                "model": NAME,
                "sparse_files": [str(p.relative_to(folder)) for p in sparse],
                "embedding_table_names": [f"table{i}" for i in range(len(TABLES))],
                "embedding_vecsize_per_table": [dim for _, dim in TABLES],
                "maxnum_catfeature_query_per_table_per_sample": [26] * len(TABLES),
                "default_value_for_each_table": [0.0] * len(TABLES),
                "deployed_device_list": [0],
                "max_batch_size": 1024,
                "gpucache": True,
                "gpucacheper": 0.2,
                "hit_rate_threshold": 0.9,
            }
        ],
    }
    config = parse_ps_config(ps, base_dir=folder)
    return write_embedding_model(repo, config, config.models[0], options or ServingOptions())
