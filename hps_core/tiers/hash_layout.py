"""Memory layout and vectorised lookup of a read-mostly embedding hash table.

The table is stored as flat arrays, sized to stay within a few percent of the sparse files'
own size (a hash map of Python objects would need several times more):

- ``hashes``: ``mix64(key)`` of every row, sorted ascending (uint64, 8 bytes/row). ``mix64``
  is a bijection, so the hash identifies the key and the key itself need not be stored.
- ``starts``: a bucket directory. Bucket ``b`` holds the rows whose hash has ``b`` as its top
  bits; ``starts[b]:starts[b+1]`` is its range of index entries. There are about ``rows / 2``
  buckets, so the directory costs at most 2 bytes/row (int32) and a bucket holds 2 to 4 rows.
- ``positions`` (a layout made ``positions=True``): the row of each index entry in ``values``,
  which then keep the sparse files' order: a table is built by reading its vector file
  straight into place and sorting only the keys (:func:`build_index`). Without it the rows are
  in index order (a static GPU table, built in memory).
- ``values`` (unless ``values=False``: an index of rows kept elsewhere): the rows, stored in
  the table's precision (:class:`~hps_core.quant.RowFormat`): float32 ``[rows, dim]`` for
  fp32, else uint32 ``[rows, row_words]`` words of the encoded rows.

A lookup hashes the queried keys, reads each bucket's range and probes the candidates of all
keys together, one NumPy gather per round; the set of keys still searching shrinks every
round. No per-key Python loop. It finds index entries; :func:`entry_rows` turns them into rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

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
# Rows per step of the passes over a whole index: bounds their temporaries (8 MiB a uint64).
_CHUNK = 1 << 20


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class HashViews(NamedTuple):
    """Array views of a :class:`HashLayout` buffer (:meth:`HashLayout.views`)."""

    hashes: np.ndarray
    """uint64 ``[rows + 1]``: sorted hashes and one padding entry."""
    starts: np.ndarray
    """``[num_buckets + 1]`` bucket directory (int32, or int64 for huge tables)."""
    positions: np.ndarray | None
    """``[rows]`` row of each index entry (``starts``' type), or None: rows in index order."""
    values: np.ndarray | None
    """``[rows, row_words]`` stored rows, or None for a layout without values."""


@dataclass(frozen=True)
class HashLayout:
    """Byte layout of a table of ``rows`` x ``dim`` inside one buffer.

    Args:
        rows: number of keys.
        dim: embedding vector size.
        precision: how the rows are stored.
        positions: the rows keep the order they were given in (the files'), and an array of
            each index entry's row is stored; else the rows are in index order.
        values: the buffer holds the rows (else only the index of rows kept elsewhere).
    """

    rows: int
    dim: int
    precision: StoragePrecision = StoragePrecision.FP32
    positions: bool = False
    values: bool = True

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
        """int32 while row numbers fit, else int64 (the type of ``positions`` too)."""
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
    def positions_offset(self) -> int:
        """Byte offset of ``positions`` (where ``values`` start when there are none)."""
        return self.starts_offset + _align(self.starts_dtype.itemsize * (self.num_buckets + 1))

    @property
    def values_offset(self) -> int:
        """Byte offset of ``values``."""
        stored = self.starts_dtype.itemsize * self.rows if self.positions else 0
        return self.positions_offset + _align(stored)

    @property
    def nbytes(self) -> int:
        """Total size of the buffer in bytes."""
        stored = self.rows * self.row_format.row_bytes if self.values else 0
        return self.values_offset + _align(stored)

    @property
    def index_nbytes(self) -> int:
        """Bytes of the row index alone, unpadded: ``hashes`` (with its padding entry),
        ``starts`` and ``positions``, as :meth:`views` returns them (what a copy of the index
        to a GPU takes).

        Example:
            >>> HashLayout(10, 4).index_nbytes  # 11 hashes, 5 int32 bucket starts
            108
            >>> HashLayout(10, 4, positions=True).index_nbytes  # and 10 int32 positions
            148
        """
        stored = self.rows if self.positions else 0
        entries = self.num_buckets + 1 + stored
        return 8 * (self.rows + 1) + self.starts_dtype.itemsize * entries

    def views(self, buffer: object) -> HashViews:
        """Array views of ``buffer`` (an mmap or bytearray of at least ``nbytes``).

        Args:
            buffer: any object supporting the buffer protocol.

        Returns:
            The :class:`HashViews`; ``hashes`` has one padding entry after the rows, so that
            a probe at the end of the last bucket stays in the buffer.
        """
        fmt = self.row_format
        hashes = np.frombuffer(buffer, np.uint64, self.rows + 1, self.hashes_offset)
        starts = np.frombuffer(buffer, self.starts_dtype, self.num_buckets + 1, self.starts_offset)
        positions = values = None
        if self.positions:
            positions = np.frombuffer(buffer, self.starts_dtype, self.rows, self.positions_offset)
        if self.values:
            flat = np.frombuffer(
                buffer, fmt.stored_dtype, self.rows * fmt.row_words, self.values_offset
            )
            values = flat.reshape(self.rows, fmt.row_words)
        return HashViews(hashes, starts, positions, values)


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
    shift = np.uint64(64 - layout.bucket_bits)
    counts = np.zeros(layout.num_buckets, np.int64)
    for first in range(0, len(sorted_hashes), _CHUNK):  # bounded temporaries for huge tables
        buckets = (sorted_hashes[first : first + _CHUNK] >> shift).astype(np.intp)
        counts += np.bincount(buckets, minlength=layout.num_buckets)
    starts[0] = 0
    np.cumsum(counts, out=starts[1:])


def build_index(layout: HashLayout, views: HashViews, keys: np.ndarray) -> None:
    """Write the index of ``keys`` (in the order of the rows) into a ``positions`` layout:
    sorted hashes, the bucket directory, and each entry's row.

    Sorts in place in ``views.hashes``, as :func:`sort_order` orders (a value sort of each
    hash's high bits packed with its row, then the rare runs of equal high bits by their whole
    hash), so that beyond the index itself only ``keys`` and a chunk's temporaries are held:
    a table of a billion rows needs no gigabytes of sort buffers besides its own index.

    Args:
        layout: a layout made with ``positions=True``, of ``len(keys)`` rows.
        views: its views of the buffer to fill.
        keys: int64 keys of the rows, in their order.

    Raises:
        DuplicateKeysError: a key occurs twice.
    """
    n = layout.rows
    hashes, positions = views.hashes, views.positions
    assert positions is not None and len(keys) == n
    index_bits = max(1, (n - 1).bit_length())
    if index_bits > 40:  # too few high bits left to keep ties rare: sort the plain way
        order, sorted_hashes = sort_order(keys)
        hashes[:n], positions[:] = sorted_hashes, order
    elif n:
        shift = np.uint64(index_bits)
        for first in range(0, n, _CHUNK):
            chunk = mix64(keys[first : first + _CHUNK])
            chunk >>= shift
            chunk <<= shift
            chunk |= np.arange(first, first + len(chunk), dtype=np.uint64)
            hashes[first : first + len(chunk)] = chunk
        hashes[:n].sort()
        mask = np.uint64((1 << index_bits) - 1)
        tied_rows: list[np.ndarray] = []
        for first in range(0, n, _CHUNK):
            packed = hashes[first : min(first + _CHUNK + 1, n)]  # one more: runs across chunks
            positions[first : first + _CHUNK] = (packed[:_CHUNK] & mask).astype(positions.dtype)
            high = packed >> shift
            tied = np.flatnonzero(high[1:] == high[:-1]) + first
            if len(tied):
                tied_rows.append(tied)
        if tied_rows:
            # Runs of equal high bits are in row order: order their entries by the whole hash.
            tied = np.concatenate(tied_rows)
            where = np.union1d(tied, tied + 1)
            rows = positions[where].astype(np.intp)
            positions[where] = rows[np.argsort(mix64(keys[rows]), kind="stable")]
        for first in range(0, n, _CHUNK):
            stop = min(first + _CHUNK, n)
            hashes[first:stop] = mix64(keys[positions[first:stop]])
    hashes[n] = 0  # the padding entry
    sorted_hashes = hashes[:n]
    dup = np.flatnonzero(sorted_hashes[1:] == sorted_hashes[:-1])
    if dup.size:
        raise DuplicateKeysError(np.unique(keys[positions[dup]]))
    fill_directory(layout, sorted_hashes, views.starts)


def entry_rows(positions: np.ndarray | None, entries: np.ndarray) -> np.ndarray:
    """The rows of index ``entries`` found by :func:`find_rows` (``-1`` stays ``-1``).

    Args:
        positions: the layout's ``positions`` view, or None (rows in index order).
        entries: int64 entries, ``-1`` for keys not found.

    Returns:
        int64 rows.
    """
    if positions is None:
        return entries
    rows = np.full(len(entries), -1, np.int64)
    found = entries >= 0
    rows[found] = positions[entries[found]]
    return rows


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
