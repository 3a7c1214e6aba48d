"""Keys to embedding vectors for every table of one model, on one device.

On the host (CPU instances) each table is read from the shared host tier
(:class:`~hps_core.lookup.table_lookup.HostTableLookup`). On a GPU, with ``gpucache: true``,
each table gets an embedding cache in front of the host tier: dynamic (``gpucacheper`` of
the rows, LRU) or static (the whole table), held by its
:class:`~hps_core.lookup.table_lookup.CachedTableLookup`; every GPU lookup is answered by the
GPU engine the lookup is given (:class:`~hps_core.infer.gpu.bank_lookup.BankLookup`: every
table of a call in one batch of the cache bank's kernels), with or without caches.

With ``share_caches``, the dynamic caches are shared with the other processes that serve
the same model on the same GPU (Triton instances of one server): see
:mod:`hps_core.cache.ipc_group`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from hps_core.arrays import array_module, module_of
from hps_core.cache import make_cache
from hps_core.cache.layout import cache_capacity_rows
from hps_core.config import EmbeddingCacheType, ModelConfig, PSConfig, TableConfig
from hps_core.errors import RequestError
from hps_core.formats.sparse import KEY_DTYPE, KEY_FILE, META_FILE, read_keys, read_sparse_table
from hps_core.lookup.table_lookup import (
    CachedTableLookup,
    HostTableLookup,
    TableCounters,
    lookup_together,
    together_positions,
)
from hps_core.nn.layers.embedding import Combiner, pool_embeddings, pool_gathered
from hps_core.tiers.factory import open_table_tiers
from hps_core.wording import plural

logger = logging.getLogger("hps_core")

TableLookup = HostTableLookup | CachedTableLookup


class LookupExtension(Protocol):
    """Something that looks keys up through a model lookup's tables by its own means."""

    def table_counters(self) -> Sequence[TableCounters]:
        """Its counters per table of the model (may be shorter, or empty)."""
        ...

    def close(self) -> None:
        """Release what it holds of the lookup's tables."""
        ...


