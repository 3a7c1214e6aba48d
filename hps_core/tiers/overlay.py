"""Rows that online updates brought for keys the shared host tier does not hold.

The shared host tier (:mod:`hps_core.tiers.host_table`) is a sorted hash layout built from the
sparse files: it can overwrite the rows it holds in place, but it has no room for new keys.
An update (:mod:`hps_core.updates`) for a key it lacks is kept here instead, in this process's
memory, and the lookup cascade (:class:`~hps_core.tiers.cascade.TieredTable`) consults this
tier first below the shared one, so that the host path and the GPU pipeline (through
``lookup_lower``) both answer the new row.

The overlay is per process and starts empty: what it held is rebuilt by replaying the update
stream (see :mod:`hps_core.updates.apply`).

A table stored compressed (``row_format``, :mod:`hps_core.quant`) keeps its overlay rows
compressed too: an update's FP32 vectors are encoded once when inserted, :meth:`OverlayStore.lookup`
answers them decoded and :meth:`OverlayStore.lookup_stored` hands out the stored rows (what the
GPU caches take, never re-encoded from decoded values).

Bounds: as HugeCTR's host hash map (``HugeCTR/src/hps/hash_map_backend.cpp``), a table is
split into ``partitions`` by HugeCTR's key hash
(:func:`~hps_core.hashing.partition_of`), and ``margin`` bounds each partition, so
a table holds at most ``margin x partitions`` rows (HugeCTR's ``VolatileBackend::capacity``).
When an :meth:`OverlayStore.insert` (one update message) leaves a partition with more than
``margin`` rows, the partition is shrunk to ``round(margin x target)`` rows (HugeCTR's
``overflow_resolution_margin``) by the policy; the rows of the message itself may go too.
Evicted keys fall to the tiers below (Redis, RocksDB, the default vector), as in HugeCTR, and
their storage is reused by later inserts, so the rows allocated never exceed the bound plus
one message's new keys. ``margin=None``: no bound, nothing evicted. The policies, with
HugeCTR's definitions (``hash_map_backend_detail.hpp``, insert and fetch macros):

- ``evict_random``: random rows of the partition.
- ``evict_oldest``: the rows inserted, updated or found by a lookup least recently (HugeCTR
  sets ``last_access`` on each). HugeCTR keeps seconds; here a counter gives every row event
  its own tick (in the message's or the lookup's key order), so there are no ties.
- ``evict_least_used``: the rows found by the fewest lookups since they were last inserted
  or updated (HugeCTR resets ``access_count`` on insert), the oldest insert first among equal
  counts. Afterwards the survivors' counts become ``(count - least surviving count) // 2``,
  the normalisation HugeCTR describes (its hash map writes it to a copy, so it has no effect
  there), so that once-popular keys do not stay forever.

Two differences from HugeCTR's hash map, both as the Redis tier
(:mod:`hps_core.tiers.redis_store`): the margin is checked after the message is written
(HugeCTR checks before each ``max_batch_size`` batch, so a partition can exceed its margin by
one batch until the next insert), and only the excess goes (HugeCTR evicts whole batches).

Example:
    >>> store = OverlayStore()
    >>> store.insert("hps_et.m.t0", np.array([5, 9]), np.ones((2, 2), np.float32))
    >>> values, found = store.lookup("hps_et.m.t0", np.array([9, 4]), dim=2, default=-1.0)
    >>> values.tolist(), found.tolist()
    ([[1.0, 1.0], [-1.0, -1.0]], [True, False])
    >>> bounded = OverlayStore(margin=2, policy=OverflowPolicy.EVICT_OLDEST, target=0.5)
    >>> bounded.insert("t", np.array([1, 2, 3]), np.zeros((3, 1), np.float32))
    >>> bounded.rows("t"), bounded.evictions, bounded.lookup("t", np.array([1, 3]), 1)[1].tolist()
    (1, 2, [False, True])
"""

