"""Keys -> vectors for one table on the host, and one table's GPU embedding cache.

:class:`HostTableLookup` reads the shared host tier directly (CPU instances): each call's
distinct keys are looked up once (a few keys as they come), through the tiers below the
shared one where the model has them; on a GPU without cache (``gpucache: false``) it holds
the host tier the GPU lookups read. :class:`CachedTableLookup` holds a table's GPU
embedding cache (dynamic or static) in front of its host tier; it answers no lookups itself:
every GPU lookup goes through the cache bank's kernels
(:class:`~hps_core.infer.gpu.bank_lookup.BankLookup`, the ranking pipeline), which read its
cache and host tier. It warms the cache before serving and refreshes cached rows from the
host tier; its methods run with CuPy (the GPU cache) and, in the tests, with NumPy (the
cache's twin, ``tests/unit/cache/cache_twin.py``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from hps_core.arrays import distinct_keys, to_host
from hps_core.cache import StaticTable
from hps_core.hashing import mix64
from hps_core.tiers.cascade import TieredTable
from hps_core.tiers.hash_layout import SEARCH_KEYS
from hps_core.tiers.host_table import SharedHostTable


@dataclass
class TableCounters:
    """What one table's lookups did since the model lookup opened.

    The lookup counters (``keys``, ``cache_hits``, ``cache_misses``, ``unknown_keys``) count
    key occurrences, the same on every path: a key asked twice in one call counts twice,
    whether the host looks it up once (CPU instances, :class:`HostTableLookup`) or the cache
    bank on a GPU finds each occurrence
    (:meth:`~hps_core.infer.gpu.bank.CacheBank.table_counters`).

    Args:
        lookups: lookup calls (on a GPU: the bank's batches).
        keys: key occurrences asked for, duplicates included.
        cache_hits: key occurrences answered from GPU memory (the table's dynamic cache, or a
            static table's rows); 0 on the host.
        cache_misses: key occurrences the GPU did not hold (answered from the host tier, the
            tiers below it or the default vector, ``unknown_keys`` included); 0 on the host.
        unknown_keys: key occurrences no tier holds (answered with the table's default
            vector).
        inserted_keys: keys written into the table's dynamic cache by lookups (a miss put
            into a slot, evictions included); 0 on the host.
        evictions: rows the cache evicted to make room (read from the cache by ``snapshot``).
        host_rows: rows the GPU pipeline read from host memory over PCIe: each distinct missed
            key once per batch (staged on the GPU), and each read in place (a table without
            a dynamic cache, or misses beyond what the cache can take in one batch).
        seconds: time spent in lookups.
        tier_host_hits: keys the host side read from the shared host tier.
        tier_overlay_hits: keys answered by rows online updates added (new keys).
        tier_redis_cluster_hits: keys answered by the Redis cluster below it.
        tier_rocks_db_hits: keys answered by RocksDB.
        tier_model_files_hits: keys answered by the model's sparse files (below a Redis
            cluster without RocksDB: keys a lost node held).
        tier_default_keys: keys no tier holds (the default vector answered).
        tier_overlay_errors: failed lookups in the update overlay (not expected).
        tier_redis_cluster_errors: failed Redis requests (their keys fell through).
        tier_rocks_db_errors: failed RocksDB requests (their keys fell through).
        tier_model_files_errors: failed reads of the model files (changed or vanished).
        tier_unanswered_keys: keys no tier could answer while one that may hold them was
            down (their lookups failed).
        tier_elevated_keys: rows found below Redis written to it (RocksDB's with
            ``cache_missed_embeddings``, the model files' for rows it lost).
        tier_refilled_keys: rows offered to refill a Redis cluster that lost them.
        tier_dropped_elevations: batches of such rows dropped because too many were pending.
        tier_overlay_evictions: rows the update overlay evicted (``overflow_margin``).
        tier_overlay_lookups, tier_redis_cluster_lookups, tier_rocks_db_lookups,
        tier_model_files_lookups: lookups that reached each tier below the shared one.
        tier_overlay_seconds, tier_redis_cluster_seconds, tier_rocks_db_seconds,
        tier_model_files_seconds: the time they took.

    The ``tier_*`` counters count what the host-side tiers were asked, not key occurrences:
    a host lookup asks them each distinct key of its call once. Those of a table with lower
    tiers come from its cascade (:class:`~hps_core.tiers.cascade.TierCounters`, every
    host-side lookup of the table, warm-up, refresh and the GPU's lookups below the shared
    tier included); without lower tiers :class:`HostTableLookup` counts them itself, each
    call's distinct keys the shared tier holds (``tier_host_hits``) or lacks
    (``tier_default_keys``).
    """

    lookups: int = 0
    keys: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    unknown_keys: int = 0
    inserted_keys: int = 0
    evictions: int = 0
    host_rows: int = 0
    seconds: float = 0.0
    tier_host_hits: int = 0
    tier_overlay_hits: int = 0
    tier_redis_cluster_hits: int = 0
    tier_rocks_db_hits: int = 0
    tier_model_files_hits: int = 0
    tier_default_keys: int = 0
    tier_overlay_errors: int = 0
    tier_redis_cluster_errors: int = 0
    tier_rocks_db_errors: int = 0
    tier_model_files_errors: int = 0
    tier_unanswered_keys: int = 0
    tier_elevated_keys: int = 0
    tier_refilled_keys: int = 0
    tier_dropped_elevations: int = 0
    tier_overlay_evictions: int = 0
    tier_overlay_lookups: int = 0
    tier_redis_cluster_lookups: int = 0
    tier_rocks_db_lookups: int = 0
    tier_model_files_lookups: int = 0
    tier_overlay_seconds: float = 0.0
    tier_redis_cluster_seconds: float = 0.0
    tier_rocks_db_seconds: float = 0.0
    tier_model_files_seconds: float = 0.0

    @property
    def hit_rate(self) -> float:
        """Cache hits over cache hits and misses, per key occurrence (0 before the first
        GPU lookup, and on the host)."""
        looked_up = self.cache_hits + self.cache_misses
        return self.cache_hits / looked_up if looked_up else 0.0

    def snapshot(self) -> TableCounters:
        """A copy, safe to read while lookups go on."""
        return TableCounters(**{f.name: getattr(self, f.name) for f in fields(self)})

    def with_tiers(self, host: SharedHostTable | TieredTable) -> TableCounters:
        """These counters with the ``tier_*`` ones read from ``host``'s cascade, if it has one.

        Args:
            host: the table's host tier.

        Returns:
            ``self``, updated.
        """
        if host.has_lower_tiers:
            tiers = host.tier_counters()
            for f in fields(tiers):
                if hasattr(self, f"tier_{f.name}"):
                    setattr(self, f"tier_{f.name}", getattr(tiers, f.name))
        return self

    def __add__(self, other: TableCounters) -> TableCounters:
        """Field-wise sum (counters of two lookup paths over one table)."""
        return TableCounters(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )


@dataclass
class InPlaceRows:
    """Where each key's row is, for a caller that gathers and pools rows itself.

    Args:
        values: the shared host tier's own float32 ``[rows, dim]`` array (read only).
        rows: per key, its row in ``values``; ``-1`` where the shared tier lacks the key.
        below: float32 ``[m, dim]`` vectors of the keys the shared tier lacks, as the tiers
            below answered them (the default vector where none holds the key).
        below_index: per key, its vector in ``below``; ``-1`` where ``rows`` has it.
    """

    values: np.ndarray
    rows: np.ndarray
    below: np.ndarray
    below_index: np.ndarray


class HostTableLookup:
    """Lookups straight from the host tier (the shared tier, or the cascade below it).

    Args:
        host: the table's host tier: its :class:`SharedHostTable`, or its
            :class:`~hps_core.tiers.cascade.TieredTable` when the model has lower tiers.
        xp: array module of the results (``numpy``, or ``cupy`` for a GPU without cache).
    """

    def __init__(self, host: SharedHostTable | TieredTable, xp: Any = np) -> None:
        self.host = host
        self.xp = xp
        self.counters = TableCounters()
        self._lock = threading.Lock()
        self._tiered = host.has_lower_tiers

    @property
    def dim(self) -> int:
        """Embedding width."""
        return self.host.dim

    def lookup(self, keys: Any, out: Any = None) -> Any:
        """Vectors of ``keys`` (default vector for unknown ones).

        Args:
            keys: 1-D int64 keys (NumPy or CuPy).
            out: optional float32 ``[n, dim]`` array of ``xp`` to write into.

        Returns:
            float32 ``[n, dim]`` array of ``xp``.
        """
        start = time.perf_counter()
        host_keys = to_host(keys).ravel()
        rows, index, counts = self._rows(host_keys, out if self.xp is np else None)
        if index is None:  # a row per key, in `out` when given
            result = rows
        elif self.xp is np:
            result = rows[index] if out is None else np.take(rows, index, 0, out=out)
        else:
            device_rows, device_index = self.xp.asarray(rows), self.xp.asarray(index)
            if out is None:
                result = device_rows[device_index]
            else:
                result = self.xp.take(device_rows, device_index, axis=0, out=out)
        self._count(len(host_keys), *counts, time.perf_counter() - start)
        return result

    def lookup_distinct(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The rows of ``keys`` without a copy of a repeated key's row (NumPy lookups): for
        pooling straight from them (:func:`~hps_core.nn.pool_gathered`), where :meth:`lookup`
        would first copy a row per key.

        Args:
            keys: 1-D int64 keys on the host.

        Returns:
            ``(rows, index)``: float32 rows and the position of each key's row among them, so
            that ``rows[index]`` is what :meth:`lookup` returns; ``index`` None when ``rows``
            holds a row per key already (a few keys, each looked up as it comes).

        Example:
            >>> rows, index = table.lookup_distinct(np.array([7, 3, 7]))  # doctest: +SKIP
            >>> len(rows), index.tolist()  # doctest: +SKIP
            (2, [1, 0, 1])
        """
        start = time.perf_counter()
        host_keys = np.asarray(keys).ravel()
        rows, index, counts = self._rows(host_keys)
        self._count(len(host_keys), *counts, time.perf_counter() - start)
        return rows, index

    def rows_in_place(self, keys: np.ndarray) -> InPlaceRows | None:
        """Where the rows of ``keys`` are, for a caller that gathers and pools them in one
        pass (PyTorch's ``embedding_bag``) rather than copying a row per key first: in the
        shared host tier's own array, or (keys it lacks) among the vectors the tiers below
        answered. Counted as a lookup.

        Args:
            keys: 1-D int64 keys on the host.

        Returns:
            The :class:`InPlaceRows`; None where rows cannot be read in place (compressed
            rows, a GPU lookup), and nothing is counted then.

        Raises:
            TierUnavailableError: a lower tier that may hold some keys did not answer.
        """
        if self.xp is not np:
            return None
        start = time.perf_counter()
        # Each distinct key is found once (hot keys repeat): hashing them out costs less
        # than probing every repeat, and counts them.
        unique, index = distinct_keys(keys)
        placed = self.host.rows_in_place(unique)
        if placed is None:
            return None
        values, unique_rows, below, found_below = placed
        missing = unique_rows < 0
        below_of = np.full(len(unique), -1, np.int64)
        below_of[missing] = np.arange(len(below))
        rows = unique_rows[index]
        found_below_count = int(np.count_nonzero(found_below))
        distinct_unknown = len(below) - found_below_count
        if distinct_unknown == 0:
            unknown = 0
        elif found_below_count == 0:  # every key the shared tier lacks is unknown
            unknown = int(np.count_nonzero(rows < 0))
        else:
            lacking = missing.copy()  # the distinct keys no tier holds
            lacking[missing] = ~found_below
            unknown = _occurrences(lacking, index)
        self._count(len(keys), unknown, len(unique), distinct_unknown, time.perf_counter() - start)
        return InPlaceRows(values, rows, below, below_of[index])

    def _rows(
        self, host_keys: np.ndarray, out: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray | None, tuple[int, int, int]]:
        """The host tier's rows of ``host_keys``: ``(rows, index, counts)``, ``rows`` and
        ``index`` as :meth:`lookup_distinct` returns them, ``counts`` what :meth:`_count`
        takes after the number of keys: ``(unknown, distinct, distinct_unknown)``.
        A few keys from the host tier alone are looked up as they come (into ``out`` when
        given), which costs less than finding the distinct ones first (a sort and a gather);
        the others once per distinct key (repeats, hot keys, are copied by the caller)."""
        if self.xp is np and not self._tiered and len(host_keys) <= SEARCH_KEYS:
            rows, found = self.host.lookup(host_keys, out)
            if found.all():
                return rows, None, (0, _distinct_count(host_keys), 0)
            lacking = host_keys[~found]
            counts = (len(lacking), _distinct_count(host_keys), _distinct_count(lacking))
            return rows, None, counts
        unique, index = distinct_keys(host_keys)  # the tiers take keys in any order
        rows, found = self.host.lookup(unique)
        distinct_unknown = int(len(found) - np.count_nonzero(found))
        unknown = _occurrences(~found, index) if distinct_unknown else 0
        return rows, index, (unknown, len(unique), distinct_unknown)

    def _count(
        self, keys: int, unknown: int, distinct: int, distinct_unknown: int, seconds: float
    ) -> None:
        """Count a lookup of ``keys`` key occurrences, ``unknown`` of them of keys no tier
        holds; ``distinct`` and ``distinct_unknown``, the call's distinct keys and those of
        them no tier holds, are what the host tier was asked (its ``tier_*`` counters, counted
        here without lower tiers)."""
        with self._lock:
            c = self.counters
            c.lookups += 1
            c.keys += keys
            c.unknown_keys += unknown
            if not self._tiered:  # else the cascade counts its tiers itself
                c.tier_host_hits += distinct - distinct_unknown
                c.tier_default_keys += distinct_unknown
            c.seconds += seconds

    def snapshot(self) -> TableCounters:
        """A copy of the counters (the cascade's tier counters included), safe to read while
        lookups go on."""
        return self.counters.snapshot().with_tiers(self.host)

    def close(self) -> None:
        """Nothing to release besides the host tier, which the model lookup owns."""


def together_positions(lookups: Sequence[Any], keys: Sequence[Any]) -> list[int]:
    """The positions of the lookups :func:`lookup_together` takes: each from a host tier
    without lower tiers into NumPy, of a few keys (at most ``SEARCH_KEYS``, which one lookup
    would also look up as they come rather than distinct keys first); none unless two or
    more qualify (one table alone costs less through :meth:`HostTableLookup.lookup`).

    Args:
        lookups: the tables' lookups.
        keys: their key arrays.

    Returns:
        Ascending positions in ``lookups``, or an empty list.
    """
    picked = [
        i
        for i, (t, k) in enumerate(zip(lookups, keys, strict=True))
        if isinstance(t, HostTableLookup) and t.xp is np and not t._tiered and k.size <= SEARCH_KEYS
    ]
    return picked if len(picked) > 1 else []


def lookup_together(lookups: Sequence[HostTableLookup], keys: Sequence[Any]) -> list[np.ndarray]:
    """The vectors of a few keys of each of several tables (see :func:`together_positions`),
    as :meth:`HostTableLookup.lookup` returns them, with the work that does not depend on the
    table done once: the keys of every table hashed in one pass, their distinct keys counted in
    one. A model's tables looked up one by one each pay that work's fixed overhead: the demo
    DLRM's 26 tables of 64 keys took 0.94 ms on the 2-core CPU machine, 0.60 ms together (one
    table alone 37 us, 48 us through this function).

    Args:
        lookups: the tables' lookups.
        keys: one int64 key array per lookup (host arrays, any shape).

    Returns:
        One float32 ``[n_t, dim_t]`` array per table, a row per key (the default vector for
        unknown keys). Each table's counters count its lookup; the elapsed time is shared
        among the tables by their numbers of keys.

    Raises:
        TypeError: keys that are not int64.

    Example:
        >>> rows = lookup_together([a, b], [np.array([7, 3]), np.array([5])])  # doctest: +SKIP
    """
    start = time.perf_counter()
    flat = [np.asarray(k).reshape(-1) for k in keys]
    for k in flat:
        if k.dtype != np.int64:
            raise TypeError(f"keys must be int64, got {k.dtype}")
    sizes = [len(k) for k in flat]
    spans = list(itertools.pairwise(itertools.accumulate(sizes, initial=0)))
    hashes = mix64(np.concatenate(flat) if flat else np.empty(0, np.int64))
    rows, found = [], []
    for lookup, (a, b) in zip(lookups, spans, strict=True):
        values, known = lookup.host.lookup_hashed(hashes[a:b])
        rows.append(values)
        found.append(known)
    distinct, distinct_unknown = _distinct_per_table(hashes, sizes, found)
    seconds = time.perf_counter() - start
    total = max(len(hashes), 1)
    for t, lookup in enumerate(lookups):
        n = sizes[t]
        unknown = n - int(np.count_nonzero(found[t]))
        lookup._count(n, unknown, distinct[t], distinct_unknown[t], seconds * n / total)
    return rows


def _distinct_per_table(
    hashes: np.ndarray, sizes: list[int], found: list[np.ndarray]
) -> tuple[list[int], list[int]]:
    """Per table, its distinct keys and distinct unknown keys, the tables' hashes given back
    to back (``sizes[t]`` of table ``t``): counted for every table in a fixed number of NumPy
    calls (mix64 is a bijection, so distinct hashes are distinct keys)."""
    table_of = np.repeat(np.arange(len(sizes)), sizes)
    order = np.lexsort((hashes, table_of))  # each table's hashes sorted, tables kept in place
    ordered = hashes[order]
    bounds = np.cumsum([0, *sizes])
    first = np.ones(len(ordered), dtype=bool)  # the first of each run of one key
    first[1:] = ordered[1:] != ordered[:-1]
    first[bounds[:-1][np.asarray(sizes) > 0]] = True  # a table's first key is new
    unknown_first = first & ~np.concatenate(found)[order] if found else first
    # Each table's count: the running count at its end less that at its start.
    runs = np.zeros((2, len(first) + 1), np.int64)
    np.cumsum(first, out=runs[0, 1:])
    np.cumsum(unknown_first, out=runs[1, 1:])
    distinct, unknown = runs[:, bounds[1:]] - runs[:, bounds[:-1]]
    return distinct.tolist(), unknown.tolist()


def _occurrences(mask: np.ndarray, index: np.ndarray) -> int:
    """Number of keys whose distinct key is set in ``mask``: ``mask`` over the distinct keys,
    ``index`` each key's position among them (as :func:`~hps_core.arrays.distinct_keys`
    gives it). One O(n) gather of a byte a key: about 1.5 ns a key, a few percent of finding
    the distinct keys (``np.take`` takes pyarrow's int32 index without the copy to intp
    that indexing makes; for NumPy's intp index indexing costs less)."""
    picked = mask[index] if index.dtype == np.intp else np.take(mask, index)
    return int(np.count_nonzero(picked))


def _distinct_count(keys: np.ndarray) -> int:
    """Number of distinct values of a 1-D array."""
    if keys.size == 0:
        return 0
    ordered = np.sort(keys)
    return int(np.count_nonzero(ordered[1:] != ordered[:-1])) + 1


class CachedTableLookup:
    """A table's GPU embedding cache in front of its host tier: what the cache bank
    (:class:`~hps_core.infer.gpu.bank.CacheBank`) looks the table up through, what online
    updates overwrite (:meth:`~hps_core.lookup.model_lookup.ModelLookup.update_cached_rows`)
    and what the refresher re-reads (:meth:`refresh`). It answers no lookups itself.

    Args:
        host: the table's host tier (:class:`SharedHostTable`, or the
            :class:`~hps_core.tiers.cascade.TieredTable` of a model with lower tiers: the
            bank reads its shared tier in place and asks ``lookup_lower`` for the rest).
        cache: a dynamic cache (``query``/``replace``/``update``/``dump``) or a
            :class:`StaticTable`.
        xp: the cache's array module.
        name: label for logs, e.g. ``"dlrm.table3@gpu0"``.
    """

    def __init__(
        self, host: SharedHostTable | TieredTable, cache: Any, xp: Any, *, name: str = "table"
    ) -> None:
        self.host = host
        self.cache = cache
        self.xp = xp
        self.name = name
        self._static = isinstance(cache, StaticTable)

    @property
    def dim(self) -> int:
        """Embedding width."""
        return self.host.dim

    def snapshot(self) -> TableCounters:
        """What the table itself counts, safe to read while serving: the cache's evictions
        (warm-up and refresh included) and, with lower tiers, the cascade's tier counters;
        the lookups are counted by the engine that answers them (its ``table_counters``)."""
        counters = TableCounters().with_tiers(self.host)
        counters.evictions = self.cache.stats().evictions
        return counters

    def _host_rows(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The host tier's rows of ``keys``: decoded float32 (the default vector for unknown
        keys), the same rows as stored (what the cache takes: never re-encoded from the
        decoded values, which for int8 and fp8 need not give the same bytes), and the mask
        of known keys."""
        fmt = self.cache.row_format
        if fmt.is_identity:
            values, found = self.host.lookup(keys)
            return values, values, found
        stored, found = self.host.lookup_stored(keys)
        values = fmt.decode_stored(stored)
        if not found.all():
            values[~found] = self.host.default_value
        return values, stored, found

    def warm(self, keys: np.ndarray, chunk: int = 1 << 20) -> int:
        """Insert ``keys`` (hottest first) with their host vectors into the cache.

        Args:
            keys: int64 host keys, hottest first; at most the cache's capacity is used.
            chunk: keys per insert.

        Returns:
            Number of keys inserted.
        """
        if self._static:
            return 0
        keys = np.asarray(keys, dtype=np.int64)[: self.cache.capacity]
        inserted = 0
        # Coldest first (chunks and keys inside a chunk alike), so that the hottest keys carry
        # the newest LRU stamps and a set that overflows evicts its coldest keys.
        for stop in range(len(keys), 0, -chunk):
            part = keys[max(0, stop - chunk) : stop][::-1]
            _, values, found = self._host_rows(part)
            if found.any():
                self.cache.replace(self.xp.asarray(part[found]), self.xp.asarray(values[found]))
                inserted += int(np.count_nonzero(found))
        return inserted

    def refresh(self, set_start: int, set_end: int) -> int:
        """Re-read the cached rows of sets ``[set_start, set_end)`` from the host tier.

        Args:
            set_start: first set.
            set_end: one past the last set.

        Returns:
            Number of rows refreshed.
        """
        if self._static:
            return 0
        keys = self.cache.dump(set_start, set_end)
        if int(keys.shape[0]) == 0:
            return 0
        _, values, found = self._host_rows(to_host(keys))
        mask = self.xp.asarray(found)
        self.cache.update(keys[mask], self.xp.asarray(values)[mask])
        return int(np.count_nonzero(found))

    def close(self) -> None:
        """Nothing to release besides the host tier, which the model lookup owns."""
