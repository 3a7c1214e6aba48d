"""Reference model of the dynamic cache: plain dicts and per-set LRU lists, one key at a time.

It knows nothing of slots, stamps, rounds or runs; it only states the contract of
``hps_core.cache.dynamic``: which keys a set holds and in which least-recently-used order.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from hps_core.cache import EMPTY_KEY, WAYS, CacheStats
from hps_core.hashing import mix64


class LruModel:
    """Per set, an OrderedDict key -> vector, oldest first."""

    def __init__(self, num_sets: int, dim: int) -> None:
        self.num_sets = num_sets
        self.dim = dim
        self.sets: list[OrderedDict[int, np.ndarray]] = [OrderedDict() for _ in range(num_sets)]
        self.counts = dict.fromkeys(
            ("hits", "misses", "reserved_key_misses", "inserts", "evictions", "updated"), 0
        )

    def set_of(self, key: int) -> int:
        return int(mix64(np.array([key], dtype=np.int64))[0]) % self.num_sets

    def query(self, keys: list[int], out: np.ndarray) -> np.ndarray:
        hit = np.zeros(len(keys), dtype=bool)
        for i, key in enumerate(keys):
            entries = self.sets[self.set_of(key)]
            if key != EMPTY_KEY and key in entries:
                entries.move_to_end(key)
                out[i] = entries[key]
                hit[i] = True
                self.counts["hits"] += 1
            else:
                self.counts["misses"] += 1
                self.counts["reserved_key_misses"] += key == EMPTY_KEY
        return hit

    def replace(self, keys: list[int], values: np.ndarray) -> None:
        for key, row in zip(keys, values, strict=True):
            if key == EMPTY_KEY:
                continue
            entries = self.sets[self.set_of(key)]
            if key in entries:
                entries.move_to_end(key)
                continue
            if len(entries) == WAYS:
                entries.popitem(last=False)
                self.counts["evictions"] += 1
            entries[key] = row.astype(np.float32).copy()
            self.counts["inserts"] += 1

    def update(self, keys: list[int], values: np.ndarray) -> None:
        for key, row in zip(keys, values, strict=True):
            entries = self.sets[self.set_of(key)]
            if key != EMPTY_KEY and key in entries:
                entries[key] = row.astype(np.float32).copy()
                self.counts["updated"] += 1

    def keys_in(self, set_start: int, set_end: int) -> list[int]:
        return sorted(k for entries in self.sets[set_start:set_end] for k in entries)

    def lru_order(self, set_index: int) -> list[int]:
        return list(self.sets[set_index])

    @property
    def size(self) -> int:
        return sum(len(entries) for entries in self.sets)

    def stats(self) -> CacheStats:
        return CacheStats(**self.counts)