from __future__ import annotations

import itertools
import os
import threading

import numpy as np

from hps_core.config import OverflowPolicy
from hps_core.errors import RequestError
from hps_core.hashing import partition_of
from hps_core.quant import RowFormat, StoragePrecision
from hps_core.tiers.backing import copy_sparse_folder

_INITIAL_ROWS = 1024
_FREE = -1
"""The partition of a row no key holds (free, or never used)."""


def _rows_of(index: dict[int, int], keys: np.ndarray) -> np.ndarray:
    """int64 row of each key in ``index``, -1 where it has none."""
    found = map(index.get, keys.tolist(), itertools.repeat(-1))
    return np.fromiter(found, np.int64, len(keys))


class _Table:
    """One table's rows: ``index`` maps a key to its row of ``values``.

    Per row: ``keys`` (its key), ``part`` (its partition, :data:`_FREE` when no key holds
    it), ``stamp`` (tick of its last insert, or hit for ``evict_oldest``) and ``uses`` (hits
    since its last insert). Free rows (evicted or removed) are stacked in ``free`` and taken
    before fresh ones; ``used`` rows of the arrays have ever held a key.
    """

    def __init__(self, fmt: RowFormat, partitions: int, limit: int | None) -> None:
        self.fmt = fmt
        self.dim = fmt.dim
        self.limit = limit
        self.index: dict[int, int] = {}
        self.free: list[int] = []
        self.used = 0
        self.sizes = np.zeros(partitions, np.int64)
        self.evictions = 0
        self._allocate(_INITIAL_ROWS if limit is None else max(1, min(_INITIAL_ROWS, limit)))

    def _allocate(self, capacity: int) -> None:
        self.values = np.empty((capacity, self.fmt.row_words), self.fmt.stored_dtype)
        self.keys = np.zeros(capacity, np.int64)
        self.part = np.full(capacity, _FREE, np.int32)
        self.stamp = np.zeros(capacity, np.int64)
        self.uses = np.zeros(capacity, np.int64)

    def reserve(self, rows: int) -> None:
        """Make room for ``rows`` rows in total (before any write, so a write cannot fail).

        Grows by doubling, but not past the table's bound unless ``rows`` itself is past it:
        the rows allocated stay within the bound plus one message's new keys.
        """
        capacity = len(self.values)
        if rows <= capacity:
            return
        doubled = 2 * capacity if self.limit is None else min(2 * capacity, self.limit)
        old = (self.values, self.keys, self.part, self.stamp, self.uses)
        self._allocate(max(rows, doubled))
        new = (self.values, self.keys, self.part, self.stamp, self.uses)
        for grown, kept in zip(new, old, strict=True):
            grown[: self.used] = kept[: self.used]

    def release(self, rows: np.ndarray) -> None:
        """Make ``rows`` free (their keys are already out of ``index``)."""
        np.subtract.at(self.sizes, self.part[rows], 1)
        self.part[rows] = _FREE
        self.free.extend(rows.tolist())


