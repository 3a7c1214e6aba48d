"""Counters every cache keeps, and the order in which they sit in its counter array.

The counters live in an int64 array of the cache's array module, so a CuPy cache adds to them
on the device without a host synchronisation per call; :func:`stats_from_counters` reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Positions in the counter array. The CUDA source is generated with the same numbers.
HITS = 0
MISSES = 1
RESERVED_KEY_MISSES = 2
INSERTS = 3
EVICTIONS = 4
UPDATED = 5
NUM_COUNTERS = 6


@dataclass(frozen=True)
class CacheStats:
    """Cumulative counters of one cache since it was created.

    Attributes:
        hits: queried keys found.
        misses: queried keys not found (``reserved_key_misses`` included).
        reserved_key_misses: queried keys equal to the empty-slot marker, which always miss.
        inserts: keys written into a slot by ``replace`` (evictions included).
        evictions: inserts that pushed out the least recently used key of a full set.
        updated: batch entries of ``update`` whose key was present and got overwritten.
    """

    hits: int = 0
    misses: int = 0
    reserved_key_misses: int = 0
    inserts: int = 0
    evictions: int = 0
    updated: int = 0

    @property
    def hit_rate(self) -> float:
        """``hits / (hits + misses)``, or 0.0 before the first query."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


def stats_from_counters(counters: Any) -> CacheStats:
    """Build :class:`CacheStats` from a counter array (NumPy or CuPy, copied to host).

    Args:
        counters: int64 array of ``NUM_COUNTERS`` values in the order of this module.

    Returns:
        The counters as plain Python ints.
    """
    values = [int(v) for v in counters.tolist()]
    return CacheStats(
        hits=values[HITS],
        misses=values[MISSES],
        reserved_key_misses=values[RESERVED_KEY_MISSES],
        inserts=values[INSERTS],
        evictions=values[EVICTIONS],
        updated=values[UPDATED],
    )
