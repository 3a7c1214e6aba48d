"""The device state of every table of one model on one GPU, described to the kernels at once.

A :class:`CacheBank` gathers, per table the dense network uses: its dynamic cache's slots (the
caches :class:`~hps_core.lookup.ModelLookup` made, shared with other processes or not), or its
static table, the row index of its host tier copied to the GPU (8 bytes per row of sorted
hashes plus the bucket directory, so misses are found without a host round trip), the address
of its host-tier rows mapped for zero-copy reads (:mod:`hps_core.infer.gpu.host_mapping`), insert
locks, and device counters. For each table with a dynamic cache it also holds the room a
batch's misses take on the GPU (:meth:`CacheBank.reserve_misses`): staging rows, where each
missed row is copied once per batch, and the miss set that deduplicates the batch's missed
keys. :meth:`CacheBank.descriptor_rows` turns all that, plus where each table's keys and
outputs sit in a batch, into the ``Table`` array ``kernels/bank.cu`` reads.

Per-table Python runs here, once, at load time; a batch is then three kernel launches for all
tables (``bank_find``, ``bank_pool``, ``bank_insert``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cupy
import numpy as np

from hps_core.cache.cupy_cache import CupyDynamicCache
from hps_core.cache.kernel_consts import storage_code
from hps_core.cache.layout import EMPTY_KEY, WAYS
from hps_core.cache.order import StreamOrder
from hps_core.cache.static_table import StaticTable
from hps_core.cache.stats import (
    EVICTIONS,
    HITS,
    HOST_ROWS,
    INSERTS,
    KEYS,
    MISSES,
    NUM_COUNTERS,
    UNKNOWN,
)
from hps_core.cuda.structs import TABLE_DTYPE
from hps_core.infer.gpu.host_mapping import map_host_table, unmap_host_table
from hps_core.infer.gpu.placement import TablePlacement
from hps_core.lookup.model_lookup import ModelLookup
from hps_core.lookup.table_lookup import CachedTableLookup, TableCounters
from hps_core.quant import RowFormat


@dataclass
class _TableState:
    cache: CupyDynamicCache | None
    static: StaticTable | None
    host: Any
    index: tuple[Any, Any, Any] | None  # host index on the GPU: (hashes, starts, positions)
    values_ptr: int  # device-visible address of the rows the index points into
    host_values: bool
    locks: Any
    bucket_bits: int
    default_value: float
    dim: int
    lower: bool  # the table has tiers below its host tier
    row_format: RowFormat | None = None  # how the table's rows are stored, in every tier
    staging: Any = None  # [staging_rows, row_words] stored rows: GPU copies of missed rows
    miss_keys: Any = None  # the miss set's keys (a power of two of them), EMPTY_KEY when free
    miss_rows: Any = None  # per entry of the miss set: the row its key's lookups read


def _power_of_two(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


class CacheBank:
    """Device state of a model's tables on one GPU, for the batch kernels.

    Args:
        lookup: the model's lookup on that GPU; every table is opened.
        tables: the tables to serve, in the order of their descriptors.

    Raises:
        NotAvailableError: a host tier cannot be mapped for GPU access.
    """

    def __init__(self, lookup: ModelLookup, tables: Sequence[int]) -> None:
        if lookup.device_id is None:
            raise ValueError("a cache bank needs a model lookup on a GPU")
        self.lookup = lookup
        self.device_id = lookup.device_id
        self.tables = tuple(tables)
        lookup.open_all()
        self._states: list[_TableState] = []
        with cupy.cuda.Device(self.device_id):
            self.order: StreamOrder = lookup.stream_order()
            # Warm-up and earlier lookups ran on other streams: let them finish first.
            cupy.cuda.Device(self.device_id).synchronize()
            try:
                for t in self.tables:
                    self._states.append(self._open(t))
            except BaseException:
                self.close()
                raise
            self.counters = cupy.zeros((len(self.tables), NUM_COUNTERS), dtype=cupy.uint64)
        self.batches = 0

    def _open(self, t: int) -> _TableState:
        table = self.lookup.table(t)
        host = table.host
        cache = static = None
        if isinstance(table, CachedTableLookup):
            if isinstance(table.cache, StaticTable):
                static = table.cache
            else:
                cache = table.cache
                if not cache.shared:
                    cache.order = self.order
        locks = cupy.zeros(2 * cache.num_sets if cache is not None else 1, dtype=cupy.int32)
        lower = bool(getattr(host, "has_lower_tiers", False))
        fmt = host.row_format
        if static is not None:
            return _TableState(
                None, static, host, None, static.values_ptr, False, locks,
                static.bucket_bits, float(host.default_value), host.dim, lower, fmt,
            )  # fmt: skip
        index = tuple(cupy.asarray(part) for part in host.index_arrays())
        values_ptr = map_host_table(host, self.device_id)
        return _TableState(
            cache, None, host, index, values_ptr, True, locks, host.layout.bucket_bits,
            float(host.default_value), host.dim, lower, fmt,
        )  # fmt: skip

    @property
    def lower(self) -> tuple[bool, ...]:
        """Per served table: whether it has tiers below its host tier (Redis, RocksDB)."""
        return tuple(state.lower for state in self._states)

    def lower_may_answer(self) -> bool:
        """Whether any served table's lower tiers may hold a row now (see
        :meth:`~hps_core.tiers.cascade.TieredTable.lower_may_answer`): a few Python calls, no
        GPU work. A model whose only lower tier is an empty update overlay answers False."""
        return any(state.lower and state.host.lower_may_answer() for state in self._states)

    def lookup_lower(self, position: int, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows of ``keys`` from the tiers below the host tier of the bank's table ``position``,
        stored in the table's precision (what its cache and kernels hold).

        Args:
            position: the table's index in :attr:`tables`.
            keys: unique int64 keys its cache and host tier lack.

        Returns:
            Stored rows ``[n, row_words]`` (float32 ``[n, dim]`` for fp32) and the bool mask
            of the keys found.
        """
        return self._states[position].host.lookup_lower_stored(keys)

    @property
    def shared(self) -> bool:
        """Whether the dynamic caches are shared with other processes."""
        return self.lookup.shares_caches

    def section(self) -> contextlib.AbstractContextManager[Any]:
        """Context for launching work on the caches: after (and before) every other stream's
        and, for shared caches, every other process's work on them."""
        group = self.lookup.cache_group
        return group.section() if group is not None else self.order.section()

    def reserve_misses(self, placements: Sequence[TablePlacement], samples: int) -> int:
        """Make the GPU room for the misses of batches of up to ``samples`` samples: per table
        with a dynamic cache, staging rows for as many distinct missed keys as a batch can
        have, but no more than the cache holds (misses beyond those are read in place and not
        cached: inserting more rows than the cache has would only evict each other), and a miss
        set of at least twice as many entries. Call before :meth:`descriptor_rows`.

        Args:
            placements: where each table's keys sit in a batch (``keys_cap``: keys per sample).
            samples: the most samples of a batch.

        Returns:
            The entries of the batch's miss list that ``bank_find`` may fill (every claimed
            entry of every miss set), for sizing it.
        """
        entries = 0
        with cupy.cuda.Device(self.device_id):
            for place, state in zip(placements, self._states, strict=True):
                if state.cache is None:
                    continue
                want = min(state.cache.num_sets * WAYS, samples * place.keys_cap)
                if state.staging is None or state.staging.shape[0] < want:
                    fmt = state.row_format
                    state.staging = cupy.empty(
                        (max(want, 1), fmt.row_words), dtype=fmt.stored_dtype
                    )
                    slots = _power_of_two(2 * max(want, 1))
                    state.miss_keys = cupy.full(slots, EMPTY_KEY, dtype=cupy.int64)
                    state.miss_rows = cupy.zeros(slots, dtype=cupy.uint64)
                entries += state.miss_keys.shape[0]
        return entries

    def staging_pointers(self) -> tuple[int, ...]:
        """Where each table's staging rows are (0: none yet): descriptors made before
        :meth:`reserve_misses` grew them point at freed memory, and must be made again."""
        return tuple(0 if s.staging is None else s.staging.data.ptr for s in self._states)

    def descriptor_rows(self, placements: Sequence[TablePlacement]) -> np.ndarray:
        """The ``Table`` array of ``kernels/bank.cu`` for ``placements`` (one per table, in
        the bank's order), on the host: copy it to the GPU as bytes.

        Args:
            placements: where each table's keys and outputs sit in a batch.

        Returns:
            A NumPy ``TABLE_DTYPE`` array (``extra_*`` fields zero: no lower-tier rows yet).
        """
        rows = np.zeros(len(placements), dtype=TABLE_DTYPE)
        for row, place, state in zip(rows, placements, self._states, strict=True):
            if state.cache is not None:
                row["cache_keys"] = state.cache._keys.data.ptr
                row["cache_stamps"] = state.cache._stamps.data.ptr
                row["cache_values"] = state.cache._values.data.ptr
                row["cache_sets"] = state.cache.num_sets
            if state.staging is not None:
                row["staging"] = state.staging.data.ptr
                row["staging_rows"] = state.staging.shape[0]
                row["miss_keys"] = state.miss_keys.data.ptr
                row["miss_rows"] = state.miss_rows.data.ptr
                row["miss_slots"] = state.miss_keys.shape[0]
            if state.static is not None:
                hashes, starts = state.static.index_arrays()  # rows in index order
            else:
                hashes, starts, positions = state.index  # rows in the files' order
                row["index_positions"] = positions.data.ptr
            row["index_hashes"] = hashes.data.ptr
            row["index_starts"] = starts.data.ptr
            row["starts64"] = int(starts.dtype.itemsize == 8)
            row["values"] = state.values_ptr
            row["locks"] = state.locks.data.ptr
            row["host_values"] = int(state.host_values)
            row["bucket_bits"] = state.bucket_bits
            row["default_value"] = state.default_value
            row["dim"] = state.dim
            row["row_words"] = state.row_format.row_words
            row["storage"] = storage_code(state.row_format.precision)
            row["lower"] = int(state.lower)
            for name in ("slot_num", "combiner", "keys_at", "offsets_at", "out_at", "keys_cap"):
                row[name] = getattr(place, name)
            row["out_shift"] = place.out_shift
            row["out_stride"] = place.out_stride
        return rows

    def table_counters(self) -> list[TableCounters]:
        """The device counters per model table (zeros for tables the bank does not serve):
        keys, hits, misses and unknown keys per key occurrence, as :class:`TableCounters`
        counts them on every path; one device-to-host copy, after the work already launched
        on the caches (a batch's insert may still run after its scores are back)."""
        with cupy.cuda.Device(self.device_id), self.section():
            values = self.counters.get()
        out = [TableCounters() for _ in range(self.lookup.num_tables)]
        for row, t in zip(values.tolist(), self.tables, strict=True):
            out[t] = TableCounters(
                lookups=self.batches,
                keys=int(row[KEYS]),
                cache_hits=int(row[HITS]),
                cache_misses=int(row[MISSES]),
                unknown_keys=int(row[UNKNOWN]),
                inserted_keys=int(row[INSERTS]),
                evictions=int(row[EVICTIONS]),
                host_rows=int(row[HOST_ROWS]),
            )
        return out

    def close(self) -> None:
        """Release the host mappings (before the host tables close)."""
        for state in self._states:
            if state.host_values:
                unmap_host_table(state.host)
            if state.cache is not None and state.cache.order is self.order:
                state.cache.order = None
        self._states = []
