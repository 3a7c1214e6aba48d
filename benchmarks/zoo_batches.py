"""Random batches for the zoo benchmarks (``zoo_kernel_profile.py``, ``zoo_cpu_predict.py``)."""

from __future__ import annotations

import numpy as np

from hps_core.infer import RankingSession, SparseBatch


def random_batch(session: RankingSession, rng: np.random.Generator, batch: int) -> SparseBatch:
    """``batch`` samples of known keys (each table's fixed hotness), as the samples contract
    hands them over; BST's first dense feature is its sequence length, 0 to 6."""
    layout = session.layout
    columns = []
    for feed in layout.tables:
        rows = session.lookup.table(feed.table).host.rows
        columns.append(rng.integers(0, rows, (batch, feed.sample_width)))
    keys = np.concatenate(columns, axis=1).astype(np.int64)
    dense = rng.random((batch, layout.dense_dim), dtype=np.float32)
    if layout.model == "bst":
        dense[:, 0] = rng.integers(0, 7, batch)  # the sequence length
    widths = [t.sample_width for t in layout.tables]
    return SparseBatch.from_sample_keys(dense, keys, widths, layout.hotness)
