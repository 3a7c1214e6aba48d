"""Memory layout and vectorised lookup of a read-mostly embedding hash table.

The table is stored as three flat arrays, sized to stay within a few percent of the sparse
files' own size (a hash map of Python objects would need several times more):

- ``hashes``: ``mix64(key)`` of every row, sorted ascending (uint64, 8 bytes/row). ``mix64``
  is a bijection, so the hash identifies the key and the key itself need not be stored.
- ``starts``: a bucket directory. Bucket ``b`` holds the rows whose hash has ``b`` as its top
  bits; ``starts[b]:starts[b+1]`` is its row range. There are about ``rows / 2`` buckets, so
  the directory costs at most 2 bytes/row (int32) and a bucket holds 2 to 4 rows.
- ``values``: the rows in the same order as ``hashes``, stored in the table's precision
  (:class:`~hps_core.quant.RowFormat`): float32 ``[rows, dim]`` for fp32, else uint32
  ``[rows, row_words]`` words of the encoded rows.

A lookup hashes the queried keys, reads each bucket's range and probes the candidates of all
keys together, one NumPy gather per round; the set of keys still searching shrinks every
round. No per-key Python loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hps_core.hashing import mix64
from hps_core.quant import RowFormat, StoragePrecision

ALIGN = 64
# Fewer buckets save memory, more buckets shorten the probe rounds; 2-4 rows per bucket keeps
# the directory under 2 bytes/row, which matters for narrow tables (dim 1: 12 bytes/row on disk).
MIN_ROWS_PER_BUCKET = 2
# Up to this many keys, find_rows runs one binary search per key over all the sorted hashes
# (NumPy's searchsorted, in C) instead of its probe rounds, each a dozen array operations
# whatever the number of keys, and as many rounds as the longest bucket probed: 64 keys of a
# 2M-row table took 33 us against 162 us, 1,024 keys 223 against 317 us, 16,384 keys 19.7 ms
# against 3.8 ms (cache misses of the binary searches), on the 2-core CPU machine.
SEARCH_KEYS = 1024


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class HashLayout:
    """Byte layout of a table of ``rows`` x ``dim`` inside one buffer.

    Args:
        rows: number of keys.
        dim: embedding vector size.
        precision: how the rows are stored.
    """

    rows: int
    dim: int
    precision: StoragePrecision = StoragePrecision.FP32

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", StoragePrecision.parse(self.precision))

    @property
    def row_format(self) -> RowFormat:
        """Layout and codec of one stored row."""
        return RowFormat(self.precision, self.dim)

    @property
    def bucket_bits(self) -> int:
        """log2 of the number of buckets (at least 1)."""
        # An int64 directory costs twice as much per bucket: give each bucket twice the rows.
        per_bucket = MIN_ROWS_PER_BUCKET * (self.starts_dtype.itemsize // 4)
        return max(1, (max(self.rows, 1) // per_bucket).bit_length() - 1)

    @property
    def num_buckets(self) -> int:
        """Number of buckets of the directory."""
        return 1 << self.bucket_bits

    @property
    def starts_dtype(self) -> np.dtype:
        """int32 while row numbers fit, else int64."""
        return np.dtype(np.int32) if self.rows < 2**31 - 1 else np.dtype(np.int64)

    @property
    def hashes_offset(self) -> int:
        """Byte offset of ``hashes``."""
        return 0

    @property
    def starts_offset(self) -> int:
        """Byte offset of ``starts``."""
        return _align(8 * (self.rows + 1))

    @property
    def values_offset(self) -> int:
        """Byte offset of ``values``."""
        return self.starts_offset + _align(self.starts_dtype.itemsize * (self.num_buckets + 1))

    @property
    def nbytes(self) -> int:
        """Total size of the buffer in bytes."""
        return self.values_offset + _align(self.rows * self.row_format.row_bytes)

    @property
    def index_nbytes(self) -> int:
        """Bytes of the row index alone, unpadded: ``hashes`` (with its padding entry) and
        ``starts``, as :meth:`views` returns them (what a copy of the index to a GPU takes).

        Example:
            >>> HashLayout(10, 4).index_nbytes  # 11 hashes, 5 int32 bucket starts
            108
        """
        return 8 * (self.rows + 1) + self.starts_dtype.itemsize * (self.num_buckets + 1)

    def views(self, buffer: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Array views of ``buffer`` (an mmap or bytearray of at least ``nbytes``).

        Args:
            buffer: any object supporting the buffer protocol.

        Returns:
            ``(hashes, starts, values)``; ``hashes`` has one padding entry after the rows,
            so that a probe at the end of the last bucket stays in the buffer; ``values`` are
            the stored rows (``row_format.stored_dtype`` ``[rows, row_words]``).
        """
        fmt = self.row_format
        hashes = np.frombuffer(buffer, np.uint64, self.rows + 1, self.hashes_offset)
        starts = np.frombuffer(buffer, self.starts_dtype, self.num_buckets + 1, self.starts_offset)
        values = np.frombuffer(
            buffer, fmt.stored_dtype, self.rows * fmt.row_words, self.values_offset
        )
        return hashes, starts, values.reshape(self.rows, fmt.row_words)


class DuplicateKeysError(ValueError):
    """The keys given to :func:`sort_order` are not unique."""

    def __init__(self, duplicates: np.ndarray) -> None:
        self.duplicates = duplicates
        shown = ", ".join(str(k) for k in duplicates[:5].tolist())
        more = f" and {len(duplicates) - 5} more" if len(duplicates) > 5 else ""
        super().__init__(f"{len(duplicates)} duplicate keys: {shown}{more}")