@dataclass(frozen=True)
class TableQuery:
    """One table's part of a lookup.

    Args:
        table: the table's index in the model.
        keys: 1-D int64 keys, NumPy or CuPy (every query of a call on the same side).
        combiner: ``None``: a row per key; else how each bag's rows are pooled.
        hotness: keys per bag (pooled, without ``offsets``).
        offsets: CSR offsets of the bags (pooled): ``bags + 1`` integers from 0 to
            ``len(keys)``, rising, on the side of the keys.

    Example:
        >>> TableQuery(0, keys, Combiner.SUM, hotness=1024)  # doctest: +SKIP
    """

    table: int
    keys: Any
    combiner: Combiner | None = None
    hotness: int | None = None
    offsets: Any = None

    @property
    def bags(self) -> int:
        """Rows of the answer."""
        n = int(self.keys.shape[0])
        if self.combiner is None:
            return n
        if self.offsets is not None:
            return int(self.offsets.shape[0]) - 1
        return n // max(self.hotness or 1, 1)

    def key_room(self) -> int:
        """Keys per bag the batch makes room for (``bank_pool`` pools a bag of one key as a
        row copy, longer bags with more lanes): 1 unpooled, the hotness, or the average bag
        of CSR offsets rounded up to a power of two (so that calls share few shapes)."""
        if self.combiner is None:
            return 1
        if self.offsets is None:
            return max(int(self.hotness or 1), 1)
        average = -(-int(self.keys.shape[0]) // max(self.bags, 1))
        return 1 << max(0, average - 1).bit_length()


class GpuEngine(Protocol):
    """The GPU lookup engine a :class:`ModelLookup` on a GPU answers through
    (:class:`~hps_core.infer.gpu.bank_lookup.BankLookup`: every table's lookups in one batch
    of the cache bank's kernels, which :class:`~hps_core.hps.HPS` hands it)."""

    def lookup(self, queries: Sequence[TableQuery], outs: Sequence[Any] | None = None) -> list[Any]:
        """Answer ``queries`` (at most one per table), into ``outs`` where given."""
        ...

    def side_by_side(self, queries: Sequence[TableQuery]) -> bool:
        """Whether :meth:`lookup_side_by_side` answers ``queries``."""
        ...

    def lookup_side_by_side(self, queries: Sequence[TableQuery], out: Any) -> Any:
        """Answer ``queries`` into the columns of ``out``, in the order asked."""
        ...

    def table_counters(self) -> Sequence[TableCounters]:
        """Its counters per table of the model."""
        ...

    def close(self) -> None:
        """Release its device state."""
        ...


@dataclass(frozen=True)
class LookupOptions:
    """How a :class:`ModelLookup` serves, fixed when it is made (a serving instance's
    config.pbtxt parameters).

    Args:
        share_caches: share dynamic GPU caches with the processes of ``share_scope`` that
            serve this model on the same GPU, instead of holding a private copy.
        share_scope: who may share; by default the children of this process's parent (the
            stubs of one Triton server).

    Example:
        >>> LookupOptions(share_caches=True).share_scope is None
        True
    """

    share_caches: bool = False
    share_scope: str | None = None


DEFAULT_OPTIONS = LookupOptions()
"""Private GPU caches."""


class ModelLookup:
    """Embedding lookup for one model of a ps.json, on the host or on one GPU.

    Tables are opened on first use, each at most once, so the first request pays for loading
    the tables it touches (HugeCTR's implicit initialisation).

    Args:
        config: the whole ps.json (the tiers are configured at its top level).
        model: the model to serve.
        device_id: CUDA device of the embedding caches, or ``None`` for host lookups.
        options: how it serves (:class:`LookupOptions`).
        engine: makes the GPU lookup engine that answers this lookup's lookups on a GPU
            (:func:`hps_core.hps.gpu_engine`: a
            :class:`~hps_core.infer.gpu.bank_lookup.BankLookup`, made on first use); needed
            on a GPU, unused on the host.

    Raises:
        ValueError: a lookup on a GPU without its engine (a programming error: every maker
            of a GPU lookup hands it one).
    """

    def __init__(
        self,
        config: PSConfig,
        model: ModelConfig,
        device_id: int | None = None,
        options: LookupOptions = DEFAULT_OPTIONS,
        engine: Callable[[ModelLookup], GpuEngine] | None = None,
    ) -> None:
        if device_id is not None and engine is None:
            raise ValueError(
                f"model '{model.name}' on GPU {device_id}: a GPU lookup needs its engine "
                "(hps_core.hps.gpu_engine)"
            )
        self.config = config
        self.model = model
        self.device_id = device_id
        self.xp = array_module(device_id)
        self.options = options
        self._tables: list[TableLookup | None] = [None] * len(model.tables)
        self._lock = threading.Lock()
        self._group: Any = None
        self._group_tried = False
        self._extensions: list[LookupExtension] = []
        self._order: Any = None
        self._make_engine = engine
        self._engine: GpuEngine | None = None  # made on first use

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
                f"{plural(self.num_tables, 'table')}"
            )
        table = self._tables[table_id]
        if table is None:
            with self._lock:
                table = self._tables[table_id]
                if table is None:
                    table = self._open(table_id)
                    self._tables[table_id] = table
        return table

    @property
    def shares_caches(self) -> bool:
        """Whether the dynamic caches are shared with other processes (a group was joined)."""
        return self._group is not None

    def stream_order(self) -> Any:
        """The :class:`~hps_core.cache.order.StreamOrder` of this model's caches on its GPU
        (made on first use): work of other streams on the private caches waits for it."""
        with self._lock:
            if self._order is None:
                from hps_core.cache.order import StreamOrder

                self._order = StreamOrder(self.device_id)
            return self._order

    @property
    def cache_group(self) -> Any:
        """The :class:`~hps_core.cache.ipc_group.SharedCacheGroup` joined, or ``None``."""
        return self._group

    @property
    def lead(self) -> bool:
        """Whether this process warms and refreshes the caches: always, unless it joined a
        group that another process built."""
        return self._group is None or self._group.lead

    def _cache_group(self) -> Any:
        """The shared-cache group of this model and GPU, joined on first use; ``None`` when
        caches are private (not asked for, static, or sharing failed: logged)."""
        if self._group_tried:
            return self._group
        self._group_tried = True
        if not (self.options.share_caches and self.uses_cache):
            return None
        if self.model.embedding_cache_type != EmbeddingCacheType.DYNAMIC:
            return None
        from hps_core.cache.ipc_group import SharedCacheGroup, SharingError, group_name
        from hps_core.tiers.host_table import segment_name

        tables = [
            f"{segment_name(t.sparse_file, t.dim)}:{self.model.gpucacheper}"
            for t in self.model.tables
        ]
        scope = self.options.share_scope or f"ppid{os.getppid()}"
        bus_id = self.xp.cuda.Device(self.device_id).pci_bus_id
        name = group_name(scope, self.model.name, bus_id, tables)
        try:
            self._group = SharedCacheGroup(name, self.num_tables, self.device_id)
        except (SharingError, OSError) as exc:
            logger.warning(
                "model %s on GPU %d: caches not shared (%s); using private caches",
                self.model.name,
                self.device_id,
                exc,
            )
        else:
            logger.info(
                "model %s on GPU %d: caches shared with the other instances on this GPU (%s, %s)",
                self.model.name,
                self.device_id,
                name,
                "built here" if self._group.lead else "joined",
            )
        return self._group

    def _open(self, table_id: int) -> TableLookup:
        table = self.model.tables[table_id]
        # The shared tier alone, or the cascade to Redis/RocksDB when ps.json has them.
        host = open_table_tiers(self.config, self.model.name, table)
        if not self.uses_cache:
            return HostTableLookup(host, self.xp)
        name = f"{self.model.name}.{table.name}@gpu{self.device_id}"
        with self.xp.cuda.Device(self.device_id):
            if self.model.embedding_cache_type == EmbeddingCacheType.STATIC:
                if host.rows == host.table_rows:
                    keys, values = host.stored_contents()
                else:  # the shared tier holds part of the table: a static cache needs it all
                    keys, values = read_sparse_table(table.sparse_file, table.dim)
                    if not table.row_format.is_identity:
                        values = table.row_format.encode_stored(values)
                cache = make_cache(
                    "static",
                    len(keys),
                    table.dim,
                    self.xp,
                    name=name,
                    contents=(keys, values),
                    precision=table.storage,
                )
            else:
                # gpucacheper is a share of the whole table, not of its shared-memory part.
                capacity = cache_capacity_rows(self.model.gpucacheper, host.table_rows)
                cache = self._dynamic_cache(capacity, table, name)
        return CachedTableLookup(host, cache, self.xp, name=name)

    def _dynamic_cache(self, capacity: int, table: TableConfig, name: str) -> Any:
        group = self._cache_group()
        kind, dim, precision = self.model.embedding_cache_type, table.dim, table.storage
        if group is not None:
            from hps_core.cache.ipc_group import SharingError

            try:
                return make_cache(
                    kind, capacity, dim, self.xp, name=name, group=group,
                    group_index=table.index, precision=precision,
                )  # fmt: skip
            except SharingError as exc:
                logger.warning("%s: private cache: %s", name, exc)
        return make_cache(kind, capacity, dim, self.xp, name=name, precision=precision)

    def cache_section(self) -> Any:
        """Context for work on this model's caches from a thread other than the lookups':
        the shared group's section, else the stream order of the GPU pipeline (when one made
        it), else nothing (the cache's own lock orders calls)."""
        if self._group is not None:
            return self._group.section()
        if self._order is not None:
            return self._order.section()
        return contextlib.nullcontext()

    def update_cached_rows(
        self, table_id: int, keys: np.ndarray, values: np.ndarray, *, stored: bool = False
    ) -> None:
        """Overwrite the cached rows of ``keys`` in table ``table_id``'s cache (online updates).

        Keys the cache does not hold are ignored (a later miss reads the updated tiers). The
        work is ordered with the GPU pipeline's and the other instances' work on the caches
        (:meth:`cache_section`) on a stream of the calling thread, and waited for: when this
        returns, the next lookup launched anywhere reads the new rows.

        Args:
            table_id: index of the table.
            keys: int64 host keys ``[n]``.
            values: float32 host vectors ``[n, dim]``, quantised here into the table's
                storage precision (as the host tier quantises them), or with ``stored`` rows
                already stored so (a tier's own rows).
            stored: whether ``values`` are stored rows.
        """
        table = self._tables[table_id]
        if not isinstance(table, CachedTableLookup) or not len(keys):
            return
        fmt = self.model.tables[table_id].row_format
        if not stored and not fmt.is_identity:
            values = fmt.encode_stored(np.asarray(values, dtype=np.float32))
        if self.device_id is None:  # a NumPy cache (tests)
            with self.cache_section():
                table.cache.update(keys, values)
            return
        xp = self.xp
        with xp.cuda.Device(self.device_id):
            ordered = self._group is not None or self._order is not None
            # Ordered work goes on a stream of its own (the section makes it wait for the
            # others' work, and theirs for it); else the legacy default stream, which the
            # lookups without a pipeline use too, so the update never runs beside them.
            stream = _thread_update_stream() if ordered else xp.cuda.Stream.null
            with stream, self.cache_section():
                table.cache.update(xp.asarray(keys), xp.asarray(values))
            stream.synchronize()

    def open_all(self) -> None:
        """Open every table now instead of on first use."""
        for table_id in range(self.num_tables):
            self.table(table_id)

    def lookup(self, table_id: int, keys: Any, out: Any = None) -> Any:
        """Embedding vectors of ``keys`` in table ``table_id``.

        Args:
            table_id: index of the table.
            keys: 1-D int64 keys (NumPy, or CuPy on a GPU lookup).
            out: optional float32 ``[n, dim]`` array to write into: NumPy on the host, CuPy
                on a GPU.

        Returns:
            float32 ``[n, dim]`` (NumPy on the host, CuPy on a GPU); the table's default
            vector for unknown keys.
        """
        return self.lookup_pooled(table_id, keys, None, out=out)

    def lookup_pooled(
        self,
        table_id: int,
        keys: Any,
        combiner: Combiner | None,
        hotness: int | None = None,
        offsets: Any = None,
        out: Any = None,
    ) -> Any:
        """The rows of ``keys`` in table ``table_id``, a row per key or pooled per bag.

        On the host the host tier's rows of each distinct key are read once and pooled with
        NumPy; on a GPU the engine pools them (the cache bank's ``bank_pool``, each bag in
        registers).

        Args:
            table_id: index of the table.
            keys: 1-D int64 keys (NumPy, or CuPy on a GPU lookup).
            combiner: ``None`` for a row per key, else sum or mean of each bag's rows.
            hotness: keys per bag (pooled, without ``offsets``); ``len(keys)`` a multiple.
            offsets: CSR offsets of the bags: ``bags + 1`` integers rising from 0 to
                ``len(keys)`` (checked for host arrays), on the side of the keys.
            out: optional float32 ``[bags, dim]`` array to write into (CuPy on a GPU).

        Returns:
            float32 ``[bags, dim]`` (NumPy on the host, CuPy on a GPU); an empty bag pools to
            zeros, an unknown key reads the table's default vector.

        Raises:
            RequestError: a table id out of range, or keys, hotness or offsets that do not fit.
        """
        query = TableQuery(table_id, keys, combiner, hotness, offsets)
        return self.lookup_queries([query], [out])[0]

    def lookup_queries(
        self, queries: Sequence[TableQuery], outs: Sequence[Any] | None = None
    ) -> list[Any]:
        """Several tables' lookups in one call, each a row per key or pooled per bag: on a
        GPU one batch of the engine's kernels (a table asked twice is asked in turn), so a
        model of many tables waits for the GPU once.

        Args:
            queries: the lookups (:class:`TableQuery`), keys and offsets all on the side of
                this lookup (NumPy on the host, CuPy on a GPU).
            outs: per query, ``None`` or a float32 ``[bags, dim]`` array to write into.

        Returns:
            Per query, float32 ``[bags, dim]`` as :meth:`lookup_pooled` returns it.

        Raises:
            RequestError: a table id out of range, or keys, hotness or offsets that do not
                fit.
        """
        queries = [self.checked(q) for q in queries]
        outs = list(outs) if outs is not None else [None] * len(queries)
        if len(outs) != len(queries):
            raise RequestError(f"got {len(outs)} outputs for {plural(len(queries), 'query')}")
        if self.device_id is None:
            tables = [self.table(q.table) for q in queries]
            if all(isinstance(t, HostTableLookup) and t.xp is np for t in tables):
                # Tables asked for few keys are read together, in one pass (a model of many
                # small tables: one call instead of one per table); each distinct key's row
                # is read once.
                keys = [np.asarray(q.keys) for q in queries]
                found = self._on_host(tables, keys, lambda t, k: t.lookup_distinct(k), True)
                return [
                    _pooled_rows(rows, index, q, o)
                    for (rows, index), q, o in zip(found, queries, outs, strict=True)
                ]
            return [
                _pooled_on_host(t, q.keys, q.combiner, q.hotness, q.offsets, o)
                for t, q, o in zip(tables, queries, outs, strict=True)
            ]
        with self.xp.cuda.Device(self.device_id):
            engine = self._gpu_engine()
            if len({q.table for q in queries}) == len(queries):
                return engine.lookup(queries, outs)
            return [engine.lookup([q], [o])[0] for q, o in zip(queries, outs, strict=True)]

    def lookup_side_by_side(self, queries: Sequence[TableQuery], out: Any = None) -> Any:
        """Several tables' answers side by side in one array, in the order asked: what
        concatenating :meth:`lookup_queries`' answers along their columns gives (an
        ``EmbeddingBagCollection``'s ``KeyedTensor``, a dense network's input). On a GPU
        whose engine can (rising tables, widths multiples of 4), ``bank_pool`` writes every
        answer into its columns itself; else each answer is copied there.

        Args:
            queries: the lookups, every one of the same bags.
            out: optional float32 C-contiguous ``[bags, sum of widths]`` array (CuPy on a
                GPU) to write into.

        Returns:
            float32 ``[bags, sum of widths]`` (NumPy on the host, CuPy on a GPU).

        Raises:
            RequestError: queries of different bags, an ``out`` that does not fit, or what
                :meth:`lookup_queries` refuses.
        """
        queries = [self.checked(q) for q in queries]
        bags = sorted({q.bags for q in queries})
        if len(bags) > 1:
            raise RequestError(f"side by side: every query needs the same bags, got {bags}")
        rows = bags[0] if bags else 0
        widths = [self.model.tables[q.table].dim for q in queries]
        if self.device_id is not None:
            with self.xp.cuda.Device(self.device_id):
                engine = self._gpu_engine()
                if engine.side_by_side(queries):
                    if out is None:
                        out = self.xp.empty((rows, sum(widths)), dtype=self.xp.float32)
                    return engine.lookup_side_by_side(queries, out)
        answers = self.lookup_queries(queries)
        xp = self.xp
        shape = (rows, sum(widths))
        if out is None:
            out = xp.empty(shape, dtype=xp.float32)
        elif module_of(out) is not xp or out.dtype != xp.float32 or tuple(out.shape) != shape:
            got = f"{getattr(out, 'dtype', type(out).__name__)} {list(getattr(out, 'shape', []))}"
            raise RequestError(f"out must be float32 {list(shape)}, got {got}")
        column = 0
        for answer, width in zip(answers, widths, strict=True):
            out[:, column : column + width] = answer
            column += width
        return out

    def checked(self, query: TableQuery) -> TableQuery:
        """``query`` once its table exists and its bags fit its keys (host offsets as int64).

        Args:
            query: a lookup of this model.

        Returns:
            The query, its host offsets as checked int64.

        Raises:
            RequestError: a table id out of range, or keys, hotness or offsets that do not
                fit.
        """
        self.table(query.table)  # rejects a table id out of range
        n = int(query.keys.shape[0])
        if query.combiner is None or query.offsets is not None:
            if query.offsets is not None and module_of(query.offsets) is np:
                offsets = checked_offsets(np.asarray(query.offsets), n)
                return dataclasses.replace(query, offsets=offsets)
            return query
        hotness = query.hotness or 0
        if hotness < 1:
            raise RequestError("a pooled lookup needs offsets or a hotness of at least 1")
        if n % hotness:
            raise RequestError(f"{n} keys do not fill bags of {hotness} (hotness {hotness})")
        return query

    def _gpu_engine(self) -> GpuEngine:
        """The GPU lookup engine given to this lookup, made on first use (closed with this
        lookup; its lookups count in :meth:`counters`)."""
        assert self._make_engine is not None  # a GPU lookup is made with its engine
        with self._lock:
            if self._engine is None:
                self._engine = self._make_engine(self)
                self._extensions.append(self._engine)
            return self._engine

    def lookup_tables(self, keys_per_table: Sequence[Any]) -> list[Any]:
        """Look up one key array per table.

        Args:
            keys_per_table: ``num_tables`` int64 arrays.

        Returns:
            One float32 ``[n_t, dim_t]`` array per table.
        """
        if len(keys_per_table) != self.num_tables:
            raise RequestError(
                f"got keys for {plural(len(keys_per_table), 'table')}, model "
                f"'{self.model.name}' has {self.num_tables}"
            )
        return self.lookup_many(range(self.num_tables), keys_per_table)

    def lookup_many(self, table_ids: Sequence[int], keys: Sequence[Any]) -> list[Any]:
        """Look up several tables at once.

        On a GPU every table is looked up in one batch of the engine's kernels, so a model
        with many tables waits for the GPU once rather than once per table.

        Args:
            table_ids: the tables.
            keys: one int64 key array per entry of ``table_ids``.

        Returns:
            One float32 ``[n_i, dim_i]`` array per entry, as :meth:`lookup` returns.
        """
        tables = [self.table(t) for t in table_ids]
        if self.device_id is None:
            return self._on_host(tables, keys, lambda table, k: table.lookup(k))
        with self.xp.cuda.Device(self.device_id):
            queries = [TableQuery(t, k) for t, k in zip(table_ids, keys, strict=True)]
            return self._gpu_engine().lookup(queries)

    def lookup_rows_many(
        self, table_ids: Sequence[int], keys: Sequence[Any]
    ) -> list[tuple[Any, np.ndarray | None]]:
        """Look up several tables at once, each distinct key's row once where the tables are
        read on the host (:meth:`HostTableLookup.lookup_distinct`): for pooling straight from
        those rows.

        Args:
            table_ids: the tables.
            keys: one int64 key array per entry of ``table_ids``.

        Returns:
            One ``(rows, index)`` per entry: ``rows[index]`` is what :meth:`lookup_many`
            returns for it; ``index`` None where ``rows`` holds a row per key (on a GPU, or a
            few keys).
        """
        tables = [self.table(t) for t in table_ids]
        if self.device_id is None and all(
            isinstance(t, HostTableLookup) and t.xp is np for t in tables
        ):
            return self._on_host(tables, keys, lambda table, k: table.lookup_distinct(k), True)
        return [(rows, None) for rows in self.lookup_many(table_ids, keys)]

    @staticmethod
    def _on_host(
        tables: Sequence[TableLookup],
        keys: Sequence[Any],
        alone: Callable[[Any, Any], Any],
        pairs: bool = False,
    ) -> list[Any]:
        """Host lookups of several tables: those of a few keys together (see
        :func:`~hps_core.lookup.table_lookup.lookup_together`), each other one by
        ``alone(table, keys)``; a row per key as ``(rows, None)`` when ``pairs``."""
        found: list[Any] = [None] * len(tables)
        picked = together_positions(tables, keys)
        if picked:
            together = lookup_together([tables[i] for i in picked], [keys[i] for i in picked])
            for i, rows in zip(picked, together, strict=True):
                found[i] = (rows, None) if pairs else rows
        for i, (table, k) in enumerate(zip(tables, keys, strict=True)):
            if found[i] is None:
                found[i] = alone(table, k)
        return found

    def attach(self, extension: LookupExtension) -> None:
        """Count ``extension``'s lookups with this lookup's and close it before the tables.

        Args:
            extension: e.g. a GPU pipeline that reads this lookup's caches and host tiers.
        """
        with self._lock:
            self._extensions.append(extension)

    def counters(self) -> list[TableCounters]:
        """A snapshot of each table's counters (zeros for tables not opened yet), lookups of
        attached extensions included."""
        counters = [TableCounters() if t is None else t.snapshot() for t in self._tables]
        for extension in list(self._extensions):
            for t, extra in enumerate(extension.table_counters()):
                counters[t] = counters[t] + extra
        return counters

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
        if not self.lead:
            logger.info(
                'EC initialization for model: "%s" on device %d: caches shared with the '
                "instance that fills them; skipped here",
                self.model.name,
                self.device_id,
            )
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
        """Wait for every table's background tier writes."""
        for table in self._tables:
            if table is not None and table.host.has_lower_tiers:
                table.host.flush()  # rows being written to Redis (cache_missed_embeddings)

    def close(self) -> None:
        """Stop background work and detach from every opened table."""
        with self._lock:
            for extension in self._extensions:
                extension.close()
            self._extensions = []
            self._engine = None
            for table in self._tables:
                if table is not None:
                    table.close()
                    table.host.close()
            self._tables = [None] * self.num_tables
            if self._group is not None:
                self._group.close()
                self._group = None
            self._group_tried = False


