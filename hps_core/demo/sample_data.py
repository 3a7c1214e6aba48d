"""A labelled Parquet sample for a ranking model, to start offline scoring with.

Each row is a sample in Criteo's naming and NVTabular's types (what HugeCTR's Parquet reader
takes): ``label`` (int32, 0 or 1), ``I1``... (float32 dense features, uniform in [0, 1)),
``C1``... (int64 keys: one per slot, or a list of the model's hotness for a multi-hot table),
each key drawn from its table's keys. The labels are drawn from the model's own scores (a
sample is 1 with the probability the model gives it), so the AUC of ``hps predict`` on the
file measures the model against a distribution it describes: above 0.5 by as much as its
scores spread, the same for every run of the same seed.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hps_core.formats.sparse import inspect_sparse_table, read_keys
from hps_core.infer import RankingSession, SparseBatch
from hps_core.offline.dataset import expected_columns


def write_sample_dataset(
    ps_json: str | os.PathLike[str], model: str, out: Path, rows: int = 10000, seed: int = 0
) -> Path:
    """Write ``rows`` labelled samples of ``model`` to the Parquet file ``out``.

    Args:
        ps_json: the ps.json of the model.
        model: a ranking model of it (with ``network_file`` and ``dense_file``).
        out: the file to write (its folder is created).
        rows: samples.
        seed: random seed of the keys, features and labels.

    Returns:
        ``out``.

    Raises:
        ConfigError: the model is not a ranking model of the ps.json.

    Example:
        >>> write_sample_dataset("model_repository/dlrm/ps.json", "dlrm", Path("dlrm.parquet"))
        ... # doctest: +SKIP
    """
    session = RankingSession.open(ps_json, model)
    layout = session.layout
    lookup_model = session.lookup.model
    rng = np.random.default_rng(seed)
    dense = rng.random((rows, layout.dense_dim), dtype=np.float32)
    key_blocks = []
    for feed in layout.tables:
        table = lookup_model.tables[feed.table]
        rows_held = inspect_sparse_table(table.sparse_file, table.dim).rows
        known = read_keys(table.sparse_file, rows_held)
        key_blocks.append(rng.choice(known, size=(rows, feed.sample_width)))
    keys = np.concatenate(key_blocks, axis=1).astype(np.int64)
    widths = [feed.sample_width for feed in layout.tables]
    scores = np.asarray(
        session.predict(SparseBatch.from_sample_keys(dense, keys, widths, layout.hotness))
    )
    labels = (rng.random(scores.shape) < scores).astype(np.int32)
    names = expected_columns(layout)
    columns: dict[str, pa.Array] = {}
    for j, name in enumerate(names.labels):
        columns[name] = pa.array(labels[:, j])
    for j, name in enumerate(names.dense):
        columns[name] = pa.array(dense[:, j])
    at = 0
    slot = 0
    for feed in layout.tables:
        for _ in range(feed.slot_num):
            block = keys[:, at : at + feed.hotness]
            name = names.categorical[slot]
            columns[name] = pa.array(block[:, 0] if feed.hotness == 1 else list(block))
            at += feed.hotness
            slot += 1
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), out)
    return out
