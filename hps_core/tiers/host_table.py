"""An embedding table held once per machine in shared memory (the volatile host tier).

HugeCTR's ``hash_map`` / ``multi_process_hash_map`` volatile databases keep one copy of each
table in host memory. Under Triton's Python backend every model instance is a separate
process, so the copy lives in a shared-memory segment (:mod:`hps_core.tiers.shm_segment`)
laid out by :mod:`hps_core.tiers.hash_layout`: the first process to open a table builds it
from the sparse files, every other process of the machine maps the same pages.

The build runs at the speed the files can be read: the rows keep the files' order and are read
straight into the segment by every core at once (:func:`~hps_core.formats.sparse.read_vectors`),
and only the keys are sorted, into an index of hashes whose entries point at the rows
(:func:`~hps_core.tiers.hash_layout.build_index`). Beyond the segment, the build holds the
keys (8 bytes a row) and a chunk of temporaries.

Below a persistent tier (:mod:`hps_core.tiers.cascade`) the copy may hold only the first
``fraction`` of the file's rows (HugeCTR's ``initial_cache_rate``, which caches the first rows
of the file); the fraction is part of the segment name, so tables of different fractions never
share a segment.

The rows are stored in the table's precision (:class:`~hps_core.quant.RowFormat`): a compressed
table is encoded chunk by chunk while the sparse files stream in, so no FP32 copy of it is ever
held whole. Lookups answer float32 (decoded); :meth:`SharedHostTable.lookup_stored` and
:meth:`SharedHostTable.stored_contents` hand out the stored rows themselves, which is what the
GPU caches and static tables hold, so that every tier keeps the same bytes for a row.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hps_core.errors import ModelFileError
from hps_core.formats.sparse import (
    KEY_DTYPE,
    KEY_FILE,
    VECTOR_FILE,
    inspect_sparse_table,
    read_keys,
    read_vectors,
)
from hps_core.formats.uris import ModelPath, model_path
from hps_core.hashing import unmix64
from hps_core.quant import StoragePrecision
from hps_core.tiers.hash_layout import (
    SEARCH_KEYS,
    DuplicateKeysError,
    HashLayout,
    build_index,
    entry_rows,
    find_hashes,
    find_rows,
)
from hps_core.tiers.shm_segment import SharedSegment, file_identity

logger = logging.getLogger("hps_core")

# Part of every segment name: bump it when the layout changes, so that a server of a new
# version never maps a segment built by an old one.
LAYOUT_VERSION = 3


def held_rows(rows: int, fraction: float) -> int:
    """Rows of a table of ``rows`` that a tier holding ``fraction`` of it keeps.

    Rounded to nearest as HugeCTR rounds ``initial_cache_rate * capacity``.

    Example:
        >>> held_rows(10, 0.25), held_rows(10, 1.0), held_rows(0, 0.5)
        (3, 10, 0)
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    return rows if fraction >= 1.0 else min(rows, int(fraction * rows + 0.5))


def host_layout(
    table_rows: int,
    dim: int,
    fraction: float = 1.0,
    precision: StoragePrecision = StoragePrecision.FP32,
) -> HashLayout:
    """Layout of the shared segment of a table of ``table_rows`` rows held at ``fraction``:
    the first :func:`held_rows` of the sparse files, their rows in file order and their index,
    nothing for the rest (a table below Redis or RocksDB at ``initial_cache_rate`` 0.1 takes a
    tenth of its FP32 bytes in ``/dev/shm``, not all of them). :class:`SharedHostTable` allocates
    exactly this, and :mod:`hps_core.footprint` reports it.

    Args:
        table_rows: rows of the sparse files.
        dim: embedding vector size.
        fraction: share of the rows held, the first ones in file order.
        precision: how the rows are stored.

    Returns:
        The layout.

    Example:
        >>> host_layout(10, 4, fraction=0.5).rows, host_layout(10, 4).rows
        (5, 10)
    """
    return HashLayout(held_rows(table_rows, fraction), dim, precision, positions=True)


