"""Choose, fill and open the host tiers a ps.json asks for.

The volatile database types of HugeCTR that keep tables in host memory (``hash_map``,
``parallel_hash_map``, ``multi_process_hash_map``) all map to :class:`SharedHostTable`: under
Triton's Python backend one shared copy per machine is what each of them is for.

Without a lower tier (no ``persistent_db``, volatile level in host memory) a table opens as
its :class:`SharedHostTable` alone, holding every row, exactly as before the cascade existed.
With one, it opens as a :class:`~hps_core.tiers.cascade.TieredTable`:

====================  ==================================  ===================  ============
volatile_db.type      shared host tier                    Redis cluster        RocksDB
====================  ==================================  ===================  ============
hash_map types        first ``initial_cache_rate`` rows   -                    every row
redis_cluster         empty (no local copy: the cluster   first ``initial_     every row
                      is the volatile level, as HugeCTR)  cache_rate`` rows
disabled              empty                               -                    every row
====================  ==================================  ===================  ============

Without RocksDB, ``initial_cache_rate`` is ignored (warned): the volatile level holds every
row, since nothing below could answer the others. A Redis cluster without RocksDB has the
model's sparse files below it (:mod:`hps_core.tiers.file_rows`), which answer what a lost node
held; an index of their keys takes about 14 bytes a row of ``/dev/shm``, once per machine.
``initialize_after_startup: false`` leaves the volatile level empty (for a hash map: an empty
shared tier) and RocksDB unfilled (it must then hold the table already, as with
``read_only``). HugeCTR applies the rate only when a table exceeds the volatile database's
capacity (``overflow_margin``); here it is the share of the rows, as HugeCTR's documentation
describes it.

Loading happens once per database, not once per process (Triton instances are processes):

- RocksDB: a loader takes an exclusive ``flock`` on ``<path>/HPS_TRITON_LOAD_LOCK``, opens the
  database for writing (RocksDB allows one writing process), loads the table unless its
  marker says the same source files were loaded already, writes the marker, flushes and
  closes. Every process then serves from a read-only handle (one per database per process,
  reopened when a table it lacks was loaded since). The marker is a one-row table
  ``hps_triton_loaded.<tag>`` in the database itself holding a digest of the source files'
  identity (path, size, mtime, inode; as :func:`~hps_core.tiers.host_table.segment_name`),
  so a restart skips the load and a rewritten table is dropped and reloaded.
- Redis cluster: the same marker in the cluster, the lock a file in the shared-memory folder
  (per machine; two machines loading at once write the same rows).

``read_only`` databases are never written: the table must be there, else the error names the
path and the table.

With online updates (``update_source.type: kafka_message_queue``) every table opens as a
cascade: its shared tier is mapped read-write (updates overwrite the rows it holds, in place,
once per machine) and an :class:`~hps_core.tiers.overlay.OverlayStore` of this process is the
first tier below it (rows of keys the shared tier lacks, bounded by ``volatile_db``'s
``overflow_*`` fields as HugeCTR's hash map). The consumer that applies the updates is started
by the model's lookup (:mod:`hps_core.updates.apply`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from hps_core.config import (
    DatabaseType,
    PersistentDBConfig,
    PSConfig,
    TableConfig,
    UpdateSourceType,
    VolatileDBConfig,
)
from hps_core.errors import ModelFileError, NotAvailableError, RequestError, TierUnavailableError
from hps_core.formats.sparse import (
    KEY_FILE,
    VECTOR_FILE,
    inspect_sparse_table,
    iter_sparse_table,
)
from hps_core.formats.uris import model_path
from hps_core.hashing import partition_of
from hps_core.quant import StoragePrecision
from hps_core.tiers.backing import BackingStore, table_tag
from hps_core.tiers.cascade import LowerTier, TieredTable
from hps_core.tiers.encoded_rows import EncodedRows, encoded_tag, other_copies
from hps_core.tiers.file_rows import ModelFileRows, index_name
from hps_core.tiers.host_table import LAYOUT_VERSION, SharedHostTable, held_rows
from hps_core.tiers.overlay import OverlayStore
from hps_core.tiers.shm_segment import file_identity, file_lock, shm_dir

logger = logging.getLogger("hps_core")

_SHARED_MEMORY_TYPES = frozenset(
    {
        DatabaseType.HASH_MAP,
        DatabaseType.PARALLEL_HASH_MAP,
        DatabaseType.MULTI_PROCESS_HASH_MAP,
    }
)
LOAD_LOCK = "HPS_TRITON_LOAD_LOCK"
MARKER_PREFIX = "hps_triton_loaded."
_MARKER_DIM = 8  # a 16-byte digest as eight 16-bit integers, exact in float32


def check_tiers_available(config: PSConfig) -> None:
    """Raise if the ps.json needs a tier this version cannot serve.

    Args:
        config: the parsed ps.json.

    Raises:
        NotAvailableError: naming the ps.json field and the value that is not available yet.
        ModelFileError: ``persistent_db.path`` is a file.
    """
    volatile = config.volatile_db.type
    if volatile not in _SHARED_MEMORY_TYPES | {DatabaseType.DISABLED, DatabaseType.REDIS_CLUSTER}:
        raise NotAvailableError(
            f"volatile_db.type: '{volatile.value}' is not available; use 'hash_map', "
            "'parallel_hash_map', 'multi_process_hash_map' or 'redis_cluster'"
        )
    if config.persistent_db.type not in (DatabaseType.DISABLED, DatabaseType.ROCKS_DB):
        raise NotAvailableError(
            f"persistent_db.type: '{config.persistent_db.type.value}' is not available; use "
            "'rocks_db' or 'disabled'"
        )
    rocks = config.persistent_db
    path = Path(rocks.path)
    if rocks.type is DatabaseType.ROCKS_DB and path.exists() and not path.is_dir():
        raise ModelFileError(
            f"persistent_db.path: '{rocks.path}' is a file; RocksDB keeps its database in "
            "a folder (give a folder, new or existing)"
        )
    if config.update_source.type not in (
        UpdateSourceType.NULL,
        UpdateSourceType.KAFKA_MESSAGE_QUEUE,
    ):
        raise NotAvailableError(
            f"update_source.type: '{config.update_source.type.value}' is not available; "
            "use 'null' or 'kafka_message_queue'"
        )


def receives_updates(config: PSConfig) -> bool:
    """Whether tables of this ps.json receive online updates (a Kafka update source)."""
    return config.update_source.type == UpdateSourceType.KAFKA_MESSAGE_QUEUE


def has_lower_tiers(config: PSConfig) -> bool:
    """Whether tables of this ps.json open as a cascade (a Redis cluster, RocksDB, or the
    overlay of online updates below the shared tier)."""
    return (
        config.volatile_db.type == DatabaseType.REDIS_CLUSTER
        or config.persistent_db.type == DatabaseType.ROCKS_DB
        or receives_updates(config)
    )


@dataclasses.dataclass(frozen=True)
class TierPlan:
    """The tiers a table of a ps.json opens with, and the share of its rows each is filled
    with when it opens (the table of the module docstring).

    Attributes:
        host_fraction: share of the file's rows the shared host tier holds.
        redis_fraction: share of the rows loaded into the Redis cluster; None: no Redis tier.
        rocks: whether RocksDB holds the table (every row).
        overlay: whether a per-process overlay of online updates sits below the shared tier.
    """

    host_fraction: float
    redis_fraction: float | None
    rocks: bool
    overlay: bool

    @property
    def model_files(self) -> bool:
        """Whether the model's sparse files are the last tier (:mod:`hps_core.tiers.file_rows`:
        a Redis cluster without RocksDB below it; their index takes shared memory)."""
        return self.redis_fraction is not None and not self.rocks

    @property
    def cascade(self) -> bool:
        """Whether the table opens as a cascade (a tier below the shared host tier)."""
        return self.rocks or self.redis_fraction is not None or self.overlay


def tier_plan(config: PSConfig) -> TierPlan:
    """Which tiers every table of ``config`` gets (:func:`open_table_tiers` follows it).

    Example:
        >>> tier_plan(config)  # doctest: +SKIP
        TierPlan(host_fraction=1.0, redis_fraction=None, rocks=False, overlay=False)
    """
    volatile, persistent = config.volatile_db, config.persistent_db
    has_rocks = persistent.type == DatabaseType.ROCKS_DB
    has_redis = volatile.type == DatabaseType.REDIS_CLUSTER
    updates = receives_updates(config)
    if not (has_rocks or has_redis or updates):
        return TierPlan(host_fraction=1.0, redis_fraction=None, rocks=False, overlay=False)
    rate = volatile.initial_cache_rate if has_rocks else 1.0
    if not volatile.initialize_after_startup:
        rate = 0.0
    # volatile_db disabled: RocksDB answers, unless there is none (then the shared copy
    # holds every row, as without updates).
    disabled = volatile.type == DatabaseType.DISABLED and has_rocks
    return TierPlan(
        host_fraction=0.0 if has_redis or disabled else rate,
        redis_fraction=rate if has_redis else None,
        rocks=has_rocks,
        overlay=updates,
    )


def open_table_tiers(
    config: PSConfig, model: str, table: TableConfig
) -> SharedHostTable | TieredTable:
    """Open (filling once per machine or database) every tier of one table.

    ``volatile_db.type: disabled`` without a persistent tier still gets the shared copy:
    there is nowhere else to read the table from.

    Args:
        config: the parsed ps.json.
        model: the model's name (lower tiers name the table ``hps_et.<model>.<table>``).
        table: the table to open.

    Returns:
        The shared table itself when the ps.json has no lower tier and no update source,
        else the cascade (its first lower tier the update overlay, with an update source).

    Raises:
        NotAvailableError: a tier this version cannot serve.
        ModelFileError: a database cannot be opened or lacks a table it must hold.

    Example:
        >>> host = open_table_tiers(config, "dlrm", config.models[0].tables[0])  # doctest: +SKIP
        >>> values, found = host.lookup(np.array([1, 2], np.int64))  # doctest: +SKIP
    """
    check_tiers_available(config)
    volatile, persistent = config.volatile_db, config.persistent_db
    plan = tier_plan(config)
    has_redis = plan.redis_fraction is not None
    if volatile.initial_cache_rate < 1.0 and not plan.rocks:
        logger.warning(
            "volatile_db.initial_cache_rate=%s ignored: without a persistent tier the %s holds "
            "every row",
            volatile.initial_cache_rate,
            "Redis cluster" if has_redis else "host tier",
        )
    updates = plan.overlay
    if not plan.cascade:
        return SharedHostTable(
            table.sparse_file, table.dim, table.default_value, precision=table.storage
        )

    tag = table_tag(model, table.name)
    releases: list[Any] = []
    lower: list[LowerTier] = []
    if updates:
        # Consulted first below the shared tier: it holds the newest rows of its keys. Bounded
        # by volatile_db's overflow fields, per partition as HugeCTR's hash map: with a hash
        # map type it is the part of the hash map that holds new keys (the shared tier is
        # sized by the files and not counted); with redis_cluster the updater writes every
        # new key to the cluster too, which bounds it by the same margin, so the overlay is a
        # per-process copy of at most that many rows and a row it evicts is still answered
        # by the cluster (unless the cluster evicted it too). volatile_db disabled: the fields
        # still bound it if given. No overflow_margin: unbounded.
        overlay = OverlayStore(
            margin=volatile.overflow_margin,
            policy=volatile.overflow_policy,
            target=volatile.overflow_resolution_target,
            partitions=volatile.resolved_num_partitions,
            precision=table.storage,
        )
        lower.append(LowerTier(overlay, tag))
    refill = None
    try:
        if has_redis:
            redis = _acquire(("redis", _redis_key(volatile)), lambda: _open_redis(volatile))
            releases.append(redis)
            rows, name = _table_rows(redis.store, volatile.store_compressed, tag, table)
            if plan.redis_fraction:
                _fill_redis(redis.store, rows, volatile, name, table, plan.redis_fraction)
            _warn_other_copies(redis.store, f"volatile_db '{volatile.address}'", tag, name)
            lower.append(LowerTier(rows, name))
        if plan.rocks:
            path = str(Path(persistent.path).resolve())
            rocks = _acquire(("rocks", path), lambda: _RocksReader(persistent))
            releases.append(rocks)
            rows, name = _table_rows(rocks.store, persistent.store_compressed, tag, table)
            _ensure_rocks_table(rocks.store, persistent, tag, table)
            _warn_other_copies(rocks.store, f"persistent_db '{persistent.path}'", tag, name)
            # Updates are not written to RocksDB: it vouches for keys only without them.
            lower.append(LowerTier(rows, name, complete=not updates))
        if plan.model_files:
            # The cluster is the only copy the server reads: the files it was filled from
            # answer what a lost node held (module docstring of hps_core.tiers.cascade).
            folder = model_path(table.sparse_file)
            handle = _acquire(
                ("files", index_name(folder, table.dim)),
                lambda: ModelFileRows(folder, table.dim),
            )
            releases.append(handle)
            files = handle.store
            lower.append(LowerTier(files, tag, complete=not updates))
            if plan.redis_fraction:
                redis_tier = lower[-2]
                refill = functools.partial(
                    _refill_redis, redis.store, redis_tier.store, volatile, redis_tier.table, files
                )
        shared = SharedHostTable(
            table.sparse_file,
            table.dim,
            table.default_value,
            fraction=plan.host_fraction,
            writable=updates,
            precision=table.storage,
        )
    except BaseException:
        _release_all(releases)
        raise
    return TieredTable(
        shared,
        lower,
        name=f"{model}.{table.name}",
        cache_missed_embeddings=volatile.cache_missed_embeddings,
        refill=refill,
        release=functools.partial(_release_all, releases),
    )


def _warn_other_copies(store: BackingStore, database: str, tag: str, used: str) -> None:
    """Name the copies of a table this server does not read (another storage or
    store_compressed setting's): they hold memory or disk until ``hps prune`` removes them,
    which servers must not do themselves: one still running the old setting reads them."""
    try:
        copies = other_copies(store.tables(), tag, used)
    except TierUnavailableError:  # a node down: named by the lookups already
        return
    for copy in copies:
        logger.warning(
            "%s also holds '%s', a copy of the table under another storage or store_compressed "
            "setting that this server does not read ('%s'); `hps prune PS_JSON` removes it "
            "once no server reads it",
            database,
            copy,
            used,
        )


def _table_rows(
    store: BackingStore, compressed: bool, tag: str, table: TableConfig
) -> tuple[BackingStore, str]:
    """How a database holds the table: what reads and writes its rows, and its name there.
    With ``store_compressed``, a compressed table's stored rows under :func:`encoded_tag`;
    else (and for fp32 tables) FP32 vectors under HPS's tag, as HugeCTR stores them."""
    name = stored_name(compressed, tag, table)
    return (store if name == tag else EncodedRows(store, table.storage)), name


def stored_name(compressed: bool, tag: str, table: TableConfig) -> str:
    """The table's name in a database whose ``store_compressed`` is ``compressed``: its tag
    (HugeCTR's FP32 layout), or :func:`encoded_tag` for a compressed table stored compressed."""
    if not compressed or table.storage is StoragePrecision.FP32:
        return tag
    return encoded_tag(tag, table.storage)


# --- process-wide store handles ------------------------------------------------------------


@dataclasses.dataclass
class _Handle:
    key: tuple[str, ...]
    store: Any
    users: int = 0


_handles: dict[tuple[str, ...], _Handle] = {}
_handles_lock = threading.Lock()


def _acquire(key: tuple[str, ...], make: Any) -> _Handle:
    """The process's one handle of a store (tables of every model share it), counted."""
    with _handles_lock:
        handle = _handles.get(key)
        if handle is None:
            handle = _handles[key] = _Handle(key, make())
        handle.users += 1
        return handle


def _release_all(handles: list[_Handle]) -> None:
    for handle in handles:
        _release(handle)


def _release(handle: _Handle) -> None:
    with _handles_lock:
        handle.users -= 1
        if handle.users > 0:
            return
        _handles.pop(handle.key, None)
    handle.store.close()


def _redis_key(config: VolatileDBConfig) -> tuple[str, ...]:
    # The password is part of the identity but never kept in clear text.
    secret = hashlib.sha256(config.password.encode()).hexdigest()[:16]
    return (config.address, config.user_name, secret, str(config.enable_tls))


def _open_redis(config: VolatileDBConfig) -> BackingStore:
    from hps_core.tiers.redis_store import RedisClusterStore  # here: only Redis models need it

    return RedisClusterStore(config)


_READ_ONLY_OPENS = 8  # tries of one read-only open; their waits add up to about 1.4 s


def _open_read_only(config: PersistentDBConfig) -> Any:
    """A read-only RocksDB handle, opened again while another process writes the database.

    A read-only open lists the database's files, then opens them; a writer's flush or
    compaction in between deletes some (RocksDB then says a file or a column family is
    missing). Waiting a moment and opening again sees the writer's new set. A database that
    still cannot be opened at the last try is reported in RocksDB's own words.
    """
    from hps_core.tiers.rocks_store import RocksStore

    for attempt in range(1, _READ_ONLY_OPENS):
        try:
            return RocksStore(config)
        except ModelFileError:
            time.sleep(0.05 * attempt)
    return RocksStore(config)


class _RocksReader:
    """A read-only RocksDB handle of one database in this process, reopened on demand.

    Other processes load tables while this one serves; a read-only handle sees the database
    as it was when opened, so a table loaded since needs a fresh one. Old handles are kept
    until :meth:`close`: a lookup in flight on another thread may still use them.
    """

    kind = "rocks_db"

    def __init__(self, config: PersistentDBConfig) -> None:
        self.config = dataclasses.replace(config, read_only=True)
        self.path = Path(config.path)
        self._current: Any = None
        self._retired: list[Any] = []
        self._lock = threading.Lock()

    @property
    def errors(self) -> int:
        """Failed requests of every handle opened."""
        stores = self._retired + ([self._current] if self._current is not None else [])
        return sum(store.errors for store in stores)

    def reopen(self) -> Any:
        """Open a fresh read-only handle (the previous one is kept until :meth:`close`)."""
        with self._lock:
            fresh = _open_read_only(self.config)
            if self._current is not None:
                self._retired.append(self._current)
            self._current = fresh
            return fresh

    def current(self) -> Any:
        """The current handle, opened if the database exists; ``None`` if it does not."""
        if self._current is None and (self.path / "CURRENT").is_file():
            return self.reopen()
        return self._current

    def tables(self) -> list[str]:
        """Tables of the current handle."""
        current = self.current()
        return [] if current is None else current.tables()

    def insert(self, table: str, keys: np.ndarray, vectors: np.ndarray) -> None:
        """Refused: serving processes never write the persistent tier."""
        raise RequestError(f"persistent_db '{self.path}' is opened read-only for serving")

    def load_sparse(self, table: str, folder: Any, dim: int) -> int:
        """Refused: tables are loaded by :func:`open_table_tiers` under the load lock."""
        raise RequestError(f"persistent_db '{self.path}' is opened read-only for serving")

    def lookup(
        self, table: str, keys: np.ndarray, dim: int, default: float = 0.0
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`RocksStore.lookup` on the current handle."""
        return self._current.lookup(table, keys, dim, default)

    def close(self) -> None:
        """Close every handle opened (idempotent)."""
        with self._lock:
            for store in [*self._retired, self._current]:
                if store is not None:
                    store.close()
            self._retired, self._current = [], None


# --- loading once ----------------------------------------------------------------------------


def source_digest(table: TableConfig, rows: int | None = None) -> bytes:
    """16 bytes naming a table's source files (and the rows taken from them) exactly.

    Args:
        table: the table.
        rows: rows loaded when only the first ones are (Redis with ``initial_cache_rate``).

    Returns:
        The digest stored in a database's marker.
    """
    folder = model_path(table.sparse_file)
    parts = [
        f"v{LAYOUT_VERSION}",
        f"dim={table.dim}",
        file_identity(folder / KEY_FILE),
        file_identity(folder / VECTOR_FILE),
        f"rows={rows}",
    ]
    return hashlib.sha256("|".join(parts).encode()).digest()[:16]


def read_marker(store: BackingStore, tag: str) -> bytes | None:
    """The digest of the source a store's table was loaded from, ``None`` if unmarked."""
    try:
        values, found = store.lookup(MARKER_PREFIX + tag, np.zeros(1, np.int64), _MARKER_DIM)
    except (RequestError, ModelFileError):  # no marker table (yet)
        return None
    if not found[0]:
        return None
    return values[0].astype(np.uint16).astype("<u2").tobytes()


def write_marker(store: BackingStore, tag: str, digest: bytes) -> None:
    """Record that ``tag`` holds the rows of the source named by ``digest``."""
    vector = np.frombuffer(digest, dtype="<u2").astype(np.float32)[None, :]
    store.insert(MARKER_PREFIX + tag, np.zeros(1, np.int64), vector)


def _ensure_rocks_table(
    reader: _RocksReader, config: PersistentDBConfig, hps_tag: str, table: TableConfig
) -> None:
    tag = stored_name(config.store_compressed, hps_tag, table)
    if config.read_only or not config.initialize_after_startup:
        if not (reader.path / "CURRENT").is_file():
            raise ModelFileError(
                f"persistent_db.path '{reader.path}': no RocksDB database there (read_only or "
                "initialize_after_startup=false: the database must already hold the tables)"
            )
        if tag not in reader.tables() and tag not in reader.reopen().tables():
            why = "read_only" if config.read_only else "initialize_after_startup=false"
            hint = ""
            if tag != hps_tag and hps_tag in reader.tables():
                hint = (
                    f"; it holds '{hps_tag}' in HugeCTR's FP32 layout, which "
                    "store_compressed=false reads"
                )
            raise ModelFileError(
                f"persistent_db.path '{reader.path}': no table '{tag}' ({why}: the database "
                f"must already hold it; it has: {', '.join(reader.tables()) or 'none'}){hint}"
            )
        return
    digest = source_digest(table)
    try:
        current = reader.current()
    except ModelFileError:  # still unreadable: the marker is read under the load lock below
        current = None
    if current is not None and read_marker(current, tag) == digest:
        return  # loaded before (by this or another process, now or before a restart)
    from hps_core.tiers.rocks_store import RocksStore

    reader.path.mkdir(parents=True, exist_ok=True)
    lock = reader.path / LOAD_LOCK
    with file_lock(lock):
        writer = RocksStore(dataclasses.replace(config, read_only=False))
        try:
            if read_marker(writer, tag) != digest:
                started = time.perf_counter()
                writer.drop_table(tag)  # rows of older files must not outlive them
                target, _ = _table_rows(writer, config.store_compressed, hps_tag, table)
                rows = target.load_sparse(tag, table.sparse_file, table.dim)
                write_marker(writer, tag, digest)
                writer.flush()
                logger.info(
                    "persistent tier: loaded %s into %s table %s (%d rows) in %.2f s",
                    table.sparse_file,
                    reader.path,
                    tag,
                    rows,
                    time.perf_counter() - started,
                )
        finally:
            writer.close()
        try:
            reader.reopen()  # under the lock: no other loader writes while it opens
        finally:
            lock.unlink(missing_ok=True)  # still held: a waiter re-creates it


def _fill_redis(
    store: BackingStore,
    rows_store: BackingStore,
    config: VolatileDBConfig,
    tag: str,
    table: TableConfig,
    rate: float,
) -> None:
    """Fill ``tag`` with the first ``rate`` of the table's rows through ``rows_store`` (the
    cluster, or its :class:`EncodedRows`), unless its marker in ``store`` names them and the
    cluster still holds that many rows (a node restarted empty loses its part of them, not
    the marker, which another node may hold).

    A node that does not answer leaves the table partly filled, with a warning: its keys are
    answered by the tiers below it (HugeCTR's behaviour too), and the next start fills it."""
    folder = model_path(table.sparse_file)
    rows = held_rows(inspect_sparse_table(folder, table.dim).rows, rate)
    digest = source_digest(table, rows)
    if _redis_holds(store, tag, digest, rows):
        return
    lock = _redis_lock(config, tag)
    with file_lock(lock):
        try:
            if _redis_holds(store, tag, digest, rows):
                return
            try:
                marker: bytes | None = read_marker(store, tag)
            except TierUnavailableError:
                marker = digest  # unreadable: refill over the rows, keep what the others hold
            if marker != digest:
                # Rows of older files must not outlive them (RedisClusterStore.evict).
                drop = getattr(store, "evict", None) or getattr(store, "drop_table", None)
                if drop is not None:
                    drop(tag)
            started, written = time.perf_counter(), 0
            for chunk in iter_sparse_table(folder, table.dim):
                if written >= rows:
                    break
                n = min(len(chunk.keys), rows - written)
                rows_store.insert(tag, chunk.keys[:n], chunk.vectors[:n])
                written += n
            write_marker(store, tag, digest)
            logger.info(
                "volatile tier: cached %d rows of %s in the Redis cluster as %s in %.2f s",
                written,
                folder,
                tag,
                time.perf_counter() - started,
            )
        except TierUnavailableError as exc:
            logger.warning(
                "volatile tier: %s is not cached whole in the Redis cluster (%s); the keys it "
                "lacks are answered by the tiers below, and the next start fills it again",
                tag,
                exc,
            )
        finally:
            lock.unlink(missing_ok=True)


_REFILL_CHUNK = 65536  # rows per write: bounds the memory a refill of a large table takes


def _refill_redis(
    store: BackingStore,
    rows_store: BackingStore,
    config: VolatileDBConfig,
    tag: str,
    files: ModelFileRows,
) -> int:
    """Write back the rows a Redis cluster lost (a node that came back empty) from the model
    files it was filled from: each partition holding fewer rows than the files put there gets
    the files' rows of its keys that it lacks (``HSETNX``: a row an update wrote stays).

    One process of the machine refills at a time (the lock of :func:`_fill_redis`); a process
    that finds it taken leaves the work to the holder.

    Args:
        store: the cluster.
        rows_store: what writes the table's rows there (the cluster, or its EncodedRows).
        config: ps.json ``volatile_db``.
        tag: the table's name in the cluster.
        files: the model files the cluster was filled from.

    Returns:
        Rows written (0 when nothing was lost, or another process refills).

    Raises:
        TierUnavailableError: a node does not answer (the next refill tries again).
    """
    if not hasattr(store, "partition_sizes"):
        return 0
    lock = _redis_lock(config, tag)
    with file_lock(lock, blocking=False) as held:
        if held is None:
            return 0
        try:
            return _refill_partitions(store, rows_store, config, tag, files)
        finally:
            lock.unlink(missing_ok=True)  # still held: a waiter re-creates it


def _refill_partitions(
    store: Any, rows_store: BackingStore, config: VolatileDBConfig, tag: str, files: ModelFileRows
) -> int:
    """:func:`_refill_redis`'s work, under its lock."""
    started = time.perf_counter()
    keys = files.keys()
    parts = partition_of(keys, config.resolved_num_partitions)
    expected = np.bincount(parts, minlength=config.resolved_num_partitions)
    margin = config.overflow_margin
    if margin is not None and int(expected.max(initial=0)) > margin:
        return 0  # the cluster cannot hold them all: its misses are the files' to answer
    short = np.flatnonzero(np.asarray(store.partition_sizes(tag)) < expected)
    if not len(short):
        return 0
    lost = keys[np.isin(parts, short)]
    for first in range(0, len(lost), _REFILL_CHUNK):
        chunk = lost[first : first + _REFILL_CHUNK]
        vectors, _ = files.lookup(tag, chunk, files.dim)
        rows_store.insert_missing(tag, chunk, vectors)
    logger.warning(
        "volatile tier: refilled %d partitions of %s in the Redis cluster from %s (%d rows "
        "offered, those it lacked written) in %.2f s",
        len(short),
        tag,
        files.sparse_dir,
        len(lost),
        time.perf_counter() - started,
    )
    return len(lost)


def _redis_lock(config: VolatileDBConfig, tag: str) -> Path:
    """The machine's lock on filling ``tag`` in the cluster ``config`` names."""
    name = hashlib.sha256(f"{config.address}|{tag}".encode()).hexdigest()[:24]
    return shm_dir() / f"hps-triton-redis-load.{name}.lock"


def _redis_holds(store: BackingStore, tag: str, digest: bytes, rows: int) -> bool:
    """Whether the cluster's ``tag`` was filled from the source ``digest`` names and still
    holds its ``rows`` rows; ``False`` where a node does not answer (the fill says what)."""
    try:
        if read_marker(store, tag) != digest:
            return False
        sizes = getattr(store, "partition_sizes", None)
        return sizes is None or sum(sizes(tag)) >= rows
    except TierUnavailableError:
        return False
