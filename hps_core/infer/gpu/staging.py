"""Where a batch's arrays sit in the pipeline's staging and device input buffers (NumPy only).

A batch of ``size`` samples (the size bucket: the next power of two) is one buffer:

- the keys of every table (int64), room for ``maxnum_catfeature_query_per_table_per_sample``
  keys per sample and table: table-major (table ``t``'s keys at ``size * keys_at[t]``, in bag
  order) or, for a batch whose tables all have a fixed hotness that fills their key room,
  sample-major as requests carry them (``[size, keys_per_sample]``: sample ``b``'s keys of
  table ``t`` from ``b * keys_per_sample + keys_at[t]`` on), so that staging them is one copy;
- a header (int32): the number of real samples, 1 if the keys are sample-major (else 0),
  then per table its hotness ``h`` when every slot of the batch holds ``h`` keys (its batch
  has no offsets: key ``i`` fills bag ``i // h``), else 0;
- the dense features (float32) ``[size, dense_dim]``;
- the CSR row offsets of every table that has them (int32), table ``t``'s ``size * S_t + 1``
  entries at ``size * offsets_at[t] + t``; the bags of padded samples are empty. They come
  last, so that a batch without offsets (every table of a fixed hotness: the samples
  contract, one-hot models) is copied without them (:meth:`BatchLayout.used_bytes`).

Each region starts on a 256-byte boundary. The host fills the pinned twin; one copy moves it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

_ALIGN = 256


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def bucket_for(samples: int) -> int:
    """Size bucket of a batch: the next power of two (at least 1)."""
    return 1 << max(0, int(samples) - 1).bit_length()


@dataclass(frozen=True)
class BatchLayout:
    """Byte layout of a batch of ``size`` samples in the staging and device input buffers.

    Args:
        size: samples (the bucket).
        keys_per_sample: key capacity per sample, all tables.
        slots: slots per sample, all tables.
        tables: number of tables.
        dense_dim: dense features per sample.

    Example:
        >>> lay = BatchLayout(size=4, keys_per_sample=3, slots=3, tables=2, dense_dim=13)
        >>> lay.header_at, lay.dense_at, lay.offsets_at, lay.offsets_len, lay.nbytes
        (256, 512, 768, 14, 1024)
        >>> lay.used_bytes(offsets=False)
        768
    """

    size: int
    keys_per_sample: int
    slots: int
    tables: int
    dense_dim: int

    # The offsets below are cached (each batch reads them a few dozen times).

    @cached_property
    def keys_bytes(self) -> int:
        """Bytes of the key region."""
        return self.size * self.keys_per_sample * 8

    @cached_property
    def header_at(self) -> int:
        """Byte offset of the header (samples, sample-major flag, hotness per table)."""
        return _aligned(self.keys_bytes)

    @cached_property
    def header_len(self) -> int:
        """Entries of the header (int32)."""
        return 2 + self.tables

    @cached_property
    def dense_at(self) -> int:
        """Byte offset of the dense features."""
        return self.header_at + _aligned(4 * self.header_len)

    @cached_property
    def offsets_at(self) -> int:
        """Byte offset of the row offsets."""
        return self.dense_at + _aligned(self.size * self.dense_dim * 4)

    @cached_property
    def offsets_len(self) -> int:
        """Number of row offsets (int32)."""
        return self.size * self.slots + self.tables

    @cached_property
    def nbytes(self) -> int:
        """Size of the whole buffer."""
        return self.offsets_at + _aligned(self.offsets_len * 4)

    def used_bytes(self, offsets: bool) -> int:
        """Bytes from the start that a batch uses: all, or (``offsets`` False: no table of the
        batch has row offsets) up to the row offsets."""
        return self.nbytes if offsets else self.offsets_at

    def views(self, buffer: Any) -> tuple[Any, Any, Any, Any]:
        """``(keys, header, offsets, dense)`` views of a uint8 buffer (NumPy or CuPy) of
        ``nbytes``."""
        keys = buffer[: self.keys_bytes].view(np.int64)
        header = buffer[self.header_at : self.header_at + 4 * self.header_len].view(np.int32)
        offsets = buffer[self.offsets_at : self.offsets_at + self.offsets_len * 4].view(np.int32)
        dense = buffer[self.dense_at : self.dense_at + self.size * self.dense_dim * 4]
        return keys, header, offsets, dense.view(np.float32).reshape(self.size, self.dense_dim)


def split_copies(
    copies: Sequence[tuple[np.ndarray, np.ndarray]], parts: int
) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """``copies`` (``(target, source)`` pairs of equal shape) cut into at most ``parts`` lists
    of about equal bytes, splitting pairs between rows (along the first axis) where needed,
    one list per filling thread.

    Example:
        >>> t, s = np.zeros(12), np.arange(12.0)
        >>> shares = split_copies([(t[:6], s[:6]), (t[6:], s[6:])], 3)
        >>> [[len(a) for a, _ in share] for share in shares]
        [[4], [2, 2], [4]]
    """
    step = max(1, -(-sum(t.nbytes for t, _ in copies) // max(parts, 1)))
    shares: list[list[tuple[np.ndarray, np.ndarray]]] = [[]]
    filled = 0
    for target, source in copies:
        at, n = 0, target.shape[0]
        row = max(1, target.nbytes // max(n, 1))
        while at < n:
            take = min(n - at, max(1, (step - filled) // row))
            shares[-1].append((target[at : at + take], source[at : at + take]))
            at += take
            filled += take * row
            if filled >= step:
                shares.append([])
                filled = 0
    return [share for share in shares if share]
