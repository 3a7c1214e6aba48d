"""A batch of samples for a ranking model, in the form lookup and pooling consume.

Per table the keys are in CSR form over (sample, slot) pairs, sample-major: the keys of sample
``b``, slot ``s`` of table ``t`` are ``keys[t][row_offsets[t][b * S_t + s] :
row_offsets[t][b * S_t + s + 1]]``, where ``S_t`` is the table's slot count. This is HugeCTR's
``row_ptrs`` layout for one table, and what
:class:`~hps_core.nn.UnpooledEmbedding` takes once the keys are looked up. A table whose every
slot holds exactly one key (one-hot) may have ``None`` instead of offsets: then key ``i`` is
the key of (sample, slot) pair ``i``, and nothing has to build, copy or check offsets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SparseBatch:
    """Dense features and per-table keys of ``batch_size`` samples (host NumPy arrays).

    Args:
        dense: float32 ``[batch, dense_dim]``.
        keys: per table, int64 ``[n_t]`` keys in (sample, slot) order.
        row_offsets: per table, int64 ``[batch * S_t + 1]`` offsets into ``keys[t]``, from 0
            to ``n_t``; or ``None`` for a one-hot table (``n_t = batch * S_t``).

    Example:
        Two samples of a model with one table of two slots; sample 0 has keys 7 and 8 in
        slot 0 and none in slot 1, sample 1 has key 9 in each slot::

            SparseBatch(dense, keys=(np.array([7, 8, 9, 9]),),
                        row_offsets=(np.array([0, 2, 2, 3, 4]),))
    """

    dense: np.ndarray
    keys: tuple[np.ndarray, ...]
    row_offsets: tuple[np.ndarray | None, ...]

    @property
    def batch_size(self) -> int:
        """Number of samples."""
        return int(self.dense.shape[0])

    def table_offsets(self, table: int) -> np.ndarray:
        """The row offsets of ``table``, made for a one-hot table (``0, 1, ..., n``)."""
        offsets = self.row_offsets[table]
        if offsets is None:
            return np.arange(self.keys[table].shape[0] + 1, dtype=np.int64)
        return offsets


def concat_batches(batches: Sequence[SparseBatch]) -> SparseBatch:
    """Join batches into one, samples in order (offsets are shifted, not recomputed).

    Args:
        batches: at least one batch, all of the same model.

    Returns:
        The joined batch (the batch itself when there is only one).
    """
    if len(batches) == 1:
        return batches[0]
    dense = np.concatenate([b.dense for b in batches])
    keys, offsets = [], []
    for t in range(len(batches[0].keys)):
        keys.append(np.concatenate([b.keys[t] for b in batches]))
        if all(b.row_offsets[t] is None for b in batches):
            offsets.append(None)
            continue
        parts, base = [np.zeros(1, dtype=np.int64)], 0
        for b in batches:
            parts.append(b.table_offsets(t)[1:] + base)
            base += len(b.keys[t])
        offsets.append(np.concatenate(parts))
    return SparseBatch(dense, tuple(keys), tuple(offsets))


def split_samples(array: np.ndarray, sizes: Sequence[int]) -> list[np.ndarray]:
    """Cut ``array`` along its first axis into pieces of ``sizes`` rows (views, no copy).

    Works for NumPy and CuPy arrays alike.

    Args:
        array: ``[sum(sizes), ...]``.
        sizes: rows of each piece.

    Returns:
        The pieces in order.
    """
    pieces, start = [], 0
    for size in sizes:
        pieces.append(array[start : start + size])
        start += size
    return pieces
