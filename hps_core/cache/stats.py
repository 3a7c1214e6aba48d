"""The counters of every GPU cache kernel, and their positions: the one counter vocabulary.

Two kinds of array hold them, of 64-bit integers with one entry per position of this module
(``NUM_COUNTERS`` of them), added to on the device without a host synchronisation per call:

- a cache's own array, ``[NUM_COUNTERS]`` int64, in the cache's array module (made by
  :class:`~hps_core.cache.dynamic.DynamicCache` and
  :class:`~hps_core.cache.static_table.StaticTable`): added to by ``cache_query``,
  ``cache_replace``, ``cache_update`` and ``static_query`` of
  ``hps_core/cuda/kernels/cache.cu``, or by the same steps in NumPy; read by
  :func:`stats_from_counters`;
- the GPU ranking pipeline's, ``[tables, NUM_COUNTERS]`` uint64, one row per table of a
  :class:`~hps_core.infer.gpu.bank.CacheBank` (``bank_find`` and ``bank_insert`` of
  ``hps_core/cuda/kernels/bank.cu``, block-aggregated atomics); the host reads it only when
  metrics are published (``CacheBank.table_counters``). There keys are counted per
  occurrence (the hit rate is per key occurrence), rows read over PCIe per distinct missed
  key.

Each kernel adds only to the positions whose docstring names it; the others stay 0 in its
array. ``kernel_consts.shared_defines`` gives the CUDA sources the same names and numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HITS = 0
"""Keys answered from GPU memory. Cache: queried keys found (``cache_query``,
``static_query``). Bank: key occurrences found in the table's dynamic cache or, for a static
table, in its rows (``bank_find``)."""
MISSES = 1
"""Keys not answered from GPU memory. Cache: queried keys not found, ``RESERVED_KEY_MISSES``
included (``cache_query``, ``static_query``). Bank: key occurrences answered from the host
tier, the lower tiers' rows or the default vector, ``UNKNOWN`` included (``bank_find``)."""
RESERVED_KEY_MISSES = 2
"""Queried keys equal to the empty-slot marker (``EMPTY_KEY``), which always miss; counted among
``MISSES`` (``cache_query``)."""
INSERTS = 3
"""Keys written into a slot of a dynamic cache, ``EVICTIONS`` included (``cache_replace``;
``bank_insert``, a listed miss put into its table's cache)."""
EVICTIONS = 4
"""Inserts that pushed out the least recently used key of a full set (``cache_replace``,
``bank_insert``)."""
UPDATED = 5
"""Batch entries of ``update`` whose key was present and got overwritten (``cache_update``;
:meth:`~hps_core.cache.static_table.StaticTable.update`)."""
KEYS = 6
"""Key occurrences looked up (``bank_find``)."""
UNKNOWN = 7
"""Key occurrences the table does not hold, answered with its default vector; counted among
``MISSES`` (``bank_find``)."""
HOST_ROWS = 8
"""Rows read from host memory (over PCIe): a missed key's row once per batch, or each row
read in place (``bank_find``)."""
NUM_COUNTERS = 9
"""Positions of a counter array (a cache's length, a bank's row width)."""


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
        counters: a cache's int64 array of ``NUM_COUNTERS`` values in the order of this
            module.

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