def segment_name(
    sparse_dir: Path,
    dim: int,
    fraction: float = 1.0,
    precision: StoragePrecision = StoragePrecision.FP32,
) -> str:
    """Name of the segment holding a sparse folder's table.

    Equal names mean equal contents: the name covers the layout version, the dim, the
    fraction of the rows held and the identity (path, size, modification time, inode) of
    both files, so a rewritten table gets a new segment instead of stale rows.

    Args:
        sparse_dir: the sparse model folder.
        dim: embedding vector size.
        fraction: share of the file's rows held (the first ones); 1.0 names the segment as
            before fractions existed, so whole tables keep their names.
        precision: how the rows are stored; fp32 names the segment as before precisions
            existed.

    Returns:
        A short hexadecimal digest.
    """
    parts = [
        f"v{LAYOUT_VERSION}",
        f"dim={dim}",
        file_identity(sparse_dir / KEY_FILE),
        file_identity(sparse_dir / VECTOR_FILE),
    ]
    if fraction < 1.0:
        parts.append(f"fraction={fraction!r}")
    precision = StoragePrecision.parse(precision)
    if precision is not StoragePrecision.FP32:
        parts.append(f"precision={precision.value}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


class SharedHostTable:
    """One embedding table, shared by every process of the machine.

    Args:
        sparse_dir: HugeCTR sparse model folder (``key`` + ``emb_vector``).
        dim: embedding vector size.
        default_value: the value of every element of the vector returned for unknown keys.
        progress: progress report while building (see ``iter_sparse_table``).
        fraction: share of the file's rows to hold, the first ones in file order (HugeCTR's
            ``initial_cache_rate``); the others are answered by the tiers below.
        writable: map the segment read-write so that online updates can overwrite rows in
            place (:meth:`write_rows`); the row index stays read-only either way. Processes
            that map it read-only see those writes too (one set of pages per machine).
        precision: how the rows are stored in the segment.

    Attributes:
        rows: rows held (the layout's rows; what ``index_arrays``/``contents`` cover).
        table_rows: rows of the sparse files (equal to ``rows`` unless ``fraction < 1``).

    Example:
        >>> table = SharedHostTable(Path("0_sparse_model"), dim=16)  # doctest: +SKIP
        >>> values, found = table.lookup(np.array([3, 7], dtype=np.int64))  # doctest: +SKIP
    """

    has_lower_tiers = False
    """No tier below: unknown keys get the default vector (see :mod:`hps_core.tiers.cascade`)."""

    def __init__(
        self,
        sparse_dir: ModelPath,
        dim: int,
        default_value: float = 0.0,
        progress: bool | None = None,
        fraction: float = 1.0,
        writable: bool = False,
        precision: StoragePrecision = StoragePrecision.FP32,
    ) -> None:
        self.sparse_dir = model_path(sparse_dir)
        precision = StoragePrecision.parse(precision)
        info = self._info = inspect_sparse_table(self.sparse_dir, dim)
        self.dim = dim
        self.table_rows = info.rows
        self.fraction = fraction
        self.rows = held_rows(info.rows, fraction)
        self.file_bytes = info.total_bytes
        self.default_value = np.float32(default_value)
        self.layout = host_layout(info.rows, dim, fraction, precision)
        self.row_format = self.layout.row_format
        #: The default vector as one stored row (what a stored lookup gives unknown keys).
        self.default_stored = np.full(dim, self.default_value, np.float32)
        if not self.row_format.is_identity:
            self.default_stored = self.row_format.encode_stored(self.default_stored[None])[0]
        self._progress = progress
        started = time.perf_counter()
        self._segment = SharedSegment.open(
            segment_name(self.sparse_dir, dim, fraction, precision),
            self.layout.nbytes,
            self._build,
            writable=writable,
            what=f"the host tier of {self.sparse_dir} ({self.rows:,} rows of dim {dim})",
            # The rows' pages are allocated a chunk ahead of their read, not zeroed first.
            reserve_first=self.layout.values_offset,
            sources=(self.sparse_dir / KEY_FILE, self.sparse_dir / VECTOR_FILE),
        )
        self.writable = writable and self._segment.buffer is not None
        self._hashes, self._starts, self._positions, self._values = self.layout.views(
            self._segment.buffer if self._segment.buffer is not None else bytearray(0)
        )
        if self.writable:
            # Only the rows are updated in place; the index never changes after the build.
            for index in (self._hashes, self._starts, self._positions):
                index.flags.writeable = False
        seconds = time.perf_counter() - started
        if self._segment.built_here:
            read = self.rows * (8 + 4 * dim)
            logger.info(
                "host tier: built %s (%d of %d rows, dim %d, %s, %.1f MiB shared) in %.2f s, "
                "%.2f GB/s of the files",
                self.sparse_dir, self.rows, self.table_rows, dim, precision.value,
                self.layout.nbytes / 2**20, seconds, read / max(seconds, 1e-9) / 1e9,
            )  # fmt: skip
        else:
            logger.info(
                "host tier: attached to %s (%d of %d rows, dim %d, %s, %.1f MiB shared) in %.2f s",
                self.sparse_dir, self.rows, self.table_rows, dim, precision.value,
                self.layout.nbytes / 2**20, seconds,
            )  # fmt: skip

    @property
    def built_here(self) -> bool:
        """Whether this process built the segment (False: it attached to another's)."""
        return self._segment.built_here

    @property
    def segment_path(self) -> Path:
        """The shared-memory file of the table."""
        return self._segment.data_path

    @property
    def nbytes(self) -> int:
        """Bytes of shared memory the table occupies."""
        return self.layout.nbytes

    def buffer_address(self) -> tuple[int, int]:
        """Address and length of this process's mapping of the segment (for GPU access).

        Returns:
            ``(address, bytes)``; the hashes start at the address, the rows at
            ``address + layout.values_offset``.
        """
        return int(self._hashes.ctypes.data), self.layout.nbytes

    def index_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The row index: sorted hashes (one padding entry), the bucket directory, and the row
        of each index entry.

        Returns:
            Read-only views ``(hashes, starts, positions)`` of the segment (see
            :class:`~hps_core.tiers.hash_layout.HashLayout`).
        """
        return self._hashes, self._starts, self._positions

    def _build(self, buffer: mmap.mmap, reserve: Callable[[int, int], None]) -> None:
        views = self.layout.views(buffer)
        values = views.values
        at, row_bytes = self.layout.values_offset, self.row_format.row_bytes
        # The keys are sorted from where the rows will go (rows of 8 bytes or more): the
        # build then holds no memory besides the segment and a chunk.
        scratch = None
        if row_bytes >= KEY_DTYPE.itemsize and self.rows:
            reserve(at, self.rows * KEY_DTYPE.itemsize)
            scratch = np.frombuffer(buffer, KEY_DTYPE, self.rows, at)
        keys = read_keys(self.sparse_dir, self.rows, out=scratch)  # a short file raises
        try:
            build_index(self.layout, views, keys)
        except DuplicateKeysError as exc:
            raise ModelFileError(f"{self.sparse_dir / KEY_FILE}: {exc}") from None
        del keys, scratch

        def allocate(start: int, stop: int) -> None:
            reserve(at + start * row_bytes, (stop - start) * row_bytes)

        if self.row_format.is_identity:
            read_vectors(
                self._info, self.rows, out=values, prepare=allocate, progress=self._progress
            )
            return
        encode_into = self.row_format.encode_into
        encoded = values.view(np.uint8).reshape(self.rows, row_bytes)

        def store(start: int, vectors: np.ndarray) -> None:  # one chunk at a time, in place
            encode_into(vectors, encoded[start : start + len(vectors)])

        read_vectors(
            self._info, self.rows, consume=store, prepare=allocate, progress=self._progress
        )

    def find(self, keys: np.ndarray) -> np.ndarray:
        """Row of each key in the table, ``-1`` for unknown keys.

        Args:
            keys: int64 keys.

        Returns:
            int64 rows.
        """
        entries = find_rows(self.layout, self._hashes, self._starts, keys)
        return entry_rows(self._positions, entries)

    def lookup(
        self, keys: np.ndarray, out: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Embedding vectors of ``keys``; the table's default vector for unknown keys.

        Args:
            keys: int64 keys, any order, duplicates allowed.
            out: optional float32 ``[len(keys), dim]`` C-contiguous array to write into.

        Returns:
            ``(values, found)``: float32 ``[len(keys), dim]`` (decoded from the stored rows)
            and a bool mask of known keys.
        """
        rows, found = self._find_checked(keys)
        return self._values_of(rows, found, out), found

    def rows_in_place(
        self, unique: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """Where the rows of distinct keys are in the table's own array, for a caller that
        gathers and pools them itself in one pass.

        Args:
            unique: distinct int64 keys.

        Returns:
            ``(values, rows, below, found_below)``: the table's float32 ``[rows, dim]``
            array (read only), each key's row in it (``-1`` where the table lacks the key),
            the vectors of the keys it lacks in their order (here the default vector) and
            which of those some tier holds (here none); None where rows are stored
            compressed (they need decoding).
        """
        if not self.row_format.is_identity:
            return None
        rows = self.find(unique)
        missing = int(len(rows) - np.count_nonzero(rows >= 0))
        below = np.repeat(self.default_stored[None], missing, axis=0)
        return self._values, rows, below, np.zeros(missing, dtype=bool)

    def lookup_hashed(
        self, hashes: np.ndarray, out: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`lookup` of keys given by their :func:`~hps_core.hashing.mix64` hashes: for
        a caller that hashed the keys of several tables in one pass.

        Args:
            hashes: 1-D uint64 hashes of the keys.
            out: optional float32 ``[len(hashes), dim]`` C-contiguous array to write into.

        Returns:
            ``(values, found)`` as :meth:`lookup` returns them.
        """
        if 0 < hashes.size <= SEARCH_KEYS and self.rows and self.row_format.is_identity:
            return self._few_hashed(hashes, out)
        entries = find_hashes(self.layout, self._hashes, self._starts, hashes)
        rows = entry_rows(self._positions, entries)
        found = rows >= 0
        return self._values_of(rows, found, out), found

    def _few_hashed(
        self, hashes: np.ndarray, out: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`lookup_hashed` of a few keys of a non-empty FP32 table, in six NumPy calls
        where the general path takes sixteen: a model of many tables asked for one sample's
        keys spends its time in the calls' fixed cost, not in the work."""
        # The hashes are sorted over the whole table. A key past the last row lands on the
        # padding entry (hash 0), which only a hash of 0 could equal, and a hash of 0 lands
        # on row 0, never past the end.
        pos = np.searchsorted(self._hashes[: self.rows], hashes)
        found = self._hashes[pos] == hashes
        rows = pos if self._positions is None else self._positions.take(pos, mode="clip")
        if found.all():
            if out is None:
                return self._values[rows], found
            return np.take(self._values, rows, axis=0, out=out), found
        return self._values_of(np.where(found, rows, -1), found, out), found

    def _values_of(self, rows: np.ndarray, found: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        """The float32 vectors of the found ``rows`` (the default vector elsewhere)."""
        if not self.row_format.is_identity:
            stored = self._stored_of(rows, found)
            values = np.empty((len(found), self.dim), np.float32) if out is None else out
            self.row_format.decode_into(stored.view(np.uint8), values)
        elif self.rows == 0:
            values = np.empty((len(rows), self.dim), np.float32) if out is None else out
        elif out is None:
            # Fancy indexing allocates its result faster than np.take does.
            values = self._values[np.where(found, rows, 0)]
        else:
            values = np.take(self._values, np.where(found, rows, 0), axis=0, out=out)
        if not found.all():
            values[~found] = self.default_value
        return values

    def lookup_stored(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The stored rows of ``keys`` (what a GPU cache of the table holds).

        Args:
            keys: int64 keys, any order, duplicates allowed.

        Returns:
            ``(stored, found)``: ``row_format.stored_dtype`` ``[len(keys), row_words]`` (a
            new array; rows of unknown keys hold the default vector, encoded) and a bool mask
            of known keys. For an fp32 table this is :meth:`lookup`.
        """
        if self.row_format.is_identity:
            return self.lookup(keys)
        rows, found = self._find_checked(keys)
        return self._stored_of(rows, found), found

    def _stored_of(self, rows: np.ndarray, found: np.ndarray) -> np.ndarray:
        """The stored rows of the found ``rows`` (the encoded default vector elsewhere)."""
        if self.rows == 0:
            stored = np.empty((len(rows), self.row_format.row_words), self.row_format.stored_dtype)
        else:
            stored = self._values[np.where(found, rows, 0)]
        if not found.all():
            stored[~found] = self.default_stored
        return stored

    def _find_checked(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keys = np.asarray(keys)
        if keys.dtype != np.int64:
            raise TypeError(f"keys must be int64, got {keys.dtype}")
        rows = self.find(keys.ravel())
        return rows, rows >= 0

    def read_rows(self, rows: np.ndarray) -> np.ndarray:
        """Copies of the vectors at ``rows`` (rows from :meth:`find`, all ``>= 0``), decoded.

        Args:
            rows: int64 row numbers.

        Returns:
            float32 ``[len(rows), dim]``, a new array.
        """
        stored = self.read_stored(rows)
        if self.row_format.is_identity:
            return stored
        return self.row_format.decode_stored(stored)

    def read_stored(self, rows: np.ndarray) -> np.ndarray:
        """Copies of the stored rows at ``rows`` (rows from :meth:`find`, all ``>= 0``).

        Args:
            rows: int64 row numbers.

        Returns:
            ``row_format.stored_dtype`` ``[len(rows), row_words]``, a new array.
        """
        return self._values[np.asarray(rows, dtype=np.int64)]

    def write_rows(self, rows: np.ndarray, vectors: np.ndarray) -> None:
        """Overwrite rows in place in the shared segment (online updates), encoding float32
        vectors into the table's precision (:meth:`write_stored` with
        ``row_format.encode_stored(vectors)``).

        Args:
            rows: int64 row numbers from :meth:`find` (all ``>= 0``); for repeated rows the
                last vector wins.
            vectors: float32 ``[len(rows), dim]``.

        Raises:
            PermissionError: the table was opened without ``writable``.
        """
        vectors = np.asarray(vectors, dtype=np.float32)
        if not self.row_format.is_identity:
            vectors = self.row_format.encode_stored(vectors)
        self.write_stored(rows, vectors)

    def write_stored(self, rows: np.ndarray, stored: np.ndarray) -> None:
        """Overwrite stored rows in place in the shared segment (online updates).

        Every process of the machine (and every GPU that maps the segment, see
        :mod:`hps_core.infer.gpu.host_mapping`) reads the same pages, so the new values are what the
        next lookup anywhere on the machine reads. A reader running at the same moment may see
        a row half written; rows of one message are written in one NumPy assignment.

        Args:
            rows: int64 row numbers from :meth:`find` (all ``>= 0``); for repeated rows the
                last one wins.
            stored: ``row_format.stored_dtype`` ``[len(rows), row_words]``.

        Raises:
            PermissionError: the table was opened without ``writable``.
        """
        if not self.writable:
            raise PermissionError(
                f"host tier of {self.sparse_dir} is mapped read-only; open it with writable=True"
            )
        self._values[np.asarray(rows, dtype=np.int64)] = stored

    def contents(self) -> tuple[np.ndarray, np.ndarray]:
        """Every key and its vector, in the files' order.

        Returns:
            ``(keys, values)``: a new int64 ``[rows]`` array and the float32 ``[rows, dim]``
            rows: a read-only view of the shared rows for an fp32 table, else a decoded copy.
        """
        keys, stored = self.stored_contents()
        if self.row_format.is_identity:
            return keys, stored
        return keys, self.row_format.decode_stored(stored)

    def stored_contents(self) -> tuple[np.ndarray, np.ndarray]:
        """Every key and its stored row, in the files' order.

        Returns:
            ``(keys, stored)``: a new int64 ``[rows]`` array and a view of the shared
            ``row_format.stored_dtype`` ``[rows, row_words]`` rows.
        """
        keys = np.empty(self.rows, np.int64)
        keys[self._positions] = unmix64(self._hashes[: self.rows])
        return keys, self._values

    def close(self) -> None:
        """Detach from the segment (the last process to detach frees it)."""
        self._hashes = self._starts = self._positions = self._values = None  # type: ignore[assignment]
        self._segment.close()