_update_streams = threading.local()


def _thread_update_stream() -> Any:
    """A non-blocking CUDA stream of the calling thread on the current device (made once)."""
    import cupy

    device = cupy.cuda.Device().id
    streams = getattr(_update_streams, "by_device", None)
    if streams is None:
        streams = _update_streams.by_device = {}
    if device not in streams:
        streams[device] = cupy.cuda.Stream(non_blocking=True)
    return streams[device]


def _warm_keys(table: TableConfig, given: np.ndarray | None) -> tuple[np.ndarray, str]:
    if given is not None:
        return np.asarray(given, dtype=np.int64), "given hot keys"
    folder = table.sparse_file
    keys = read_keys(folder, (folder / KEY_FILE).stat().st_size // KEY_DTYPE.itemsize)
    meta = folder / META_FILE
    if meta.is_file() and meta.stat().st_size == keys.nbytes:
        hotness = np.frombuffer(meta.read_bytes(), dtype="<i8")
        return keys[np.argsort(-hotness, kind="stable")], "hottest first, from meta"
    return keys, "file order"


def check_out(out: Any, bags: int, dim: int, device_id: int) -> None:
    """Refuse an output array that does not fit a GPU query's answer.

    Args:
        out: the caller's array, to be a C-contiguous float32 CuPy ``[bags, dim]``.
        bags: the query's bags (its keys, unpooled).
        dim: its table's width.
        device_id: the GPU of the lookup.

    Raises:
        RequestError: naming the shape wanted and the array given, or its GPU.
    """
    import cupy

    shape = (bags, dim)
    if (
        not isinstance(out, cupy.ndarray)
        or out.dtype != cupy.float32
        or tuple(out.shape) != shape
        or not out.flags.c_contiguous
    ):
        got = f"{getattr(out, 'dtype', type(out).__name__)} {list(getattr(out, 'shape', []))}"
        raise RequestError(f"out must be C-contiguous float32 {list(shape)}, got {got}")
    if out.device.id != device_id:
        raise RequestError(f"out is on GPU {out.device.id}, the lookup on {device_id}")


def checked_offsets(offsets: np.ndarray, keys: int) -> np.ndarray:
    """CSR bag offsets of a pooled lookup, checked: 1-D integers rising from 0 to ``keys``.

    Args:
        offsets: the caller's offsets (host).
        keys: the number of keys they cut into bags.

    Returns:
        The offsets as int64.

    Raises:
        RequestError: naming what is wrong and where.
    """
    if offsets.ndim != 1 or offsets.shape[0] < 1 or offsets.dtype.kind not in "iu":
        raise RequestError(
            f"offsets must be 1-D integers, one more than the bags, got {offsets.dtype} "
            f"{list(offsets.shape)}"
        )
    offsets = offsets.astype(np.int64, copy=False)
    if int(offsets[0]) != 0 or int(offsets[-1]) != keys:
        raise RequestError(
            f"offsets must rise from 0 to the number of keys ({keys}), got "
            f"{int(offsets[0])} .. {int(offsets[-1])}"
        )
    falls = np.flatnonzero(offsets[1:] < offsets[:-1])
    if len(falls):
        at = int(falls[0])
        raise RequestError(
            f"offsets must not fall: offsets[{at + 1}] = {int(offsets[at + 1])} is below "
            f"offsets[{at}] = {int(offsets[at])}"
        )
    return offsets


def _pooled_on_host(
    table: Any,
    keys: Any,
    combiner: Combiner | None,
    hotness: int | None,
    offsets: np.ndarray | None,
    out: np.ndarray | None,
) -> np.ndarray:
    """:meth:`ModelLookup.lookup_pooled` on the host tier: each distinct key's row read once,
    then pooled (:func:`~hps_core.nn.layers.embedding.pool_gathered` for a fixed hotness)."""
    if combiner is None:
        return table.lookup(keys, out)
    rows, index = table.lookup_distinct(np.asarray(keys))
    return _pooled_rows(rows, index, TableQuery(0, keys, combiner, hotness, offsets), out)


def _pooled_rows(
    rows: np.ndarray, index: np.ndarray | None, query: TableQuery, out: np.ndarray | None
) -> np.ndarray:
    """A host query's answer from its keys' rows: ``rows[index]`` is a row per key (``rows``
    itself where ``index`` is None), pooled as the query asks."""
    if query.combiner is None:
        pooled = rows if index is None else rows[index]
    elif query.offsets is None:
        pooled = pool_gathered(rows, index, query.hotness)
        if query.combiner is Combiner.MEAN:
            pooled /= np.float32(query.hotness)
    else:
        values = rows if index is None else rows[index]
        pooled = pool_embeddings(np, values, query.offsets, 1, query.combiner)
        pooled = pooled.reshape(-1, rows.shape[1])
    if out is None:
        return pooled
    np.copyto(out, pooled)
    return out
