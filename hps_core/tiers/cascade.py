"""One table's lookup cascade: shared host tier -> Redis cluster -> RocksDB -> default vector.

HugeCTR's parameter server (``HugeCTR/src/hps/hier_parameter_server.cpp``, ``lookup``) asks
its volatile database first, sends only the keys it missed to the persistent database, and
fills what neither holds with the table's default value. :class:`TieredTable` does the same
for one table, with the shared-memory host tier (:mod:`hps_core.tiers.host_table`, read-only,
built from the sparse files) on top and any :class:`~hps_core.tiers.backing.BackingStore`
below it, in order:

1. the shared host tier answers what it holds (all of it, or the first ``initial_cache_rate``
   of the file's rows; empty when the volatile level is a Redis cluster);
2. the keys it missed are deduplicated and go to the first lower tier, those still missing
   to the next (each store reads in batches of its ``max_batch_size``);
3. the keys no tier holds get the default vector and ``found=False``.

With ``cache_missed_embeddings`` the rows found in RocksDB are written to the Redis tier above
it, in the background as HugeCTR's asynchronous inserter does (only rows found are written;
HugeCTR also writes the default vectors of keys nobody holds). The shared host tier stays as
built from the files.

With online updates (ps.json ``update_source``), the first tier below the shared one is this
process's :class:`~hps_core.tiers.overlay.OverlayStore`: the rows updates brought for keys the
shared tier lacks (:mod:`hps_core.updates.apply` writes it, and the shared tier's rows in
place). Such a table is a cascade even when nothing else lies below the shared tier.

A lower tier that fails (a node down, a timeout, any exception) is counted in its errors and
its keys fall through to the next tier. A key is answered with the default vector only when a
tier that holds every row the failed one could hold answered that it lacks it (a *complete*
tier: RocksDB, or the model's sparse files, for a table without online updates). Otherwise
nothing can say whether the key exists: the lookup raises
:class:`~hps_core.errors.TierUnavailableError` naming the tier that did not answer, and the
request fails instead of being answered wrong.

A Redis cluster without RocksDB below it has the model's own sparse files below it
(:class:`~hps_core.tiers.file_rows.ModelFileRows`): they answer the keys of a lost node, and
the keys of a node that came back empty. Rows the files answer for keys the cluster reported
absent (not lost with a node) are written back to the cluster, and a refill of what the
cluster lost runs in the background (``refill``, at most once per :data:`REFILL_PERIOD_S`),
so the cluster holds the table again without a reload.

Interface for the GPU pipeline (``CachedTableLookup.host`` is a :class:`TieredTable` when the
model has lower tiers, else the :class:`~hps_core.tiers.host_table.SharedHostTable` itself):

- ``table.has_lower_tiers``: ``True`` for a cascade (``SharedHostTable`` has it ``False``).
- ``table.shared``: the shared host tier; the cascade also passes through what kernels read of
  it: ``index_arrays()``, ``layout``, ``buffer_address()``, ``contents()``, ``find()``,
  ``rows`` (rows *held* in shared memory), ``sparse_dir``, ``default_value``, ``dim``.
- ``table.table_rows``: rows of the whole table (the sparse files); size caches from this.
- ``table.lookup_lower(keys) -> (values, found)``: int64 host keys the shared tier lacks (any
  order, repeats allowed), float32 ``[n, dim]`` vectors (default where no lower tier holds
  the key) and a bool mask; counted in the cascade's counters like host-side lookups.
  ``lookup_lower_stored`` gives the same rows stored in the table's precision: Redis and
  RocksDB hold FP32 rows (HugeCTR's layout), encoded here once, as the shared tier encoded
  its rows from the files; the update overlay stores its rows encoded already and hands them
  over as they are. A table stored compressed answers every lower tier's rows quantised in
  ``lookup`` and ``lookup_lower`` too (decoded from those stored rows), so that its answer for
  a key never depends on the tier that held it, nor on whether a GPU cache held it.
- ``table.tier_counters()``: a snapshot of the per-tier counters (:class:`TierCounters`).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from hps_core.errors import TierUnavailableError
from hps_core.log_every import LogEvery
from hps_core.tiers.backing import BackingStore
from hps_core.tiers.hash_layout import HashLayout
from hps_core.tiers.host_table import SharedHostTable

logger = logging.getLogger("hps_core")
_EVERY = LogEvery()

# Background writes of rows elevated to Redis waiting at most; more are dropped (counted):
# the answer never waits for them, and a slow Redis must not grow an unbounded queue.
MAX_PENDING_ELEVATIONS = 8
# At most one log line per tier and table in this many seconds while a tier keeps failing.
_ERROR_LOG_PERIOD_S = 10.0
REFILL_PERIOD_S = 30.0
"""A table's refill of a Redis cluster that lost rows runs at most once in this many seconds
per process (it compares every partition's size with the files' first, which costs a pass over
the keys)."""


def store_reports_unanswered(store: BackingStore) -> bool:
    """Whether ``store.lookup`` takes an ``unanswered`` mask to fill with the keys it could
    not answer (a Redis cluster: the keys of a node down), rather than all or nothing."""
    return bool(getattr(store, "reports_unanswered", False))


def _failure_reason(store: BackingStore) -> str:
    """Why a store failed, where it keeps that (a Redis cluster: ``node A down``), else ``""``."""
    reason = getattr(store, "failure_reason", None)
    return reason() if reason is not None else ""


@dataclass
class TierCounters:
    """What a cascade's tiers answered since it opened; keys are counted as asked.

    ``host_hits + overlay_hits + redis_cluster_hits + rocks_db_hits + default_keys`` is the
    number of keys looked up (:meth:`TieredTable.lookup_lower` keys count from the overlay
    down).

    Args:
        host_hits: keys answered by the shared host tier.
        overlay_hits: keys answered by the rows online updates added (new keys).
        redis_cluster_hits: keys answered by the Redis cluster.
        rocks_db_hits: keys answered by RocksDB.
        model_files_hits: keys answered by the model's sparse files (below a Redis cluster
            without RocksDB: keys of a lost node, or of one that came back empty).
        default_keys: keys no tier holds (answered with the default vector).
        overlay_errors: overlay lookups that failed (never expected; counted like the others).
        redis_cluster_errors: Redis requests that failed (keys fell through).
        rocks_db_errors: RocksDB requests that failed (keys fell through).
        model_files_errors: lookups in the model files that failed (they changed or vanished).
        unanswered_keys: keys whose lookup failed because a tier that may hold them did not
            answer and none below could say (their requests failed).
        elevated_keys: rows found below the Redis cluster written to it: from RocksDB with
            ``cache_missed_embeddings``, from the model files where the cluster lost them.
        refilled_keys: rows a refill wrote back to a Redis cluster that lost them.
        dropped_elevations: batches of such rows not written because too many were pending.
        overlay_evictions: rows the update overlay evicted to stay within
            ``volatile_db.overflow_margin`` (read from the overlay when a snapshot is taken).
        lower_seconds: time spent in lower tiers.
        overlay_lookups, redis_cluster_lookups, rocks_db_lookups, model_files_lookups:
            lookups that reached the tier (one per batch of keys asked of it).
        overlay_seconds, redis_cluster_seconds, rocks_db_seconds, model_files_seconds:
            time those lookups took, failed ones included.
    """

    host_hits: int = 0
    overlay_hits: int = 0
    redis_cluster_hits: int = 0
    rocks_db_hits: int = 0
    model_files_hits: int = 0
    default_keys: int = 0
    overlay_errors: int = 0
    redis_cluster_errors: int = 0
    rocks_db_errors: int = 0
    model_files_errors: int = 0
    unanswered_keys: int = 0
    elevated_keys: int = 0
    refilled_keys: int = 0
    dropped_elevations: int = 0
    overlay_evictions: int = 0
    lower_seconds: float = 0.0
    overlay_lookups: int = 0
    redis_cluster_lookups: int = 0
    rocks_db_lookups: int = 0
    model_files_lookups: int = 0
    overlay_seconds: float = 0.0
    redis_cluster_seconds: float = 0.0
    rocks_db_seconds: float = 0.0
    model_files_seconds: float = 0.0

    def snapshot(self) -> TierCounters:
        """A copy, safe to read while lookups go on."""
        return TierCounters(**{f.name: getattr(self, f.name) for f in fields(self)})


@dataclass(frozen=True)
class LowerTier:
    """A store below the shared host tier and the name it keeps this table under.

    Args:
        store: the store (its ``kind`` is ``overlay``, ``redis_cluster``, ``rocks_db`` or
            ``model_files``).
        table: the table's name in the store, :func:`~hps_core.tiers.backing.table_tag`.
        complete: it holds every row a tier above it may hold, so a key it answers absent is
            unknown to the table even when a tier above did not answer (RocksDB or the model
            files of a table without online updates; updates reach neither).
    """

    store: BackingStore
    table: str
    complete: bool = False


class TieredTable:
    """One table looked up through the shared host tier and the stores below it.

    Args:
        shared: the shared host tier (whole, partial or empty).
        lower: the stores below it, highest first.
        name: label for logs, e.g. ``"dlrm.t0"``.
        cache_missed_embeddings: write rows found in RocksDB to the Redis cluster above it
            (ps.json ``volatile_db.cache_missed_embeddings``).
        refill: for a Redis cluster that should hold every row of the model files below it:
            writes back what the cluster lost and returns how many rows it wrote. Given, the
            rows the files answer for keys the cluster reported absent are written back to it
            at once, and ``refill`` runs in the background.
        release: called once by :meth:`close` after the shared tier is closed (the factory
            drops its references to the stores there).

    Example:
        >>> table = TieredTable(shared, [LowerTier(rocks, "hps_et.m.t0")])  # doctest: +SKIP
        >>> values, found = table.lookup(np.array([3, 7, 3], dtype=np.int64))  # doctest: +SKIP
        >>> values.shape, table.tier_counters().rocks_db_hits  # doctest: +SKIP
        ((3, 16), 1)
    """

    has_lower_tiers = True

    def __init__(
        self,
        shared: SharedHostTable,
        lower: Sequence[LowerTier],
        name: str = "table",
        cache_missed_embeddings: bool = False,
        refill: Callable[[], int] | None = None,
        release: Callable[[], None] | None = None,
    ) -> None:
        self.shared = shared
        self.lower = tuple(lower)
        self.name = name
        self.dim = shared.dim
        self.default_value = shared.default_value
        self.row_format = shared.row_format
        self.table_rows = shared.table_rows
        self.counters = TierCounters()
        self._lock = threading.Lock()
        self._release = release
        self._next_error_log: dict[str, float] = {}
        # Tier index -> index of the Redis tier above it that receives its rows (those of
        # keys the cluster answered absent).
        self._elevate_to: dict[int, int] = {}
        for i, tier in enumerate(self.lower):
            kind = tier.store.kind
            if (kind == "rocks_db" and cache_missed_embeddings) or (
                kind == "model_files" and refill is not None
            ):
                above = [j for j in range(i) if self.lower[j].store.kind == "redis_cluster"]
                if above:
                    self._elevate_to[i] = above[-1]
        self._refill = refill
        self._next_refill = 0.0
        self._refilling: concurrent.futures.Future[None] | None = None
        self._worker: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: list[concurrent.futures.Future[None]] = []

    def lower_store(self, kind: str) -> LowerTier | None:
        """The first tier below the shared one of ``kind`` (``overlay``, ``redis_cluster``,
        ``rocks_db``), or ``None``."""
        return next((tier for tier in self.lower if tier.store.kind == kind), None)

    def lower_may_answer(self) -> bool:
        """Whether a tier below the shared one may hold a row now: always with Redis or
        RocksDB; with the update overlay alone, once updates brought a key the shared tier
        lacks. While it is False the GPU pipeline skips its host round trip for the table."""
        return any(
            tier.store.kind != "overlay" or tier.store.rows(tier.table) > 0 for tier in self.lower
        )

    # --- the shared tier, as the GPU pipeline reads it -------------------------------------

    @property
    def rows(self) -> int:
        """Rows held by the shared host tier (see :attr:`table_rows` for the whole table)."""
        return self.shared.rows

    @property
    def layout(self) -> HashLayout:
        """Byte layout of the shared host tier's segment."""
        return self.shared.layout

    @property
    def sparse_dir(self) -> Path:
        """The sparse model folder the table was loaded from."""
        return self.shared.sparse_dir

    @property
    def nbytes(self) -> int:
        """Bytes of shared memory the shared tier occupies."""
        return self.shared.nbytes

    def buffer_address(self) -> tuple[int, int]:
        """:meth:`SharedHostTable.buffer_address` of the shared tier."""
        return self.shared.buffer_address()

    def index_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`SharedHostTable.index_arrays` of the shared tier."""
        return self.shared.index_arrays()

    def contents(self) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`SharedHostTable.contents` of the shared tier (its rows only)."""
        return self.shared.contents()

    def stored_contents(self) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`SharedHostTable.stored_contents` of the shared tier (its rows only)."""
        return self.shared.stored_contents()

    def find(self, keys: np.ndarray) -> np.ndarray:
        """:meth:`SharedHostTable.find`: rows of ``keys`` in the shared tier, ``-1`` if absent."""
        return self.shared.find(keys)

    # --- lookups ---------------------------------------------------------------------------

    def rows_in_place(
        self, unique: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """:meth:`SharedHostTable.rows_in_place` through the cascade: the keys the shared
        tier lacks are read from the tiers below (the default vector where none holds them),
        counted as :meth:`lookup` counts.

        Args:
            unique: distinct int64 keys.

        Returns:
            ``(values, rows, below, found_below)`` as the shared tier's, ``below`` from the
            lower tiers; None where the rows are stored compressed.

        Raises:
            TierUnavailableError: as :meth:`lookup_lower`.
        """
        if not self.row_format.is_identity:
            return None
        if self.shared.rows:
            placed = self.shared.rows_in_place(unique)
            assert placed is not None  # the shared tier stores rows as the cascade does
            values, rows = placed[0], placed[1]
        else:  # the volatile level is Redis: nothing to probe here
            values = np.empty((0, self.dim), np.float32)
            rows = np.full(len(unique), -1, np.int64)
        missing = np.flatnonzero(rows < 0)
        if len(missing) < len(unique):
            with self._lock:
                self.counters.host_hits += len(unique) - len(missing)
        if not len(missing):
            return values, rows, np.empty((0, self.dim), np.float32), np.zeros(0, dtype=bool)
        below, found = self.lookup_lower(unique[missing])
        return values, rows, below, found

    def lookup(
        self, keys: np.ndarray, out: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Vectors of ``keys`` from the highest tier holding each; the default vector else.

        Args:
            keys: int64 keys, any order, duplicates allowed.
            out: optional float32 ``[len(keys), dim]`` C-contiguous array to write into.

        Returns:
            ``(values, found)``: float32 ``[len(keys), dim]`` and a bool mask of the keys some
            tier holds.

        Raises:
            TypeError: the keys are not int64.
        """
        return self._cascade(keys, stored=False, out=out)

    def lookup_stored(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`lookup`, the rows stored in the table's precision (what its GPU caches hold).

        Args:
            keys: int64 keys, any order, duplicates allowed.

        Returns:
            ``(stored, found)``: ``row_format.stored_dtype`` ``[len(keys), row_words]`` and
            a bool mask of the keys some tier holds.
        """
        return self._cascade(keys, stored=True)

    def _cascade(
        self, keys: np.ndarray, stored: bool, out: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The shared tier, then the tiers below for the keys it lacks: float32 vectors, or
        with ``stored`` the rows as the table stores them."""
        keys = np.asarray(keys)
        if keys.dtype != np.int64:
            raise TypeError(f"keys must be int64, got {keys.dtype}")
        keys = keys.ravel()
        fmt = self.row_format
        if self.shared.rows:
            if stored:
                values, found = self.shared.lookup_stored(keys)
            else:
                values, found = self.shared.lookup(keys, out)
            host_hits = int(np.count_nonzero(found))
        else:  # the volatile level is Redis: nothing to probe here
            width, dtype = (fmt.row_words, fmt.stored_dtype) if stored else (self.dim, np.float32)
            values = np.empty((len(keys), width), dtype) if out is None else out
            found = np.zeros(len(keys), dtype=bool)
            host_hits = 0
        if host_hits:
            with self._lock:
                self.counters.host_hits += host_hits
        if host_hits < len(keys):
            miss = np.flatnonzero(~found)
            lower = self.lookup_lower_stored if stored else self.lookup_lower
            values[miss], found[miss] = lower(keys[miss])
        return values, found

    def lookup_lower_stored(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`lookup_lower`, the rows encoded in the table's precision.

        Args:
            keys: int64 host keys, any order, duplicates allowed.

        Returns:
            ``(stored, found)``: ``row_format.stored_dtype`` ``[len(keys), row_words]`` (the
            default vector, encoded, where no lower tier holds the key) and a bool mask.
        """
        return self._lookup_below(keys)

    def lookup_lower(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Vectors of ``keys`` from the tiers below the shared host tier only.

        What the GPU pipeline calls for the keys its probe of the shared tier missed. For a
        table stored compressed the rows are quantised as every tier of this process stores
        them (:meth:`lookup_lower_stored`, decoded).

        Args:
            keys: int64 host keys, any order, duplicates allowed (looked up once each).

        Returns:
            ``(values, found)``: float32 ``[len(keys), dim]`` (the default vector where no
            lower tier holds the key) and a bool mask.
        """
        stored, found = self._lookup_below(keys)
        fmt = self.row_format
        if fmt.is_identity:
            return stored, found
        values = fmt.decode_stored(stored)
        values[~found] = self.default_value  # exactly, not its encoding
        return values, found

    def _lookup_below(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The stored rows the tiers below the shared one hold for ``keys`` (FP32 tiers'
        rows encoded here), the encoded default vector for the others, and the found mask;
        counted. For an fp32 table: the rows themselves.

        Raises:
            TierUnavailableError: a tier that may hold some of the keys did not answer, and
                no complete tier below it could say they are unknown.
        """
        start = time.perf_counter()
        fmt = self.row_format
        keys = np.ascontiguousarray(keys, dtype=np.int64).ravel()
        unique, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
        values = np.repeat(self.shared.default_stored[None], len(unique), axis=0)
        found = np.zeros(len(unique), dtype=bool)
        # Keys a tier that did not answer may hold, until a complete tier vouches for them.
        unanswered = np.zeros(len(unique), dtype=bool)
        silent: dict[str, str] = {}  # kind -> why it did not answer (for the error)
        # Tier index -> keys (indices into unique) that this Redis tier answered absent.
        absent: dict[int, np.ndarray] = {}
        remaining = np.arange(len(unique))
        hits: dict[str, int] = {}
        errors: dict[str, int] = {}
        took: dict[str, float] = {}  # kind -> seconds its lookups took
        written_back = 0
        for i, tier in enumerate(self.lower):
            if not len(remaining):
                break
            store, kind = tier.store, tier.store.kind
            asked = unique[remaining]
            before = store.errors
            lost = np.zeros(len(asked), dtype=bool) if store_reports_unanswered(store) else None
            extra = {} if lost is None else {"unanswered": lost}
            why = ""
            asked_at = time.perf_counter()
            try:
                # The overlay stores a compressed table's rows encoded already, as Redis and
                # RocksDB do with store_compressed; else they hold FP32 rows, encoded below
                # once they come up.
                encoded = getattr(store, "stores_encoded", False)
                if encoded:
                    got, got_found = store.lookup_stored(tier.table, asked, self.dim, **extra)
                else:
                    got, got_found = store.lookup(
                        tier.table, asked, self.dim, self.default_value, **extra
                    )
            except Exception as exc:  # any failure of a tier: its keys fall through
                got_found, why = None, str(exc)
                if not _failure_reason(store).startswith("node "):  # a node down: said by it
                    self._log_error(kind, exc)
            took[kind] = took.get(kind, 0.0) + time.perf_counter() - asked_at
            # Failures the store counted itself (keys of a lost node), else the one raised.
            failed = max(store.errors - before, 0 if got_found is not None else 1)
            errors[kind] = errors.get(kind, 0) + failed
            if got_found is None:
                lost = np.ones(len(asked), dtype=bool)
            elif lost is None:  # a store that cannot say which keys failed: all it missed
                lost = ~got_found if failed else np.zeros(len(asked), dtype=bool)
            if lost.any():
                unanswered[remaining[lost]] = True
                silent[kind] = _failure_reason(store) or why or "requests failed"
            if tier.complete:  # what it answered absent is unknown to the table
                unanswered[remaining[~lost]] = False
            if got_found is None:
                continue
            if kind == "redis_cluster":
                absent[i] = remaining[~got_found & ~lost]
            if not got_found.any():
                continue
            hit_rows = got[got_found]
            rows = remaining[got_found]
            target = self._elevate_to.get(i)
            if target is not None and target in absent:
                # Only rows of keys the cluster answered absent: a node that did not answer
                # would refuse them too.
                back = np.isin(rows, absent[target], assume_unique=True)
                if back.any():
                    self._elevate(self.lower[target], unique[rows[back]], hit_rows[back], encoded)
                    written_back += int(back.sum())
            if not (encoded or fmt.is_identity):
                hit_rows = fmt.encode_stored(hit_rows)
            values[rows] = hit_rows
            found[rows] = True
            hits[kind] = hits.get(kind, 0) + int(counts[rows].sum())
            remaining = remaining[~got_found]
        lost_keys = remaining[unanswered[remaining]]
        with self._lock:
            c = self.counters
            for kind, n in hits.items():
                setattr(c, f"{kind}_hits", getattr(c, f"{kind}_hits") + n)
            for kind, n in errors.items():
                if n:
                    setattr(c, f"{kind}_errors", getattr(c, f"{kind}_errors") + n)
            c.unanswered_keys += int(counts[lost_keys].sum())
            c.default_keys += int(counts[remaining].sum()) - int(counts[lost_keys].sum())
            c.lower_seconds += time.perf_counter() - start
            for kind, seconds in took.items():
                setattr(c, f"{kind}_lookups", getattr(c, f"{kind}_lookups") + 1)
                setattr(c, f"{kind}_seconds", getattr(c, f"{kind}_seconds") + seconds)
        if written_back and self._refill is not None:
            self._cluster_lost_rows(written_back)
        if len(lost_keys):
            tiers = "; ".join(f"{kind} {why}" for kind, why in silent.items())
            raise TierUnavailableError(
                f"table {self.name}: {tiers}: {len(lost_keys)} keys it may hold cannot be "
                "answered (no tier below holds them)"
            )
        return values[inverse], found[inverse]

    def _cluster_lost_rows(self, rows: int) -> None:
        """The model files answered ``rows`` keys the Redis cluster should hold: say so (at
        most once per period) and refill the cluster in the background."""
        _EVERY.log(
            logger,
            logging.WARNING,
            ("lost", self.name),
            "%s: the Redis cluster lacks %d rows of the model files (a node lost its data?): "
            "answered from the model files and written back; refilling what it lost",
            self.name,
            rows,
        )
        now = time.monotonic()
        worker = self._background()
        with self._lock:
            if now < self._next_refill or (self._refilling and not self._refilling.done()):
                return
            self._next_refill = now + REFILL_PERIOD_S
            self._refilling = worker.submit(self._run_refill)

    def _run_refill(self) -> None:
        assert self._refill is not None
        try:
            written = self._refill()
        except Exception as exc:
            self._log_error("redis_cluster", exc)
            return
        if written:
            with self._lock:
                self.counters.refilled_keys += written

    def _log_error(self, kind: str, exc: Exception) -> None:
        now = time.monotonic()
        if now >= self._next_error_log.get(kind, 0.0):
            self._next_error_log[kind] = now + _ERROR_LOG_PERIOD_S
            logger.error(
                "%s: %s lookup failed, its keys fall through to the tiers below: %s",
                self.name,
                kind,
                exc,
            )

    # --- cache_missed_embeddings ------------------------------------------------------------

    def _elevate(self, tier: LowerTier, keys: np.ndarray, rows: np.ndarray, stored: bool) -> None:
        self._pending = [f for f in self._pending if not f.done()]
        if len(self._pending) >= MAX_PENDING_ELEVATIONS:
            with self._lock:
                self.counters.dropped_elevations += 1
            return
        self._pending.append(self._background().submit(self._write_up, tier, keys, rows, stored))

    def _background(self) -> concurrent.futures.ThreadPoolExecutor:
        """The thread that writes rows up to Redis and refills it (one per table: writes
        never wait for each other's tables, and never for a lookup)."""
        with self._lock:
            if self._worker is None:
                self._worker = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix=f"hps-elevate-{self.name}"
                )
            return self._worker

    def _write_up(self, tier: LowerTier, keys: np.ndarray, rows: np.ndarray, stored: bool) -> None:
        field = f"{tier.store.kind}_errors"
        before = tier.store.errors
        try:
            # Only keys the tier does not hold: an update may have written a newer row there
            # since these rows were read below.
            if stored:  # the same precision above (the config keeps the two alike)
                tier.store.insert_stored(tier.table, keys, rows, self.dim, replace=False)
            else:
                tier.store.insert_missing(tier.table, keys, rows)
        except Exception as exc:
            self._log_error(tier.store.kind, exc)
            failed = max(tier.store.errors - before, 1)
        else:
            failed = max(tier.store.errors - before, 0)
        with self._lock:
            if not failed:
                self.counters.elevated_keys += len(keys)
            setattr(self.counters, field, getattr(self.counters, field) + failed)

    def flush(self) -> None:
        """Wait until the rows being written to Redis (``cache_missed_embeddings``, write-backs
        and a refill) are."""
        for future in [*self._pending, self._refilling]:
            if future is not None:
                future.exception()  # waits; failures were counted and logged
        self._pending = []

    # --- counters and life cycle ------------------------------------------------------------

    def tier_counters(self) -> TierCounters:
        """A snapshot of the per-tier counters."""
        with self._lock:
            counters = self.counters.snapshot()
        overlay = self.lower_store("overlay")
        if overlay is not None:
            counters.overlay_evictions = overlay.store.table_evictions(overlay.table)
        return counters

    def close(self) -> None:
        """Finish background writes, detach from the shared tier, release the stores."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
        self._pending = []
        self.shared.close()
        if self._release is not None:
            release, self._release = self._release, None
            release()
