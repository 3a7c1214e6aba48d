"""Keys to embedding vectors for every table of one model, on one device.

On the host (CPU instances) each table is read from the shared host tier. On a GPU, with
``gpucache: true``, each table gets an embedding cache in front of the host tier: dynamic
(``gpucacheper`` of the rows, LRU) or static (the whole table). See
:mod:`hps_core.lookup.table_lookup` for the steps of one lookup.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hps_core.cache import make_cache
from hps_core.config import EmbeddingCacheType, ModelConfig, PSConfig, TableConfig
from hps_core.errors import RequestError
from hps_core.formats.sparse import KEY_DTYPE, KEY_FILE, META_FILE
from hps_core.lookup.devices import array_module
from hps_core.lookup.table_lookup import CachedTableLookup, HostTableLookup, TableCounters
from hps_core.tiers.factory import open_host_table

logger = logging.getLogger("hps_core")

TableLookup = HostTableLookup | CachedTableLookup


class ModelLookup:
    """Embedding lookup for one model of a ps.json, on the host or on one GPU.

    Tables are opened on first use, each at most once, so the first request pays for loading
    the tables it touches (HugeCTR's implicit initialisation).

    Args:
        config: the whole ps.json (the tiers are configured at its top level).
        model: the model to serve.
        device_id: CUDA device of the embedding caches, or ``None`` for host lookups.
        miss_policy: ``"fetch"`` or ``"default"`` (see :class:`CachedTableLookup`).
    """

    def __init__(
        self,
        config: PSConfig,
        model: ModelConfig,
        device_id: int | None = None,
        miss_policy: str = "fetch",
    ) -> None:
        self.config = config
        self.model = model
        self.device_id = device_id
        self.xp = array_module(device_id)
        self.miss_policy = miss_policy
        self._tables: list[TableLookup | None] = [None] * len(model.tables)
        self._lock = threading.Lock()

    @property
    def num_tables(self) -> int:
        """Number of embedding tables of the model."""
        return len(self.model.tables)

    @property
    def uses_cache(self) -> bool:
        """Whether lookups go through GPU embedding caches."""
        return self.device_id is not None and self.model.gpucache

    def table(self, table_id: int) -> TableLookup:
        """The lookup of table ``table_id``, opened on first use.

        Args:
            table_id: index of the table in ``sparse_files``.

        Returns:
            Its host or cached lookup.
        """
        if not 0 <= table_id < self.num_tables:
            raise RequestError(
                f"table_id {table_id} out of range: model '{self.model.name}' has "
                f"{self.num_tables} tables"
            )
        table = self._tables[table_id]
        if table is None:
            with self._lock:
                table = self._tables[table_id]
                if table is None:
                    table = self._open(self.model.tables[table_id])
                    self._tables[table_id] = table
        return table

    def _open(self, table: TableConfig) -> TableLookup:
        host = open_host_table(self.config, table)
        if not self.uses_cache:
            return HostTableLookup(host, self.xp)
        name = f"{self.model.name}.{table.name}@gpu{self.device_id}"
        with self.xp.cuda.Device(self.device_id):
            if self.model.embedding_cache_type == EmbeddingCacheType.STATIC:
                keys, values = host.contents()
                cache = make_cache(
                    "static", host.rows, table.dim, self.xp, name=name, contents=(keys, values)
                )
            else:
                capacity = math.ceil(self.model.gpucacheper * host.rows)
                cache = make_cache(
                    self.model.embedding_cache_type, capacity, table.dim, self.xp, name=name
                )
        return CachedTableLookup(
            host, cache, self.xp, self.model.hit_rate_threshold, self.miss_policy, name
        )

    def open_all(self) -> None:
        """Open every table now instead of on first use."""
        for table_id in range(self.num_tables):
            self.table(table_id)

    def lookup(self, table_id: int, keys: Any, out: Any = None) -> Any:
        """Embedding vectors of ``keys`` in table ``table_id``.

        Args:
            table_id: index of the table.
            keys: 1-D int64 keys (NumPy, or CuPy on a GPU session).
            out: optional float32 ``[n, dim]`` array of the session's module to write into.

        Returns:
            float32 ``[n, dim]`` (NumPy on the host, CuPy on a GPU); the table's default
            vector for unknown keys.
        """
        table = self.table(table_id)
        if self.device_id is None:
            return table.lookup(keys, out)
        with self.xp.cuda.Device(self.device_id):
            return table.lookup(keys, out)

    def lookup_tables(self, keys_per_table: Sequence[Any]) -> list[Any]:
        """Look up one key array per table.

        Args:
            keys_per_table: ``num_tables`` int64 arrays.

        Returns:
            One float32 ``[n_t, dim_t]`` array per table.
        """
        if len(keys_per_table) != self.num_tables:
            raise RequestError(
                f"got keys for {len(keys_per_table)} tables, model '{self.model.name}' has "
                f"{self.num_tables}"
            )
        return self.lookup_many(range(self.num_tables), keys_per_table)

    def lookup_many(self, table_ids: Sequence[int], keys: Sequence[Any]) -> list[Any]:
        """Look up several tables at once.

        On a GPU every table's cache query is launched before any is finished, so a model
        with many tables waits for the GPU once rather than once per table.

        Args:
            table_ids: the tables.
            keys: one int64 key array per entry of ``table_ids``.

        Returns:
            One float32 ``[n_i, dim_i]`` array per entry, as :meth:`lookup` returns.
        """
        tables = [self.table(t) for t in table_ids]
        if self.device_id is None:
            return [table.lookup(k) for table, k in zip(tables, keys, strict=True)]
        with self.xp.cuda.Device(self.device_id):
            started = [
                table.begin(k) if isinstance(table, CachedTableLookup) else table.lookup(k)
                for table, k in zip(tables, keys, strict=True)
            ]
            return [
                table.finish(p) if isinstance(table, CachedTableLookup) else p
                for table, p in zip(tables, started, strict=True)
            ]

    def counters(self) -> list[TableCounters]:
        """A snapshot of each table's counters (zeros for tables not opened yet)."""
        return [TableCounters() if table is None else table.snapshot() for table in self._tables]

    def initialize_caches(self, hot_keys: Mapping[int, np.ndarray] | None = None) -> None:
        """Fill the embedding caches before serving (HugeCTR's EC initialisation).

        Each table's cache receives its hottest keys: ``hot_keys[table_id]`` if given (keys,
        hottest first), else the ``meta`` file of the sparse folder if present (one hotness
        value per key, as HugeCTR writes it), else the keys in file order (HugeCTR's choice).

        Args:
            hot_keys: optional keys per table id, hottest first.
        """
        if not self.uses_cache:
            return
        logger.info(
            'EC initialization for model: "%s", num_tables: %d', self.model.name, self.num_tables
        )
        logger.info("EC initialization on device: %d", self.device_id)
        for table_id, table_config in enumerate(self.model.tables):
            table = self.table(table_id)
            if not isinstance(table, CachedTableLookup):
                continue
            keys, source = _warm_keys(table_config, (hot_keys or {}).get(table_id))
            with self.xp.cuda.Device(self.device_id):
                inserted = table.warm(keys)
            logger.info(
                "EC initialization: table %s: %d keys inserted (%s)",
                table_config.name,
                inserted,
                source,
            )

    def flush(self) -> None:
        """Wait for every table's background cache inserts."""
        for table in self._tables:
            if isinstance(table, CachedTableLookup):
                table.flush()

    def close(self) -> None:
        """Stop background work and detach from every opened table."""
        with self._lock:
            for table in self._tables:
                if table is not None:
                    table.close()
                    table.host.close()
            self._tables = [None] * self.num_tables


def _warm_keys(table: TableConfig, given: np.ndarray | None) -> tuple[np.ndarray, str]:
    if given is not None:
        return np.asarray(given, dtype=np.int64), "given hot keys"
    keys = np.fromfile(table.sparse_file / KEY_FILE, dtype=KEY_DTYPE)
    meta = table.sparse_file / META_FILE
    if meta.is_file() and meta.stat().st_size == keys.nbytes:
        hotness = np.fromfile(meta, dtype="<i8")
        return keys[np.argsort(-hotness, kind="stable")], "hottest first, from meta"
    return keys, "file order"
