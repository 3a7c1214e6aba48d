"""NumPy twin of the CUDA cache: the executable specification of its semantics, which the
CUDA cache (``hps_core.cache.cupy_cache``) is tested against call by call
(``tests/gpu/cache/test_cache_cupy_vs_twin.py``).

The kernels handle one set per warp and walk that set's keys in batch order. The twin does the
same work in *rounds*: round ``r`` applies the ``r``-th key of every set at once, as one
vectorised step over distinct sets. Because sets are independent, both equal applying the
batch key by key, which is what the reference model in ``tests/unit/cache`` does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hps_core.cache.dynamic import DynamicCache
from hps_core.cache.layout import EMPTY_KEY, WAYS, RunPlan, last_of_each, set_of
from hps_core.cache.stats import EVICTIONS, HITS, INSERTS, MISSES, RESERVED_KEY_MISSES, UPDATED
from hps_core.quant import StoragePrecision

# Keys looked up per vectorised step: bounds the [chunk, WAYS] temporaries to a few MiB.
_CHUNK = 1 << 14


class NumpyDynamicCache(DynamicCache):
    """The dynamic cache in host memory (NumPy); semantics in :mod:`hps_core.cache.dynamic`.

    Args:
        num_sets: number of 64-slot sets.
        dim: embedding width.
        name: label used in error messages.
    """

    def __init__(
        self,
        num_sets: int,
        dim: int,
        *,
        name: str = "cache",
        precision: StoragePrecision = StoragePrecision.FP32,
    ) -> None:
        super().__init__(num_sets, dim, np, name, precision=precision)

    def _find(self, keys: np.ndarray, sets: np.ndarray) -> np.ndarray:
        """Flat slot of each key, or -1 when it is not stored."""
        slots = np.full(keys.shape[0], -1, dtype=np.int64)
        for start in range(0, keys.shape[0], _CHUNK):
            k = keys[start : start + _CHUNK]
            s = sets[start : start + _CHUNK]
            match = self._keys[s] == k[:, None]
            # EMPTY_KEY "matches" empty slots; it is never stored, so it never hits.
            found = match.any(axis=1) & (k != EMPTY_KEY)
            slots[start : start + _CHUNK] = np.where(found, s * WAYS + match.argmax(axis=1), -1)
        return slots

    def _query(self, keys: Any, out: Any, clock: np.uint64) -> Any:
        slots = self._find(keys, set_of(keys, self._num_sets, np))
        hit = slots >= 0
        hits = int(np.count_nonzero(hit))
        self._counters[HITS] += hits
        self._counters[MISSES] += len(keys) - hits
        self._counters[RESERVED_KEY_MISSES] += int(np.count_nonzero(keys == EMPTY_KEY))
        positions = np.flatnonzero(hit)
        hit_rows = self._values[slots[positions]]
        if not self.row_format.is_identity:
            hit_rows = self.row_format.decode_stored(hit_rows)
        out[positions] = hit_rows
        # A key hit twice keeps its later (larger) stamp, like the kernel's atomicMax.
        np.maximum.at(
            self._stamps.reshape(-1), slots[positions], clock + positions.astype(np.uint64)
        )
        return hit

    def _replace(self, keys: Any, rows: Any, sets: Any, plan: RunPlan, clock: np.uint64) -> None:
        starts = plan.bounds[:-1]
        rank = np.arange(plan.order.shape[0]) - np.repeat(starts, np.diff(plan.bounds))
        by_round = plan.order[np.argsort(rank, kind="stable")]
        begin = 0
        for end in np.cumsum(np.bincount(rank)).tolist():
            self._replace_round(keys, rows, sets, by_round[begin:end], clock)
            begin = end

    def _replace_round(
        self, keys: np.ndarray, rows: np.ndarray, sets: np.ndarray, pos: np.ndarray, clock: Any
    ) -> None:
        """Apply one key to each of several distinct sets."""
        s = sets[pos]
        k = keys[pos]
        stored = self._keys[s]
        match = stored == k[:, None]
        present = match.any(axis=1)
        empty = stored == EMPTY_KEY
        has_empty = empty.any(axis=1)
        # Stamps of stored keys are unique, so argmin is the exact LRU slot of a full set.
        lru = self._stamps[s].argmin(axis=1)
        free_or_lru = np.where(has_empty, empty.argmax(axis=1), lru)
        way = np.where(present, match.argmax(axis=1), free_or_lru)
        self._keys[s, way] = k
        self._stamps[s, way] = clock + pos.astype(np.uint64)
        new = ~present
        self._values[s[new] * WAYS + way[new]] = rows[pos[new]]
        self._counters[INSERTS] += int(np.count_nonzero(new))
        self._counters[EVICTIONS] += int(np.count_nonzero(new & ~has_empty))

    def _update(self, keys: Any, rows: Any, sets: Any, positions: Any) -> None:
        slots = self._find(keys[positions], sets[positions])
        found = slots >= 0
        self._counters[UPDATED] += int(np.count_nonzero(found))
        hit_positions = positions[found]
        hit_slots = slots[found]
        last = last_of_each(hit_slots, np)
        self._values[hit_slots[last]] = rows[hit_positions[last]]
