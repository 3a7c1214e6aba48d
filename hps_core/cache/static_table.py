"""Static embedding cache: a whole table held in (GPU) memory, looked up by binary search.

HugeCTR's ``static_table`` puts every row of a table into an open-addressing GPU hash table
(``StaticHashTable``: 4-slot tiles, MurmurHash3, a spare slot for the empty key) and never
evicts. Here the keys are kept sorted next to their rows and a query is one vectorised
``searchsorted``: the same code runs on NumPy and CuPy, any int64 key (no reserved value) is
served, and memory is exactly keys plus rows. A lookup costs ``log2(rows)`` probes instead of
about one, which matters little next to the gather of the rows themselves.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from hps_core.cache.arrays import as_keys, as_rows, output_rows
from hps_core.cache.layout import last_of_each
from hps_core.cache.stats import (
    HITS,
    MISSES,
    NUM_COUNTERS,
    UPDATED,
    CacheStats,
    stats_from_counters,
)


class StaticTable:
    """A complete embedding table; queries never insert or evict.

    Args:
        keys: 1-D integer keys, unique.
        values: float ``[len(keys), dim]`` rows.
        xp: array module to hold the table in (``numpy`` or ``cupy``).
        name: label used in error messages.

    Raises:
        ValueError: values are not 2-D with a positive width, shapes disagree, or a key repeats.
        TypeError: keys are not integers or values not floating point.

    Example:
        >>> table = StaticTable(np.array([3, -1]), np.eye(2, dtype=np.float32))
        >>> table.query(np.array([-1, 5]))
        (array([[0., 1.],
               [0., 0.]], dtype=float32), array([ True, False]))
    """

    def __init__(self, keys: Any, values: Any, *, xp: Any = np, name: str = "static table") -> None:
        self.name = name
        self.xp = xp
        self._where = f"static table {name!r}"
        keys = as_keys(keys, xp, self._where)
        shape = tuple(xp.asarray(values).shape)
        if len(shape) != 2 or shape[1] < 1:
            raise ValueError(f"{self._where}: values must be 2-D [rows, dim], got shape {shape}")
        self._dim = int(shape[1])
        rows = as_rows(values, int(keys.shape[0]), self._dim, xp, self._where)
        order = xp.argsort(keys)
        self._keys = keys[order]
        self._values = rows[order]
        repeated = xp.flatnonzero(self._keys[1:] == self._keys[:-1])
        if repeated.shape[0]:
            raise ValueError(
                f"{self._where}: key {int(self._keys[int(repeated[0])])} appears more than once"
            )
        self._counters = xp.zeros(NUM_COUNTERS, dtype=xp.int64)
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        """Embedding width."""
        return self._dim

    @property
    def size(self) -> int:
        """Number of rows."""
        return int(self._keys.shape[0])

    def _find(self, keys: Any) -> Any:
        """Row of each key in the sorted table, or -1."""
        xp = self.xp
        if self.size == 0:
            return xp.full(keys.shape[0], -1, dtype=xp.int64)
        index = xp.minimum(xp.searchsorted(self._keys, keys), self.size - 1)
        return xp.where(self._keys[index] == keys, index, -1)

    def query(self, keys: Any, out: Any = None) -> tuple[Any, Any]:
        """Look keys up.

        Args:
            keys: 1-D integer keys (duplicates allowed).
            out: optional float32 ``[n, dim]`` array of the table's module; miss rows are not
                written.

        Returns:
            ``(values, hit_mask)``: ``out`` (or a new zero-filled array) and bool ``[n]``.
        """
        xp = self.xp
        keys = as_keys(keys, xp, self._where)
        n = int(keys.shape[0])
        out = output_rows(out, n, self._dim, xp, self._where)
        with self._lock:
            found = self._find(keys)
            hit = found >= 0
            positions = xp.flatnonzero(hit)
            out[positions] = self._values[found[positions]]
            self._counters[HITS] += positions.shape[0]
            self._counters[MISSES] += n - positions.shape[0]
        return out, hit

    def update(self, keys: Any, values: Any) -> None:
        """Overwrite rows of keys in the table; ignore other keys; the last duplicate wins.

        Args:
            keys: 1-D integer keys.
            values: float ``[n, dim]`` rows, row ``i`` for ``keys[i]``.
        """
        xp = self.xp
        keys = as_keys(keys, xp, self._where)
        rows = as_rows(values, int(keys.shape[0]), self._dim, xp, self._where)
        with self._lock:
            found = self._find(keys)
            positions = xp.flatnonzero(found >= 0)
            targets = found[positions]
            last = last_of_each(targets, xp)
            self._values[targets[last]] = rows[positions[last]]
            self._counters[UPDATED] += positions.shape[0]

    def stats(self) -> CacheStats:
        """Counters since creation (``inserts`` and ``evictions`` stay 0)."""
        with self._lock:
            return stats_from_counters(self._counters)
