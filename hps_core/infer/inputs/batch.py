"""A batch of samples for a ranking model, in the form lookup and pooling consume.

Per table the keys are in CSR form over (sample, slot) pairs, sample-major: the keys of sample
``b``, slot ``s`` of table ``t`` are ``keys[t][row_offsets[t][b * S_t + s] :
row_offsets[t][b * S_t + s + 1]]``, where ``S_t`` is the table's slot count. This is HugeCTR's
``row_ptrs`` layout for one table, and what
:class:`~hps_core.nn.UnpooledEmbedding` takes once the keys are looked up.

A table whose every slot holds the same number of keys ``h`` (its *hotness*: 1 for one-hot
features, MLPerf DLRM-v2's multi-hot tables 1 to 100) has ``None`` instead of offsets: key
``i`` then belongs to (sample, slot) pair ``i // h``, and nothing has to build, copy or check
offsets. Such a table's keys may also be 2-D, ``[batch, S_t * h]``: one row per sample, as
requests carry them. When every table has a fixed hotness, the batch may keep the request's
whole ``[batch, K]`` key array (``sample_keys``, every table's keys side by side per sample),
whose column blocks the per-table keys are: the GPU pipeline then stages the batch's keys in
one copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SparseBatch:
    """Dense features and per-table keys of ``batch_size`` samples (host NumPy arrays, or CuPy
    arrays on the GPU that serves them).

    Args:
        dense: float32 ``[batch, dense_dim]``.
        keys: per table, int64 ``[n_t]`` keys in (sample, slot) order; a table without
            offsets may instead have ``[batch, S_t * h_t]``, a row per sample.
        row_offsets: per table, int64 ``[batch * S_t + 1]`` offsets into ``keys[t]``, from 0
            to ``n_t``; or ``None`` when every slot holds ``hotness[t]`` keys
            (``n_t = batch * S_t * hotness[t]``).
        hotness: per table, the keys per slot of a table without offsets (ignored for the
            others); ``None``: 1 for every table (one-hot).
        sample_keys: ``[batch, K]``: the keys of every table side by side, table after table,
            when ``keys`` are its column blocks (see :meth:`from_sample_keys`); else ``None``.

    Example:
        Two samples of a model with one table of two slots; sample 0 has keys 7 and 8 in
        slot 0 and none in slot 1, sample 1 has key 9 in each slot::

            SparseBatch(dense, keys=(np.array([7, 8, 9, 9]),),
                        row_offsets=(np.array([0, 2, 2, 3, 4]),))

        The same model's samples with two keys in every slot, as a request carries them::

            SparseBatch.from_sample_keys(dense, np.array([[7, 8, 1, 2], [9, 9, 3, 4]]),
                                         widths=(4,), hotness=(2,))
    """

    dense: Any
    keys: tuple[Any, ...]
    row_offsets: tuple[Any | None, ...]
    hotness: tuple[int, ...] | None = None
    sample_keys: Any | None = None

    @classmethod
    def from_sample_keys(
        cls, dense: Any, sample_keys: Any, widths: Sequence[int], hotness: Sequence[int]
    ) -> SparseBatch:
        """A batch whose tables all have a fixed hotness, from the request's key matrix.

        Args:
            dense: float32 ``[batch, dense_dim]``.
            sample_keys: int64 ``[batch, sum(widths)]``, table ``t``'s ``widths[t]`` keys per
                sample after those of the tables before it.
            widths: per table, keys per sample (``S_t * hotness[t]``).
            hotness: per table, keys per slot.

        Returns:
            The batch; each table's keys are a ``[batch, widths[t]]`` view of ``sample_keys``.
        """
        keys, start = [], 0
        for width in widths:
            keys.append(sample_keys[:, start : start + width])
            start += width
        return cls(dense, tuple(keys), (None,) * len(keys), tuple(hotness), sample_keys)

    @property
    def batch_size(self) -> int:
        """Number of samples."""
        return int(self.dense.shape[0])

    def table_hotness(self, table: int) -> int | None:
        """Keys per slot of ``table`` when it has no offsets, else ``None``."""
        if self.row_offsets[table] is not None:
            return None
        return 1 if self.hotness is None else int(self.hotness[table])

    def flat_keys(self, table: int) -> Any:
        """The keys of ``table`` as one 1-D array in (sample, slot) order (a copy only where
        they are a strided 2-D view)."""
        return self.keys[table].reshape(-1)

    def sample_range(self, first: int, stop: int) -> SparseBatch:
        """Samples ``[first, stop)`` of the batch: views of its arrays, except each table's
        row offsets, which are rebased to start at 0.

        Args:
            first, stop: ``0 <= first < stop <= batch_size``.

        Returns:
            A batch of ``stop - first`` samples with this batch's hotness.
        """
        samples = self.batch_size
        keys: list[Any] = []
        offsets: list[Any | None] = []
        for table_keys, table_offsets in zip(self.keys, self.row_offsets, strict=True):
            if table_offsets is None:
                if table_keys.ndim == 2:
                    keys.append(table_keys[first:stop])
                else:
                    width = table_keys.size // samples
                    keys.append(table_keys[first * width : stop * width])
                offsets.append(None)
                continue
            slots = (table_offsets.shape[0] - 1) // samples
            part = table_offsets[first * slots : stop * slots + 1]
            start, end = int(part[0]), int(part[-1])
            keys.append(table_keys.reshape(-1)[start:end])
            offsets.append(part - start)
        sample_keys = None if self.sample_keys is None else self.sample_keys[first:stop]
        return SparseBatch(
            self.dense[first:stop], tuple(keys), tuple(offsets), self.hotness, sample_keys
        )

    def table_offsets(self, table: int) -> np.ndarray:
        """The row offsets of ``table``, made for a table without them (``0, h, 2h, ...``)."""
        offsets = self.row_offsets[table]
        if offsets is None:
            hot = self.table_hotness(table) or 1
            return np.arange(0, self.keys[table].size + 1, hot, dtype=np.int64)
        return offsets


def concat_batches(batches: Sequence[SparseBatch]) -> SparseBatch:
    """Join batches into one, samples in order (offsets are shifted, not recomputed).

    Args:
        batches: at least one batch, all of the same model.

    Returns:
        The joined batch (the batch itself when there is only one). Batches that all carry
        their keys as ``sample_keys`` of one width join into one such batch.
    """
    if len(batches) == 1:
        return batches[0]
    dense = np.concatenate([b.dense for b in batches])
    first = batches[0]
    tables = range(len(first.keys))
    if all(
        b.sample_keys is not None
        and b.sample_keys.shape[1] == first.sample_keys.shape[1]
        and b.hotness == first.hotness
        for b in batches
    ):
        widths = [first.keys[t].shape[1] for t in tables]
        joined = np.concatenate([b.sample_keys for b in batches])
        return SparseBatch.from_sample_keys(dense, joined, widths, first.hotness or ())
    keys: list[np.ndarray] = []
    offsets: list[np.ndarray | None] = []
    hotness: list[int] = []
    for t in tables:
        hot = {b.table_hotness(t) for b in batches}
        if len(hot) == 1 and None not in hot:  # one fixed hotness: keys joined as they are
            shapes = {b.keys[t].shape[1:] for b in batches}
            parts = [b.keys[t] if len(shapes) == 1 else b.flat_keys(t) for b in batches]
            keys.append(np.concatenate(parts))
            offsets.append(None)
            hotness.append(hot.pop())
            continue
        keys.append(np.concatenate([b.flat_keys(t) for b in batches]))
        parts, base = [np.zeros(1, dtype=np.int64)], 0
        for b in batches:
            parts.append(b.table_offsets(t)[1:] + base)
            base += b.keys[t].size
        offsets.append(np.concatenate(parts))
        hotness.append(1)
    return SparseBatch(dense, tuple(keys), tuple(offsets), tuple(hotness))


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
