"""Per-table counters the GPU pipeline keeps on the device, and their positions.

The lookup kernel adds to an int ``[tables, NUM_COUNTERS]`` device array (block-aggregated
atomics, no host synchronisation); the host reads it only when metrics are published. Keys
are counted per occurrence (the hit rate is per key occurrence), rows read over PCIe per
distinct missed key.
"""

from __future__ import annotations

C_KEYS = 0
"""Keys looked up."""
C_HITS = 1
"""Keys answered from GPU memory (dynamic cache hit, or a static table's row)."""
C_MISSES = 2
"""Keys not answered from GPU memory (from the host tier, or the default vector)."""
C_UNKNOWN = 3
"""Keys the table does not hold: answered with its default vector (counted among misses)."""
C_INSERTS = 4
"""Rows inserted into the dynamic cache."""
C_EVICTIONS = 5
"""Inserts that evicted the least recently used row of a full set."""
C_HOST_ROWS = 6
"""Rows read from host memory (over PCIe): a missed key's row once per batch, or each row read
in place."""
NUM_COUNTERS = 7