class OverlayStore:
    """An in-memory :class:`~hps_core.tiers.backing.BackingStore` for updated rows, bounded
    like HugeCTR's host hash map (see the module notes).

    Thread-safe: the update thread writes while request threads read; every call holds one
    lock, so a reader sees an :meth:`insert` (one update message) whole or not at all.

    Args:
        margin: rows each partition of a table may hold (ps.json
            ``volatile_db.overflow_margin``); ``None``: no bound.
        policy: which rows an overflowing partition evicts (``volatile_db.overflow_policy``).
        target: an overflowing partition is shrunk to ``round(margin x target)`` rows
            (``volatile_db.overflow_resolution_target``).
        partitions: partitions of each table (``volatile_db.num_partitions``, resolved).
        seed: seed of the ``evict_random`` draws (``None``: fresh entropy).
        precision: how the rows of its tables are stored (each table's width comes with its
            first insert).

    Raises:
        ValueError: ``margin`` or ``partitions`` below 1, or ``target`` outside (0, 1].
    """

    kind = "overlay"
    """Its label in the per-tier counters and metrics."""

    def __init__(
        self,
        margin: int | None = None,
        policy: OverflowPolicy = OverflowPolicy.EVICT_RANDOM,
        target: float = 0.8,
        partitions: int = 1,
        seed: int | None = None,
        precision: StoragePrecision = StoragePrecision.FP32,
    ) -> None:
        if margin is not None and margin < 1:
            raise ValueError(f"overlay: overflow_margin must be at least 1, got {margin}")
        if partitions < 1:
            raise ValueError(f"overlay: num_partitions must be at least 1, got {partitions}")
        if not 0.0 < target <= 1.0:
            raise ValueError(f"overlay: overflow_resolution_target must be in (0, 1], got {target}")
        self.margin = margin
        self.precision = StoragePrecision.parse(precision)
        self.policy = OverflowPolicy(policy)
        self.partitions = partitions
        # HugeCTR's resolution margin: margin * target, rounded half up.
        self.resolution = None if margin is None else int(margin * target + 0.5)
        self.errors = 0
        self.evictions = 0
        """Rows evicted by overflow (every table) since the store was made."""
        self._tables: dict[str, _Table] = {}
        self._lock = threading.Lock()
        self._rng = np.random.default_rng(seed)
        self._clock = 0  # ticks of row events, for evict_oldest and the least-used ties

    def tables(self) -> list[str]:
        """The tables that received rows, sorted."""
        with self._lock:
            return sorted(self._tables)

    def rows(self, table: str) -> int:
        """Rows held for ``table`` (0 if it has none)."""
        with self._lock:
            held = self._tables.get(table)
            return 0 if held is None else len(held.index)

    def keys(self, table: str) -> np.ndarray:
        """The keys held for ``table``, sorted int64 (no lookup: the policy is not touched)."""
        with self._lock:
            held = self._tables.get(table)
            index = {} if held is None else held.index
            return np.sort(np.fromiter(index, np.int64, len(index)))

    def allocated(self, table: str) -> int:
        """Rows of storage allocated for ``table``, held or free (0 if it has none)."""
        with self._lock:
            held = self._tables.get(table)
            return 0 if held is None else len(held.values)

    def partition_sizes(self, table: str) -> list[int]:
        """Rows held in each partition of ``table``, by partition index."""
        with self._lock:
            held = self._tables.get(table)
            return [0] * self.partitions if held is None else held.sizes.tolist()

    def table_evictions(self, table: str) -> int:
        """Rows of ``table`` evicted by overflow."""
        with self._lock:
            held = self._tables.get(table)
            return 0 if held is None else held.evictions

    @property
    def stores_encoded(self) -> bool:
        """Whether :meth:`lookup_stored` gives rows in a compressed precision (for the
        lookup cascade, which then does not encode them again)."""
        return self.precision is not StoragePrecision.FP32

    def insert(self, table: str, keys: np.ndarray, vectors: np.ndarray) -> None:
        """Write rows, replacing existing ones; the last of repeated keys wins. Then shrink
        every partition left above the margin (see the module notes).

        Args:
            table: the table's tag.
            keys: int64 ``[n]``.
            vectors: float32 ``[n, dim]``, encoded here in the store's precision.

        Raises:
            RequestError: the shapes disagree, or ``dim`` differs from the table's.
        """
        keys = np.ascontiguousarray(keys, dtype=np.int64).ravel()
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or len(vectors) != len(keys):
            raise RequestError(
                f"overlay {table}: {len(keys)} keys but vectors of shape {vectors.shape}"
            )
        fmt = RowFormat(self.precision, vectors.shape[1])
        self._insert(table, keys, vectors if fmt.is_identity else fmt.encode_stored(vectors), fmt)

    def insert_stored(self, table: str, keys: np.ndarray, stored: np.ndarray, dim: int) -> None:
        """:meth:`insert` of rows already stored in the store's precision (what
        :meth:`lookup_stored` gave: an undo puts them back byte for byte).

        Args:
            table: the table's tag.
            keys: int64 ``[n]``.
            stored: ``[n, row_words]`` stored rows (float32 ``[n, dim]`` for fp32).
            dim: the table's width.

        Raises:
            RequestError: the shapes disagree with the table's.
        """
        keys = np.ascontiguousarray(keys, dtype=np.int64).ravel()
        fmt = RowFormat(self.precision, dim)
        stored = np.asarray(stored, dtype=fmt.stored_dtype)
        if stored.shape != (len(keys), fmt.row_words):
            raise RequestError(
                f"overlay {table}: {len(keys)} keys but stored rows of shape {stored.shape}"
            )
        self._insert(table, keys, stored, fmt)

    def _insert(self, table: str, keys: np.ndarray, stored: np.ndarray, fmt: RowFormat) -> None:
        with self._lock:
            held = self._tables.get(table)
            if held is None:
                limit = None if self.margin is None else self.margin * self.partitions
                held = _Table(fmt, self.partitions, limit)
            if held.dim != fmt.dim:
                raise RequestError(
                    f"overlay {table}: rows of {fmt.dim} floats, the table has {held.dim}"
                )
            # Plan every row before writing any, so an insert is applied whole. New keys
            # (once each) take free rows first, then fresh ones.
            rows = _rows_of(held.index, keys)
            missing = rows < 0
            new_keys, inverse = np.unique(keys[missing], return_inverse=True)
            reused = min(len(new_keys), len(held.free))
            fresh = len(new_keys) - reused
            new_rows = np.concatenate(
                [
                    np.array(held.free[len(held.free) - reused :], np.int64),
                    np.arange(held.used, held.used + fresh, dtype=np.int64),
                ]
            )
            rows[missing] = new_rows[inverse]
            new_parts = (
                partition_of(new_keys, self.partitions)
                if self.partitions > 1
                else np.zeros(len(new_keys), np.int64)
            )
            held.reserve(held.used + fresh)
            # Writes (none can fail).
            del held.free[len(held.free) - reused :]
            held.used += fresh
            held.values[rows] = stored  # repeated rows: NumPy keeps the last assignment
            held.keys[new_rows] = new_keys
            held.part[new_rows] = new_parts
            held.sizes += np.bincount(new_parts, minlength=self.partitions)
            held.stamp[rows] = self._clock + np.arange(len(rows))
            self._clock += len(rows)
            held.uses[rows] = 0
            held.index.update(zip(new_keys.tolist(), new_rows.tolist(), strict=True))
            self._tables[table] = held
            if self.margin is not None:
                for part in np.flatnonzero(held.sizes > self.margin).tolist():
                    self._resolve_overflow(held, part)

    def _resolve_overflow(self, held: _Table, part: int) -> None:
        """Shrink partition ``part`` to the resolution margin by the policy."""
        assert self.resolution is not None
        rows = np.flatnonzero(held.part[: held.used] == part)
        excess = len(rows) - self.resolution
        if self.policy is OverflowPolicy.EVICT_RANDOM:
            victims = self._rng.choice(rows, excess, replace=False)
        elif self.policy is OverflowPolicy.EVICT_OLDEST:
            # Ticks are distinct: the excess smallest are one well-defined set.
            victims = rows[np.argpartition(held.stamp[rows], excess - 1)[:excess]]
        else:
            order = rows[np.lexsort((held.stamp[rows], held.uses[rows]))]
            victims, survivors = order[:excess], order[excess:]
            if len(survivors):
                least = held.uses[survivors[0]]
                held.uses[survivors] = (held.uses[survivors] - least) // 2
        for key in held.keys[victims].tolist():
            del held.index[key]
        held.release(victims)
        held.evictions += len(victims)
        self.evictions += len(victims)

    def remove(self, table: str, keys: np.ndarray) -> None:
        """Forget ``keys`` (used to undo a partly applied update); unknown keys are ignored.
        Their rows are reused by later inserts.

        Args:
            table: the table's tag.
            keys: int64 keys.
        """
        with self._lock:
            held = self._tables.get(table)
            if held is None:
                return
            pop = held.index.pop
            gone = [pop(key, -1) for key in np.asarray(keys, dtype=np.int64).ravel().tolist()]
            rows = np.asarray(gone, np.int64)
            held.release(rows[rows >= 0])

    def load_sparse(self, table: str, folder: str | os.PathLike[str], dim: int) -> int:
        """Copy a sparse model folder into ``table`` (for tests; serving fills it by updates).

        Returns:
            Rows written.
        """
        return copy_sparse_folder(self, table, folder, dim)

    def lookup(
        self, table: str, keys: np.ndarray, dim: int, default: float = 0.0, *, count: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """float32 ``[n, dim]`` vectors (``default`` where missing) and a bool found mask.

        With a margin, each hit counts for the policy: a use (``evict_least_used``, every
        occurrence) or a tick (``evict_oldest``, in key order).

        Args:
            table: the table's tag.
            keys: int64 keys, any order, repeats allowed.
            dim: floats per vector.
            default: value of every element of a missing key's vector.
            count: ``False`` for a read that is not a use (the updater's own bookkeeping):
                the policy's counters stay as they are.

        Returns:
            ``(values, found)``.
        """
        values = np.full((len(np.ravel(keys)), dim), default, np.float32)
        stored, found = self._lookup(table, keys, dim, count)
        if found.any():
            fmt = RowFormat(self.precision, dim)
            hits = stored[found]
            values[found] = hits if fmt.is_identity else fmt.decode_stored(hits)
        return values, found

    def lookup_stored(
        self, table: str, keys: np.ndarray, dim: int, *, count: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """The stored rows of ``keys`` (as :meth:`lookup`, undecoded).

        Args:
            table: the table's tag.
            keys: int64 keys, any order, repeats allowed.
            dim: the table's width.
            count: as for :meth:`lookup`.

        Returns:
            ``(stored, found)``: ``[n, row_words]`` rows in the store's precision (float32
            ``[n, dim]`` for fp32; zero where missing) and the bool found mask.
        """
        return self._lookup(table, keys, dim, count)

    def _lookup(
        self, table: str, keys: np.ndarray, dim: int, count: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        keys = np.ascontiguousarray(keys, dtype=np.int64).ravel()
        fmt = RowFormat(self.precision, dim)
        stored = np.zeros((len(keys), fmt.row_words), fmt.stored_dtype)
        with self._lock:
            held = self._tables.get(table)
            if held is None or not held.index or not len(keys):
                return stored, np.zeros(len(keys), bool)
            if held.dim != dim:
                raise RequestError(
                    f"overlay {table}: asked for dim {dim}, the table has {held.dim}"
                )
            rows = _rows_of(held.index, keys)
            found = rows >= 0
            if found.any():
                hits = rows[found]
                stored[found] = held.values[hits]
                if count and self.margin is not None:
                    self._count_hits(held, hits)
        return stored, found

    def _count_hits(self, held: _Table, hits: np.ndarray) -> None:
        if self.policy is OverflowPolicy.EVICT_LEAST_USED:
            np.add.at(held.uses, hits, 1)
        elif self.policy is OverflowPolicy.EVICT_OLDEST:
            held.stamp[hits] = self._clock + np.arange(len(hits))  # a repeat: its last tick
            self._clock += len(hits)

    def close(self) -> None:
        """Drop every row (idempotent)."""
        with self._lock:
            self._tables.clear()