def sort_order(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Order in which rows are stored, and their sorted hashes.

    Args:
        keys: int64 keys of all rows, in file order.

    Returns:
        ``(order, sorted_hashes)`` with ``sorted_hashes = mix64(keys)[order]``.

    Raises:
        DuplicateKeysError: if a key occurs twice (equal hashes mean equal keys).
    """
    hashes = mix64(np.ascontiguousarray(keys, dtype=np.int64))
    order = _hash_order(hashes)
    sorted_hashes = hashes[order]
    dup = np.flatnonzero(sorted_hashes[1:] == sorted_hashes[:-1])
    if dup.size:
        duplicates = np.unique(keys[order[dup]])
        raise DuplicateKeysError(duplicates)
    return order, sorted_hashes


def _hash_order(hashes: np.ndarray) -> np.ndarray:
    """``np.argsort(hashes)`` for a table's hashes, at the cost of a value sort: each hash's
    high bits with its row number in the low ones are sorted as one uint64 (an argsort of 5M
    hashes took 1.04 s on the 2-core CPU machine, this 0.3 s), then the rows whose hashes
    agree in those high bits, a handful for random keys, are put in full-hash order.
    Equal hashes (duplicate keys) end up next to each other in some order."""
    n = len(hashes)
    index_bits = max(1, (n - 1).bit_length())
    if index_bits > 40:  # too few high bits left to keep ties rare
        return np.argsort(hashes)
    shift = np.uint64(index_bits)
    packed = hashes >> shift
    packed <<= shift
    packed |= np.arange(n, dtype=np.uint64)
    packed.sort()
    order = (packed & np.uint64((1 << index_bits) - 1)).astype(np.intp)
    packed >>= shift  # the high bits, now in sorted order
    tied = packed[1:] == packed[:-1]
    if tied.any():
        # Runs of equal high bits are in row order: sort their rows by the whole hash.
        in_run = np.zeros(n, dtype=bool)
        in_run[1:] |= tied
        in_run[:-1] |= tied
        where = np.flatnonzero(in_run)
        rows = order[where]
        order[where] = rows[np.argsort(hashes[rows])]
    return order


def fill_directory(layout: HashLayout, sorted_hashes: np.ndarray, starts: np.ndarray) -> None:
    """Write the bucket directory for ``sorted_hashes`` into ``starts``.

    Args:
        layout: the table layout.
        sorted_hashes: ascending uint64 hashes of all rows.
        starts: output view of ``num_buckets + 1`` entries.
    """
    buckets = (sorted_hashes >> np.uint64(64 - layout.bucket_bits)).astype(np.int64)
    counts = np.bincount(buckets, minlength=layout.num_buckets)
    starts[0] = 0
    np.cumsum(counts, out=starts[1:])


def find_rows(
    layout: HashLayout, hashes: np.ndarray, starts: np.ndarray, keys: np.ndarray
) -> np.ndarray:
    """Row of each key in the table, or -1 for keys it does not hold.

    Args:
        layout: the table layout.
        hashes: the table's sorted hashes (padded as :meth:`HashLayout.views` returns them).
        starts: the table's bucket directory.
        keys: int64 query keys, any order and shape, duplicates allowed.

    Returns:
        int64 array of rows (flat, in the order of ``keys.ravel()``), ``-1`` where the key
        is absent.
    """
    return find_hashes(
        layout, hashes, starts, mix64(np.ascontiguousarray(keys, dtype=np.int64).ravel())
    )


def find_hashes(
    layout: HashLayout, hashes: np.ndarray, starts: np.ndarray, want: np.ndarray
) -> np.ndarray:
    """:func:`find_rows` of keys given by their :func:`~hps_core.hashing.mix64` hashes (a
    caller that hashed the keys of several tables in one pass).

    Args:
        layout: the table layout.
        hashes: the table's sorted hashes.
        starts: the table's bucket directory.
        want: 1-D uint64 hashes of the query keys.

    Returns:
        int64 array of rows, ``-1`` where the key is absent.
    """
    if want.size <= SEARCH_KEYS:
        # The hashes are sorted over the whole table (a bucket is a range of their top bits).
        pos = np.searchsorted(hashes[: layout.rows], want)
        return np.where((pos < layout.rows) & (hashes[pos] == want), pos, -1).astype(
            np.int64, copy=False
        )
    bucket = (want >> np.uint64(64 - layout.bucket_bits)).astype(np.intp)
    pos = starts[bucket]
    end = starts[bucket + 1]
    # Round one covers every key and needs no compaction: most keys end here.
    cand = hashes[pos]  # the padding after the last row keeps pos == rows readable
    inside = pos < end
    rows = np.where((cand == want) & inside, pos, -1).astype(np.int64, copy=False)
    # Later rounds compare the keys still searching with the next row of their bucket, then
    # compact the arrays. Hashes are sorted inside a bucket, so a key stops at its match or at
    # the first larger hash.
    more = (cand < want) & inside
    idx = np.flatnonzero(more)
    pos, end, want = pos[idx] + 1, end[idx], want[idx]
    while idx.size:
        cand = hashes[pos]
        inside = pos < end
        hit = (cand == want) & inside
        rows[idx[hit]] = pos[hit]
        more = (cand < want) & inside
        idx, pos, end, want = idx[more], pos[more] + 1, end[more], want[more]
    return rows
