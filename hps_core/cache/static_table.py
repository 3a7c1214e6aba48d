"""Static embedding cache: a whole table held in (GPU) memory, in a hash table.

HugeCTR's ``static_table`` puts every row of a table into an open-addressing GPU hash table
(``StaticHashTable``: 4-slot tiles, MurmurHash3, a spare slot for the empty key) and never
evicts. Here the table uses the host tier's layout (:mod:`hps_core.tiers.hash_layout`): the
mixed keys sorted, a bucket directory on their top bits, and the rows in the same order, so
a lookup reads a bucket of 2-4 hashes and then the row. Any int64 key is served (no reserved
value). On CuPy a query is one kernel (probe and row copy, ``static_query``); on NumPy it is
:func:`~hps_core.tiers.hash_layout.find_rows`, the same function. The rows are kept as the
table stores them (:mod:`hps_core.quant`: FP32, or FP16/int8/FP8 as HugeCTR's ``fp8_quant``
keeps its static tables) and decoded in the query.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from hps_core.cache.arrays import as_keys, as_stored, output_rows
from hps_core.cache.kernel_consts import LANES, THREADS, storage_code
from hps_core.cache.layout import last_of_each
from hps_core.cache.stats import (
    HITS,
    MISSES,
    NUM_COUNTERS,
    UPDATED,
    CacheStats,
    stats_from_counters,
)
from hps_core.quant import RowFormat, StoragePrecision
from hps_core.tiers.hash_layout import (
    DuplicateKeysError,
    HashLayout,
    fill_directory,
    find_rows,
    sort_order,
)

STARTS_DTYPE = np.dtype(np.int64)
"""The bucket directory's type on the table's device (int64 whatever the row count)."""


def static_table_nbytes(
    rows: int, dim: int, precision: StoragePrecision = StoragePrecision.FP32
) -> int:
    """Bytes a static table of ``rows`` x ``dim`` holds on its device (:attr:`StaticTable.nbytes`).

    The sorted hashes with one padding entry (8 bytes each), the bucket directory of
    :class:`~hps_core.tiers.hash_layout.HashLayout` in :data:`STARTS_DTYPE`, and the rows
    stored in ``precision``; the few counters are not counted.

    Example:
        >>> static_table_nbytes(10, 4)  # 11 hashes, 5 int64 starts, 10 rows of 4 floats
        288
        >>> static_table_nbytes(10, 4, StoragePrecision.INT8)  # rows of 4 codes, scale, bias
        248
    """
    num_buckets = HashLayout(rows, dim).num_buckets
    row_bytes = RowFormat(precision, dim).row_bytes
    return 8 * (rows + 1) + STARTS_DTYPE.itemsize * (num_buckets + 1) + row_bytes * rows


class StaticTable:
    """A complete embedding table; queries never insert or evict.

    Args:
        keys: 1-D integer keys, unique.
        values: float ``[len(keys), dim]`` rows, or for a compressed ``row_format`` the
            stored rows (:meth:`~hps_core.quant.RowFormat.encode_stored`, ``[len(keys),
            row_words]``), which the table keeps as they are and decodes in each query.
        xp: array module to hold the table in (``numpy`` or ``cupy``).
        name: label used in error messages.
        row_format: how the rows are stored; by default fp32 of the values' width.

    Raises:
        ValueError: values are not 2-D with a positive width, shapes disagree, or a key repeats.
        TypeError: keys are not integers or values not floating point.

    Example:
        >>> table = StaticTable(np.array([3, -1]), np.eye(2, dtype=np.float32))
        >>> table.query(np.array([-1, 5]))
        (array([[0., 1.],
               [0., 0.]], dtype=float32), array([ True, False]))
    """

    def __init__(
        self,
        keys: Any,
        values: Any,
        *,
        xp: Any = np,
        name: str = "static table",
        row_format: RowFormat | None = None,
    ) -> None:
        self.name = name
        self.xp = xp
        self._where = f"static table {name!r}"
        # The layout is built on the host (one sort), then copied to the table's device.
        host_keys = as_keys(keys.get() if hasattr(keys, "get") else keys, np, self._where)
        shape = tuple(xp.asarray(values).shape)
        if len(shape) != 2 or shape[1] < 1:
            raise ValueError(f"{self._where}: values must be 2-D [rows, dim], got shape {shape}")
        if row_format is None:
            row_format = RowFormat(StoragePrecision.FP32, int(shape[1]))
        self.row_format = row_format
        self._dim = row_format.dim
        self._rows = int(host_keys.shape[0])
        rows = as_stored(values, self._rows, row_format, xp, self._where)
        try:
            order, sorted_hashes = sort_order(host_keys)
        except DuplicateKeysError as exc:
            raise ValueError(
                f"{self._where}: key {int(exc.duplicates[0])} appears more than once"
            ) from None
        self._layout = HashLayout(self._rows, self._dim, row_format.precision)
        hashes = np.zeros(self._rows + 1, dtype=np.uint64)  # one padding entry, as the layout
        hashes[: self._rows] = sorted_hashes
        starts = np.empty(self._layout.num_buckets + 1, dtype=STARTS_DTYPE)
        fill_directory(self._layout, sorted_hashes, starts)
        self._hashes = xp.asarray(hashes)
        self._starts = xp.asarray(starts)
        self._values = rows[xp.asarray(order)]
        self._counters = xp.zeros(NUM_COUNTERS, dtype=xp.int64)
        self._lock = threading.Lock()
        self._kernels = None
        if xp is not np:
            from hps_core.cache.cupy_cache import load_kernels

            self._kernels = load_kernels(xp.cuda.Device().id)

    @property
    def dim(self) -> int:
        """Embedding width."""
        return self._dim

    @property
    def size(self) -> int:
        """Number of rows."""
        return self._rows

    @property
    def nbytes(self) -> int:
        """Bytes of the table's arrays on its device (:func:`static_table_nbytes`)."""
        return int(self._hashes.nbytes + self._starts.nbytes + self._values.nbytes)

    @property
    def bucket_bits(self) -> int:
        """log2 of the number of buckets of the row index."""
        return self._layout.bucket_bits

    @property
    def values_ptr(self) -> int:
        """Device address of the rows (CuPy tables only), in index order."""
        return int(self._values.data.ptr)

    def index_arrays(self) -> tuple[Any, Any]:
        """The row index: sorted hashes (one padding entry) and the bucket directory."""
        return self._hashes, self._starts

    def _find(self, keys: Any) -> Any:
        """Row of each key in the table, or -1."""
        xp = self.xp
        if self._kernels is None:
            return find_rows(self._layout, self._hashes, self._starts, keys)
        n = int(keys.shape[0])
        rows = xp.empty(n, dtype=xp.int64)
        if n:
            self._kernels["static_find"](
                (-(-n // THREADS),),
                (THREADS,),
                (keys, np.int64(n), self._hashes, self._starts,
                 np.int32(self._layout.bucket_bits), rows),
            )  # fmt: skip
        return rows

    def query(self, keys: Any, out: Any = None) -> tuple[Any, Any]:
        """Look keys up.

        Args:
            keys: 1-D integer keys (duplicates allowed).
            out: optional float32 ``[n, dim]`` array of the table's module; miss rows are not
                written.

        Returns:
            ``(values, hit_mask)``: ``out`` (or a new zero-filled array) and bool ``[n]``.
        """
        xp = self.xp
        keys = as_keys(keys, xp, self._where)
        n = int(keys.shape[0])
        out = output_rows(out, n, self._dim, xp, self._where)
        with self._lock:
            if self._kernels is None:
                found = self._find(keys)
                hit = found >= 0
                positions = np.flatnonzero(hit)
                hit_rows = self._values[found[positions]]
                if not self.row_format.is_identity:
                    hit_rows = self.row_format.decode_stored(hit_rows)
                out[positions] = hit_rows
                self._counters[HITS] += positions.shape[0]
                self._counters[MISSES] += n - positions.shape[0]
                return out, hit
            hit = xp.empty(n, dtype=bool)
            if n:
                vectorized = (
                    self._dim % 4 == 0
                    and out.data.ptr % 16 == 0
                    and self._values.data.ptr % 16 == 0
                )
                blocks = -(-n * LANES // THREADS)
                self._kernels["static_query"](
                    (blocks,),
                    (THREADS,),
                    (keys, np.int64(n), self._hashes, self._starts,
                     np.int32(self._layout.bucket_bits), self._values, np.int32(self._dim),
                     np.int32(self.row_format.row_words),
                     np.int32(storage_code(self.row_format.precision)),
                     out, hit, self._counters, vectorized),
                )  # fmt: skip
        return out, hit

    def update(self, keys: Any, values: Any) -> None:
        """Overwrite rows of keys in the table; ignore other keys; the last duplicate wins.

        Args:
            keys: 1-D integer keys.
            values: stored rows (float ``[n, dim]`` rows for fp32), row ``i`` for ``keys[i]``.
        """
        xp = self.xp
        keys = as_keys(keys, xp, self._where)
        rows = as_stored(values, int(keys.shape[0]), self.row_format, xp, self._where)
        with self._lock:
            found = self._find(keys)
            positions = xp.flatnonzero(found >= 0)
            targets = found[positions]
            last = last_of_each(targets, xp)
            self._values[targets[last]] = rows[positions[last]]
            self._counters[UPDATED] += positions.shape[0]

    def stats(self) -> CacheStats:
        """Counters since creation (``inserts`` and ``evictions`` stay 0)."""
        with self._lock:
            return stats_from_counters(self._counters)
