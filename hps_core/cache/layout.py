"""Memory layout of the dynamic GPU embedding cache and the batch plans its writers share.

Layout
------
The cache is set-associative: ``num_sets`` sets of ``WAYS = 64`` slots. Slot ``s`` of set ``t``
is the flat slot ``t * WAYS + s``; three arrays are indexed by it:

- ``slot_keys``   int64   ``[num_sets, WAYS]``  the key held, or ``EMPTY_KEY``;
- ``slot_stamps`` uint64  ``[num_sets, WAYS]``  when the slot was last touched (LRU order);
- ``slot_values`` ``[num_sets * WAYS, row_words]`` the embedding vectors as the table stores
  them (float32 ``[.., dim]`` for fp32; the uint32 words of encoded rows otherwise, see
  :mod:`hps_core.quant`).

A key lives in set ``mix64(key) % num_sets`` (:func:`hps_core.hashing.mix64`) and may take any
slot of that set. Slots are never freed one by one (only :meth:`clear` empties them), so the
occupied slots of a set always form a prefix ``0 .. count-1``.

How this compares with HugeCTR (``gpu_cache/``, v24.06) and why
----------------------------------------------------------------
HugeCTR's ``gpu_cache`` has ``capacity_in_set`` slab sets of ``SET_ASSOCIATIVITY = 2`` slabs of
``SLAB_SIZE = 32`` slots: 64 slots per set, the same capacity rule (HPS sizes a table's cache
as ``ceil(max(cache_size_percentage * rows, 64) / 64)`` sets, see :func:`num_sets_for`), the
same memory per slot (an 8-byte key and an 8-byte ``uint64`` counter) and the same
``long long`` empty key (``INT64_MAX``). It differs as follows, mostly where HugeCTR is not
deterministic:

- HugeCTR hashes a key to a set with MurmurHash3 and to a starting slab with a second hash,
  then probes slab by slab. A set here is one flat row of 64 slots that a warp reads in one
  step (two slots per lane), so no starting slab is needed.
- HugeCTR gives every slot touched by one ``Query`` the same counter value (the global counter
  is bumped once per call) and breaks ties by slab and slot distance; which of two keys of
  one batch wins a set is decided by which warp takes the set's spin lock first. Here the
  clock advances by the batch length on every call and the key at batch position ``p`` gets
  stamp ``clock + p``: stamps in a set are unique, LRU order is exact, and the result does
  not depend on scheduling.
- HugeCTR's ``Replace`` runs one warp per key under per-set mutexes. Here ``replace`` and
  ``update`` first sort the batch by ``(set, position)`` (:func:`plan_runs`); each run of
  equal sets is handled by one warp, in batch order, without locks. Because sets are
  independent, this equals processing the batch strictly in order, which is what the NumPy
  twin and the reference model in the tests do.
- HugeCTR's empty key cannot be served ("user should never use empty key to represent any real
  key"). Here ``EMPTY_KEY`` is a valid request key that always misses, is never inserted, and
  is counted (``reserved_key_misses``), so no key gets a wrong answer.
- HugeCTR's ``Query`` compacts the misses into ``d_missing_keys``/``d_missing_index`` in an
  order that depends on scheduling; here ``query`` returns a hit mask (the caller takes
  ``flatnonzero(~hit)``), which is deterministic and cheaper when most keys hit.

Kept as in HugeCTR: ``Replace`` of a stored key only refreshes it (its vector is not
overwritten); ``Update`` overwrites stored keys only and does not touch LRU order; ``Dump``
returns the keys of a range of sets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from hps_core.hashing import mix64
from hps_core.quant import RowFormat, StoragePrecision

WAYS = 64
"""Slots per set (HugeCTR: ``SET_ASSOCIATIVITY * SLAB_SIZE`` = 2 * 32)."""

EMPTY_KEY = int(np.iinfo(np.int64).max)
"""Marker of an empty slot; as a request key it always misses (HugeCTR's ``long long`` empty)."""


def num_sets_for(capacity_rows: int) -> int:
    """Number of sets that hold at least ``capacity_rows`` rows, HPS's sizing rule.

    Args:
        capacity_rows: wanted capacity in embedding rows (``cache_size_percentage * rows``).

    Returns:
        ``ceil(max(capacity_rows, WAYS) / WAYS)``: never less than one set.

    Example:
        >>> num_sets_for(1), num_sets_for(64), num_sets_for(65)
        (1, 1, 2)
    """
    return -(-max(int(capacity_rows), WAYS) // WAYS)


def cache_capacity_rows(gpucacheper: float, table_rows: int) -> int:
    """Rows a table's dynamic cache is asked to hold: ``ceil(gpucacheper * table_rows)``.

    ``gpucacheper`` is a share of the whole table (the sparse files' rows), not of the part
    a host tier holds. :func:`num_sets_for` turns it into sets.

    Example:
        >>> cache_capacity_rows(0.2, 1001), cache_capacity_rows(0.0, 10)
        (201, 0)
    """
    return math.ceil(gpucacheper * table_rows)


@dataclass(frozen=True)
class SlotBytes:
    """Bytes of the three arrays of a dynamic cache's slots (module docstring).

    Attributes:
        keys: int64 ``[num_sets, WAYS]``.
        stamps: uint64 ``[num_sets, WAYS]``.
        values: float32 ``[num_sets * WAYS, dim]``.
    """

    keys: int
    stamps: int
    values: int

    @property
    def nbytes(self) -> int:
        """The three together (a private cache's arrays; a shared cache's one allocation adds
        the alignment of its offsets, see :mod:`hps_core.cache.ipc_group`)."""
        return self.keys + self.stamps + self.values


def slot_bytes(
    num_sets: int, dim: int, precision: StoragePrecision = StoragePrecision.FP32
) -> SlotBytes:
    """Bytes of the slot arrays of a cache of ``num_sets`` sets of width ``dim`` whose rows
    are stored in ``precision``.

    Example:
        >>> slot_bytes(1, 4).nbytes  # 64 keys, 64 stamps, 64 rows of 4 floats
        2048
        >>> slot_bytes(1, 4, StoragePrecision.FP16).values  # 64 rows of 4 halves
        512
    """
    slots = num_sets * WAYS
    row_bytes = RowFormat(precision, dim).row_bytes
    return SlotBytes(keys=slots * 8, stamps=slots * 8, values=slots * row_bytes)


def set_of(keys: Any, num_sets: int, xp: Any = np) -> Any:
    """Set index of each key.

    Args:
        keys: int64 array of keys (NumPy or CuPy).
        num_sets: number of sets of the cache.
        xp: the array module of ``keys``.

    Returns:
        int64 array of set indices in ``[0, num_sets)``, same shape as ``keys``.
    """
    return (mix64(keys, xp) % np.uint64(num_sets)).astype(xp.int64)


@dataclass(frozen=True)
class RunPlan:
    """A batch sorted by ``(set, position)``, cut into runs of one set each.

    Attributes:
        order: int64 batch positions, sorted by ``(set, position)``.
        bounds: int64 ``[runs + 1]``; run ``r`` is ``order[bounds[r]:bounds[r + 1]]``.
    """

    order: Any
    bounds: Any

    @property
    def runs(self) -> int:
        """Number of runs (distinct sets in the batch)."""
        return int(self.bounds.shape[0]) - 1


def plan_runs(sets: Any, positions: Any, xp: Any = np) -> RunPlan:
    """Sort the chosen batch positions by ``(set, position)`` and find the runs of equal sets.

    The sort key ``set * n + position`` is unique, so the order does not depend on whether the
    sort of ``xp`` is stable: NumPy and CuPy produce the same plan. (It fits in 64 bits while
    ``num_sets * n < 2**64``, e.g. a trillion-row cache and a batch of a million keys.)

    Args:
        sets: int64 ``[n]`` set index of every batch position.
        positions: int64 increasing batch positions to plan (e.g. those not holding
            ``EMPTY_KEY``); may be empty.
        xp: the array module of both arrays.

    Returns:
        The :class:`RunPlan`.
    """
    n = np.uint64(sets.shape[0])
    count = int(positions.shape[0])
    if count == 0:
        return RunPlan(order=positions, bounds=xp.zeros(1, dtype=xp.int64))
    sort_key = sets[positions].astype(xp.uint64) * n + positions.astype(xp.uint64)
    order = positions[xp.argsort(sort_key)]
    sorted_sets = sets[order]
    starts = xp.flatnonzero(sorted_sets[1:] != sorted_sets[:-1]) + 1
    bounds = xp.concatenate(
        [
            xp.zeros(1, dtype=xp.int64),
            starts.astype(xp.int64),
            xp.full(1, count, dtype=xp.int64),
        ]
    )
    return RunPlan(order=order, bounds=bounds)


def last_of_each(groups: Any, xp: Any = np) -> Any:
    """Index of the last occurrence of each distinct value of ``groups``.

    Used where a batch names the same row twice and the later write must win. Sorting by
    ``group * m + index`` (unique) keeps the result independent of sort stability.

    Args:
        groups: non-negative int64 ``[m]`` (e.g. the slot or table row each entry writes).
        xp: the array module of ``groups``.

    Returns:
        int64 indices into ``groups``, one per distinct value, in increasing value order.

    Example:
        >>> last_of_each(np.array([5, 2, 5, 7, 2]))
        array([4, 2, 3])
    """
    m = int(groups.shape[0])
    if m == 0:
        return xp.zeros(0, dtype=xp.int64)
    index = xp.arange(m, dtype=xp.uint64)
    order = xp.argsort(groups.astype(xp.uint64) * np.uint64(m) + index)
    sorted_groups = groups[order]
    is_last = xp.ones(m, dtype=bool)
    is_last[:-1] = sorted_groups[1:] != sorted_groups[:-1]
    return order[is_last].astype(xp.int64)
