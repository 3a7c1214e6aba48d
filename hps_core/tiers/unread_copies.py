"""Copies of a ps.json's tables in its Redis cluster and RocksDB that its servers do not read.

A database stores a table under its tag (HugeCTR's FP32 layout) or, with the database's
``store_compressed``, a compressed table under ``tag@precision``
(:func:`~hps_core.tiers.factory.stored_name`). When a table's ``storage`` or a database's
``store_compressed`` changes, servers load the table under its new name and leave the old copy
where it is: a server still running with the old setting (a rolling update) reads it. Once none
does, the copy only holds memory (Redis) or disk (RocksDB); :func:`find_unread_copies` lists such
copies and :func:`remove_copies` removes them with their load markers (``hps prune``).

Example:
    >>> config = load_ps_config("ps.json")  # doctest: +SKIP
    >>> copies = find_unread_copies(config)  # doctest: +SKIP
    >>> remove_copies(config, copies)  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from hps_core.config import DatabaseType, PSConfig
from hps_core.tiers.backing import table_tag
from hps_core.tiers.encoded_rows import other_copies
from hps_core.tiers.factory import LOAD_LOCK, MARKER_PREFIX, stored_name
from hps_core.tiers.shm_segment import file_lock

VOLATILE = "volatile_db"
PERSISTENT = "persistent_db"


@dataclass(frozen=True)
class UnreadCopy:
    """One table a database holds that the ps.json's servers do not read.

    Args:
        database: ``volatile_db`` (the Redis cluster) or ``persistent_db`` (RocksDB).
        name: the table's name there (``hps_et.<model>.<table>`` or with ``@<precision>``).
        read: the name the ps.json's servers read the table under.
        rows: rows it holds (``None`` for RocksDB, which does not count them cheaply).
    """

    database: str
    name: str
    read: str
    rows: int | None


def find_unread_copies(config: PSConfig, model_name: str | None = None) -> list[UnreadCopy]:
    """The copies of the ps.json's tables (of every model, or of ``model_name``) that its
    Redis cluster and RocksDB hold under another name than the one its servers read.

    Raises:
        TierUnavailableError: the Redis cluster does not answer.
        ConfigError: the Redis cluster refuses the password.
        ModelFileError: the RocksDB folder is not a database.
    """
    tables = [
        (table_tag(model.name, table.name), table)
        for model in config.models
        if model_name in (None, model.name)
        for table in model.tables
    ]
    copies: list[UnreadCopy] = []
    volatile = config.volatile_db
    if volatile.type is DatabaseType.REDIS_CLUSTER:
        from hps_core.tiers.redis_store import RedisClusterStore

        with RedisClusterStore(volatile) as redis:
            names = redis.tables()
            for tag, table in tables:
                read = stored_name(volatile.store_compressed, tag, table)
                copies += [
                    UnreadCopy(VOLATILE, name, read, redis.count(name))
                    for name in other_copies(names, tag, read)
                ]
    persistent = config.persistent_db
    if persistent.type is DatabaseType.ROCKS_DB and (Path(persistent.path) / "CURRENT").is_file():
        from hps_core.tiers.rocks_store import RocksStore

        with RocksStore(dataclasses.replace(persistent, read_only=True)) as rocks:
            names = rocks.tables()
        for tag, table in tables:
            read = stored_name(persistent.store_compressed, tag, table)
            copies += [
                UnreadCopy(PERSISTENT, name, read, None) for name in other_copies(names, tag, read)
            ]
    return copies


def remove_copies(config: PSConfig, copies: list[UnreadCopy]) -> None:
    """Remove ``copies`` (from :func:`find_unread_copies`) and their load markers, so that a
    server switched back to the old setting loads the table afresh.

    RocksDB is written under the lock its loaders take, so no server loads a table meanwhile.
    """
    in_redis = [c.name for c in copies if c.database == VOLATILE]
    if in_redis:
        from hps_core.tiers.redis_store import RedisClusterStore

        with RedisClusterStore(config.volatile_db) as redis:
            for name in in_redis:
                redis.evict(name)
                redis.evict(MARKER_PREFIX + name)
    in_rocks = [c.name for c in copies if c.database == PERSISTENT]
    if in_rocks:
        from hps_core.tiers.rocks_store import RocksStore

        persistent = dataclasses.replace(config.persistent_db, read_only=False)
        lock = Path(persistent.path) / LOAD_LOCK
        with file_lock(lock):
            try:
                with RocksStore(persistent) as rocks:
                    for name in in_rocks:
                        rocks.drop_table(name)
                        rocks.drop_table(MARKER_PREFIX + name)
                    rocks.flush()
            finally:
                lock.unlink(missing_ok=True)  # as the loaders leave it
