"""Keys -> vectors for one table, on the host or through a GPU embedding cache.

:class:`HostTableLookup` reads the shared host tier directly (CPU instances, and GPU instances
with ``gpucache: false``). :class:`CachedTableLookup` puts an embedding cache in front of it:

1. deduplicate the batch's keys (on the cache's device);
2. query the cache;
3. fetch the misses from the host tier (its default vector for keys it does not hold);
4. insert the misses into the cache: synchronously when the batch's hit rate is below
   ``hit_rate_threshold``, else handed to a background thread so the answer does not wait;
5. scatter the unique rows back to request order.

HugeCTR answers the misses of an asynchronous batch with default vectors. Here a miss is
answered with its true vector whenever the host tier holds it (the insert is what is
asynchronous, not the answer), unless ``miss_policy="default"`` asks for HugeCTR's
behaviour; then every default answer for a key the table holds is counted, never silent.

The same code runs with CuPy (the GPU kernels) and, in the tests, with NumPy (the cache's
twin, ``tests/unit/cache/cache_twin.py``), which is what CI runs.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from hps_core.arrays import distinct_keys, module_of, to_host
from hps_core.cache import StaticTable
from hps_core.hashing import mix64
from hps_core.tiers.cascade import TieredTable
from hps_core.tiers.hash_layout import SEARCH_KEYS
from hps_core.tiers.host_table import SharedHostTable

logger = logging.getLogger("hps_core")

MISS_POLICIES = ("fetch", "default")


@dataclass
class TableCounters:
    """What one table's lookups did since the model lookup opened (keys count unique per batch).

    Args:
        lookups: lookup calls.
        keys: keys asked for, duplicates included.
        unique_keys: distinct keys per call, summed.
        cache_hits: unique keys answered by the cache.
        cache_misses: unique keys the cache did not hold.
        unknown_keys: unique keys the table does not hold (answered with its default vector).
        default_answers: keys the table holds that were answered with the default vector
            (``miss_policy="default"`` only).
        sync_inserts: batches whose misses were inserted before answering.
        async_inserts: batches whose misses were inserted in the background.
        inserted_keys: keys handed to the cache for insertion.
        failed_inserts: background insertions that raised (logged).
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

    The ``tier_*`` counters of a table with lower tiers come from its cascade
    (:class:`~hps_core.tiers.cascade.TierCounters`, every host-side lookup of the table,
    warm-up and refresh included); without lower tiers they count the host tier's answers to
    requests.
    """

    lookups: int = 0
    keys: int = 0
    unique_keys: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    unknown_keys: int = 0
    default_answers: int = 0
    sync_inserts: int = 0
    async_inserts: int = 0
    inserted_keys: int = 0
    failed_inserts: int = 0
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
        """Cache hits over unique keys (0 before the first lookup)."""
        return self.cache_hits / self.unique_keys if self.unique_keys else 0.0

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
        rows, index, distinct, unknown = self._rows(host_keys, out if self.xp is np else None)
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
        self._count(len(host_keys), distinct, unknown, time.perf_counter() - start)
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
        rows, index, distinct, unknown = self._rows(host_keys)
        self._count(len(host_keys), distinct, unknown, time.perf_counter() - start)
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
        unknown = len(below) - int(np.count_nonzero(found_below))
        self._count(len(keys), len(unique), unknown, time.perf_counter() - start)
        return InPlaceRows(values, unique_rows[index], below, below_of[index])

    def _rows(
        self, host_keys: np.ndarray, out: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray | None, int, int]:
        """The host tier's rows of ``host_keys``: ``(rows, index, distinct, unknown)`` as
        :meth:`lookup_distinct` returns them, with the counts of distinct and unknown keys.
        A few keys from the host tier alone are looked up as they come (into ``out`` when
        given), which costs less than finding the distinct ones first (a sort and a gather);
        the others once per distinct key (repeats, hot keys, are copied by the caller)."""
        if self.xp is np and not self._tiered and len(host_keys) <= SEARCH_KEYS:
            rows, found = self.host.lookup(host_keys, out)
            unknown = 0 if found.all() else _distinct_count(host_keys[~found])
            return rows, None, _distinct_count(host_keys), unknown
        unique, index = distinct_keys(host_keys)  # the tiers take keys in any order
        rows, found = self.host.lookup(unique)
        return rows, index, len(unique), int(len(found) - np.count_nonzero(found))

    def _count(self, keys: int, distinct: int, unknown: int, seconds: float) -> None:
        with self._lock:
            c = self.counters
            c.lookups += 1
            c.keys += keys
            c.unique_keys += distinct
            c.unknown_keys += unknown
            if not self._tiered:  # else the cascade counts its tiers itself
                c.tier_host_hits += distinct - unknown
                c.tier_default_keys += unknown
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
    distinct, unknown = _distinct_per_table(hashes, sizes, found)
    seconds = time.perf_counter() - start
    total = max(len(hashes), 1)
    for lookup, n, d, u in zip(lookups, sizes, distinct, unknown, strict=True):
        lookup._count(n, d, u, seconds * n / total)
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


def _distinct_count(keys: np.ndarray) -> int:
    """Number of distinct values of a 1-D array."""
    if keys.size == 0:
        return 0
    ordered = np.sort(keys)
    return int(np.count_nonzero(ordered[1:] != ordered[:-1])) + 1


@dataclass
class PendingLookup:
    """A cached lookup between :meth:`CachedTableLookup.begin` and ``finish``.

    Args:
        start: host clock when it began.
        n: number of keys asked for.
        unique: the distinct keys, on the cache's device.
        unique_h: the same on the host when the keys came from the host, else ``None``.
        inverse: position of each key in ``unique`` (cache's device).
        rows: ``[len(unique), dim]`` rows being filled.
        hit: the query's hit mask (``None`` for an empty lookup).
        out: the caller's output array, or ``None``.
    """

    start: float
    n: int
    unique: Any
    unique_h: np.ndarray | None
    inverse: Any
    rows: Any
    hit: Any
    out: Any


@dataclass
class ResolvedLookup:
    """A cached lookup after :meth:`CachedTableLookup.resolve`: every row is answered.

    Args:
        pending: the lookup as :meth:`CachedTableLookup.begin` started it.
        misses: unique keys the cache did not hold.
        unknown: unique keys the table does not hold.
        inserted: keys handed to the cache for insertion.
        mode: ``"sync"``, ``"async"`` or ``None`` (nothing inserted).
        insert: ``(keys, values)`` to insert before answering (synchronous mode).
        miss_h: host positions (in ``unique``) of the misses.
        fill: what the miss rows get: host float32 ``[misses, dim]`` vectors, or a scalar
            (the default value); written by :func:`fill_misses`.
    """

    pending: PendingLookup
    miss_h: np.ndarray | None = None
    fill: np.ndarray | float | None = None
    misses: int = 0
    unknown: int = 0
    inserted: int = 0
    mode: str | None = None
    insert: tuple[np.ndarray, np.ndarray] | None = None


def prepare_many(
    tables: Sequence[CachedTableLookup], keys: Sequence[Any], xp: Any
) -> list[PendingLookup]:
    """:meth:`CachedTableLookup.prepare` for several tables, with one host-to-device copy.

    Each table's host keys are deduplicated on the host; the distinct keys and inverse
    indices of every table then travel to the device together (one transfer instead of two
    per table: on a model with tens of tables, per-table copies cost more than the queries).

    Args:
        tables: the tables.
        keys: one 1-D int64 key array per table (NumPy; CuPy keys are prepared per table).
        xp: the tables' array module.

    Returns:
        One prepared lookup per table.
    """
    start = time.perf_counter()
    dedup: list[tuple[np.ndarray, np.ndarray] | None] = []
    for k in keys:
        if module_of(k) is np:
            dedup.append(np.unique(np.asarray(k, dtype=np.int64).ravel(), return_inverse=True))
        else:
            dedup.append(None)
    parts = [part for d in dedup if d is not None for part in d]
    device = xp.asarray(np.concatenate(parts)) if parts else None
    pending, offset = [], 0
    for table, k, d in zip(tables, keys, dedup, strict=True):
        if d is None:
            pending.append(table.prepare(k))
            continue
        unique_h, inverse_h = d
        u, n = len(unique_h), len(inverse_h)
        unique, inverse = device[offset : offset + u], device[offset + u : offset + u + n]
        offset += u + n
        pending.append(table.prepared(start, unique, unique_h, inverse))
    return pending


def fill_misses(resolved: Sequence[ResolvedLookup], xp: Any) -> None:
    """Write the miss rows of resolved lookups: one transfer of positions, one of vectors.

    Args:
        resolved: lookups after :meth:`CachedTableLookup.resolve`.
        xp: their array module.
    """
    todo = [r for r in resolved if r.misses]
    if not todo:
        return
    positions = xp.asarray(np.concatenate([r.miss_h for r in todo]))
    vectors = [r.fill.ravel() for r in todo if isinstance(r.fill, np.ndarray)]
    flat = xp.asarray(np.concatenate(vectors)) if vectors else None
    at = vat = 0
    for r in todo:
        miss = positions[at : at + r.misses]
        at += r.misses
        if isinstance(r.fill, np.ndarray):
            size = r.fill.size
            r.pending.rows[miss] = flat[vat : vat + size].reshape(r.fill.shape)
            vat += size
        else:
            r.pending.rows[miss] = r.fill


def lookup_cached_tables(
    tables: Sequence[CachedTableLookup],
    keys: Sequence[Any],
    xp: Any,
    section: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> list[Any]:
    """Look up several cached tables with one transfer per step instead of one per table.

    Keys go to the device together (:func:`prepare_many`); every query is launched inside
    one ``section`` (a shared cache group's lock; only launches happen in it); the hit masks
    come back in one copy, which is the one wait for the GPU; misses are fetched per table
    and written back together (:func:`fill_misses`); then each table inserts and answers.

    Args:
        tables: the tables.
        keys: one 1-D int64 key array per table.
        xp: their array module.
        section: context in which the queries are launched.

    Returns:
        One float32 ``[n_i, dim_i]`` array per table, as :meth:`CachedTableLookup.lookup`.
    """
    pending = prepare_many(tables, keys, xp)
    with section():
        for table, p in zip(tables, pending, strict=True):
            table.launch(p)
    hits = [p.hit for p in pending if p.n]
    hits_h = to_host(xp.concatenate(hits)) if hits else np.zeros(0, bool)
    resolved, at = [], 0
    for table, p in zip(tables, pending, strict=True):
        u = int(p.unique.shape[0]) if p.n else 0
        resolved.append(table.resolve(p, hits_h[at : at + u] if p.n else None))
        at += u
    fill_misses(resolved, xp)
    return [table.complete(r) for table, r in zip(tables, resolved, strict=True)]


_thread_state = threading.local()


def _use_own_stream(device_id: int) -> None:
    """Make a new non-blocking CUDA stream on ``device_id`` current in this thread."""
    import cupy

    cupy.cuda.Device(device_id).use()
    _thread_state.stream = cupy.cuda.Stream(non_blocking=True)
    _thread_state.stream.use()


class CachedTableLookup:
    """Lookups through an embedding cache backed by the host tier.

    Args:
        host: the table's host tier (:class:`SharedHostTable`, or the
            :class:`~hps_core.tiers.cascade.TieredTable` of a model with lower tiers: the
            GPU pipeline reads its shared tier and asks ``lookup_lower`` for the rest).
        cache: a dynamic cache (``query``/``replace``) or a :class:`StaticTable`.
        xp: the cache's array module.
        hit_rate_threshold: below it a batch's misses are inserted before answering.
        miss_policy: ``"fetch"`` (true vectors for misses) or ``"default"`` (HugeCTR:
            default vectors for the misses of asynchronous batches, counted).
        name: label for logs, e.g. ``"dlrm.table3@gpu0"``.
    """

    def __init__(
        self,
        host: SharedHostTable | TieredTable,
        cache: Any,
        xp: Any,
        hit_rate_threshold: float,
        miss_policy: str = "fetch",
        name: str = "table",
    ) -> None:
        if miss_policy not in MISS_POLICIES:
            raise ValueError(f"miss_policy must be one of {MISS_POLICIES}, got {miss_policy!r}")
        self.host = host
        self.cache = cache
        self.xp = xp
        self.hit_rate_threshold = hit_rate_threshold
        self.miss_policy = miss_policy
        self.name = name
        self.counters = TableCounters()
        self._lock = threading.Lock()
        self._static = isinstance(cache, StaticTable)
        self._tiered = host.has_lower_tiers
        # One worker keeps background inserts in order; created on first use.
        self._worker: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: list[concurrent.futures.Future[None]] = []

    @property
    def dim(self) -> int:
        """Embedding width."""
        return self.host.dim

    def lookup(self, keys: Any, out: Any = None) -> Any:
        """Vectors of ``keys`` through the cache (:meth:`begin` then :meth:`finish`).

        Keys on the host (what Triton hands over unless a client uses CUDA shared memory) are
        deduplicated on the host, so the GPU sees one copy of the unique keys; keys already on
        the GPU are deduplicated there. Either way the hit mask comes back to the host once:
        the misses are fetched from the host tier there.

        Args:
            keys: 1-D int64 keys (NumPy or CuPy).
            out: optional float32 ``[n, dim]`` array of ``xp`` to write into.

        Returns:
            float32 ``[n, dim]`` array of ``xp``.
        """
        return self.finish(self.begin(keys, out))

    def begin(self, keys: Any, out: Any = None) -> PendingLookup:
        """Deduplicate and launch the cache query without waiting for it.

        Starting every table's query before finishing any lets a model with many tables wait
        for the GPU once instead of once per table.

        Args:
            keys: 1-D int64 keys (NumPy or CuPy).
            out: optional float32 ``[n, dim]`` array of ``xp`` to write into.

        Returns:
            The lookup in flight, for :meth:`finish`.
        """
        return self.launch(self.prepare(keys, out))

    def prepare(self, keys: Any, out: Any = None) -> PendingLookup:
        """Deduplicate the keys and put them on the cache's device; no cache access yet.

        Args:
            keys: 1-D int64 keys (NumPy or CuPy).
            out: optional float32 ``[n, dim]`` array of ``xp`` to write into.

        Returns:
            The lookup, for :meth:`launch`.
        """
        xp = self.xp
        start = time.perf_counter()
        if module_of(keys) is np:
            host_keys = np.asarray(keys, dtype=np.int64).ravel()
            unique_h, inverse_h = np.unique(host_keys, return_inverse=True)
            unique, inverse = xp.asarray(unique_h), xp.asarray(inverse_h)
        else:
            keys = xp.asarray(keys, dtype=xp.int64).ravel()
            unique, inverse = xp.unique(keys, return_inverse=True)
            unique_h = None
        return self.prepared(start, unique, unique_h, inverse, out)

    def prepared(
        self, start: float, unique: Any, unique_h: np.ndarray | None, inverse: Any, out: Any = None
    ) -> PendingLookup:
        """A lookup whose keys were deduplicated (and moved to the device) by the caller.

        Args:
            start: host clock when the lookup began.
            unique: the distinct keys on the cache's device.
            unique_h: the same on the host, or ``None``.
            inverse: position of each requested key in ``unique``, on the device.
            out: optional float32 ``[n, dim]`` array of ``xp`` to write into.

        Returns:
            The lookup, for :meth:`launch`.
        """
        rows = self.xp.empty((int(unique.shape[0]), self.dim), self.xp.float32)
        return PendingLookup(
            start, int(inverse.shape[0]), unique, unique_h, inverse, rows, None, out
        )

    def launch(self, pending: PendingLookup) -> PendingLookup:
        """Launch the cache query of a prepared lookup (the only step that touches the cache).

        Args:
            pending: what :meth:`prepare` returned.

        Returns:
            ``pending``, with its hit mask on the way.
        """
        if pending.n:
            pending.hit = self.cache.query(pending.unique, out=pending.rows)[1]
        return pending

    def finish(self, pending: PendingLookup) -> Any:
        """Fetch the misses, insert them, and scatter the rows back to request order.

        Args:
            pending: what :meth:`begin` returned.

        Returns:
            float32 ``[n, dim]`` array of ``xp``.
        """
        resolved = self.resolve(pending)
        fill_misses([resolved], self.xp)
        return self.complete(resolved)

    def resolve(self, pending: PendingLookup, hit_h: np.ndarray | None = None) -> ResolvedLookup:
        """Find the misses, fetch them from the host tier, start background inserts.

        Nothing is written on the device here: :func:`fill_misses` writes the miss rows (of
        many tables in one transfer), then :meth:`complete` answers.

        Args:
            pending: what :meth:`launch` returned.
            hit_h: the query's hit mask already copied to the host (else it is copied here,
                which waits for the query).

        Returns:
            The lookup with its misses answered on the host.
        """
        p = pending
        resolved = ResolvedLookup(p)
        if p.n == 0:
            return resolved
        miss_h = np.flatnonzero(~(to_host(p.hit) if hit_h is None else hit_h))
        misses = resolved.misses = len(miss_h)
        if not misses:
            return resolved
        resolved.miss_h = miss_h
        if p.unique_h is not None:
            miss_keys = p.unique_h[miss_h]
        else:
            miss_keys = to_host(p.unique[self.xp.asarray(miss_h)])
        background = 1.0 - misses / int(p.unique.shape[0]) >= self.hit_rate_threshold
        if self._static and self._tiered:
            # A static cache holds the whole file: a miss is a key the file lacks, which
            # online updates may have added (the overlay below the shared tier).
            values, found = self.host.lookup_lower(miss_keys)
            resolved.fill = values
            resolved.unknown = misses - int(np.count_nonzero(found))
        elif self._static:
            # A static cache holds the whole table: a miss is a key the table lacks.
            resolved.fill = self.host.default_value
            resolved.unknown = misses
        elif background and self.miss_policy == "default":
            resolved.fill = self.host.default_value
            self._submit(self._fetch_and_insert, miss_keys)
            resolved.mode = "async"
        else:
            values, stored, found = self._host_rows(miss_keys)
            resolved.fill = values
            inserted = resolved.inserted = int(np.count_nonzero(found))
            resolved.unknown = misses - inserted
            if inserted:
                # Host keys: the cache plans the insert on the host, no GPU sort.
                known_keys, known_values = miss_keys[found], stored[found]
                if background:
                    self._submit(self.cache.replace, known_keys, known_values)
                    resolved.mode = "async"
                else:
                    resolved.insert = (known_keys, known_values)
                    resolved.mode = "sync"
        return resolved

    def complete(self, resolved: ResolvedLookup) -> Any:
        """Apply the synchronous insert, scatter the rows to request order and count.

        Args:
            resolved: what :meth:`resolve` returned.

        Returns:
            float32 ``[n, dim]`` array of ``xp``.
        """
        xp = self.xp
        r, p = resolved, resolved.pending
        if p.n == 0:
            return xp.empty((0, self.dim), xp.float32) if p.out is None else p.out
        if r.insert is not None:
            self.cache.replace(*r.insert)
        rows, inverse, out = p.rows, p.inverse, p.out
        result = rows[inverse] if out is None else xp.take(rows, inverse, axis=0, out=out)
        u = int(p.unique.shape[0])
        with self._lock:
            c = self.counters
            c.lookups += 1
            c.keys += p.n
            c.unique_keys += u
            c.cache_hits += u - r.misses
            c.cache_misses += r.misses
            c.unknown_keys += r.unknown
            if not self._tiered:  # else the cascade counts its tiers itself
                c.tier_host_hits += r.inserted
                c.tier_default_keys += r.unknown
            if r.mode == "sync":
                c.sync_inserts += 1
            elif r.mode == "async":
                c.async_inserts += 1
            c.inserted_keys += r.inserted
            c.seconds += time.perf_counter() - p.start
        return result

    def snapshot(self) -> TableCounters:
        """A copy of the counters, with the cache's evictions, safe to read while serving."""
        counters = self.counters.snapshot().with_tiers(self.host)
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

    def _fetch_and_insert(self, miss_keys: Any) -> None:
        _, values, found = self._host_rows(to_host(miss_keys))
        known = int(np.count_nonzero(found))
        with self._lock:
            # These keys were answered with the default vector although the table holds them.
            self.counters.default_answers += known
            self.counters.unknown_keys += len(found) - known
            self.counters.inserted_keys += known
            if not self._tiered:
                self.counters.tier_host_hits += known
                self.counters.tier_default_keys += len(found) - known
        if known:
            self.cache.replace(miss_keys[found], values[found])

    def _submit(self, fn: Any, *args: Any) -> None:
        if self._worker is None:
            initializer = None
            if not self._static and self.cache.shared:
                # A shared cache orders the work of every process through events recorded
                # on the stream that launched it. On the default stream, an insert's event
                # would also cover the forward pass this process queued meanwhile, and other
                # instances would wait for it: inserts get a stream of their own.
                initializer = functools.partial(_use_own_stream, self.cache.device_id)
            self._worker = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix=f"hps-insert-{self.name}", initializer=initializer
            )
        future = self._worker.submit(fn, *args)
        future.add_done_callback(self._report)
        self._pending = [f for f in self._pending if not f.done()] + [future]

    def _report(self, future: concurrent.futures.Future[None]) -> None:
        exc = future.exception()
        if exc is not None:
            with self._lock:
                self.counters.failed_inserts += 1
            logger.error("%s: background cache insert failed: %s", self.name, exc)

    def flush(self) -> None:
        """Wait until every background insert has been applied."""
        for future in list(self._pending):
            future.exception()  # waits; errors were logged by _report
        self._pending = []

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
        """Finish background inserts and stop the worker."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
        self._pending = []
