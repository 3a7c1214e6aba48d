"""Rows that online updates brought for keys the shared host tier does not hold.

The shared host tier (:mod:`hps_core.tiers.host_table`) is a sorted hash layout built from the
sparse files: it can overwrite the rows it holds in place, but it has no room for new keys.
An update (:mod:`hps_core.updates`) for a key it lacks is kept here instead, in this process's
memory, and the lookup cascade (:class:`~hps_core.tiers.cascade.TieredTable`) consults this
tier first below the shared one, so that the host path and the GPU pipeline (through
``lookup_lower``) both answer the new row.

The overlay is per process and starts empty: what it held is rebuilt by replaying the update
stream (see :mod:`hps_core.updates.apply`). It grows with the number of new keys the stream
brings; nothing is evicted (a key is only ever overwritten).

Example:
    >>> store = OverlayStore()
    >>> store.insert("hps_et.m.t0", np.array([5, 9]), np.ones((2, 2), np.float32))
    >>> values, found = store.lookup("hps_et.m.t0", np.array([9, 4]), dim=2, default=-1.0)
    >>> values.tolist(), found.tolist()
    ([[1.0, 1.0], [-1.0, -1.0]], [True, False])
"""

from __future__ import annotations

import os
import threading

import numpy as np

from hps_core.errors import RequestError
from hps_core.tiers.backing import copy_sparse_folder

_INITIAL_ROWS = 1024


class _Table:
    """One table's rows: ``index`` maps a key to its row of ``values`` (grown by doubling)."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.index: dict[int, int] = {}
        self.values = np.empty((_INITIAL_ROWS, dim), np.float32)

    def reserve(self, rows: int) -> None:
        """Make room for ``rows`` rows in total (before any write, so a write cannot fail)."""
        if rows > len(self.values):
            grown = np.empty((max(rows, 2 * len(self.values)), self.dim), np.float32)
            grown[: len(self.index)] = self.values[: len(self.index)]
            self.values = grown


class OverlayStore:
    """An in-memory :class:`~hps_core.tiers.backing.BackingStore` for updated rows.

    Thread-safe: the update thread writes while request threads read; every call holds one
    lock, so a reader sees an :meth:`insert` (one update message) whole or not at all.
    """

    kind = "overlay"
    """Its label in the per-tier counters and metrics."""

    def __init__(self) -> None:
        self.errors = 0
        self._tables: dict[str, _Table] = {}
        self._lock = threading.Lock()

    def tables(self) -> list[str]:
        """The tables that received rows, sorted."""
        with self._lock:
            return sorted(self._tables)

    def rows(self, table: str) -> int:
        """Rows held for ``table`` (0 if it has none)."""
        with self._lock:
            held = self._tables.get(table)
            return 0 if held is None else len(held.index)

    def insert(self, table: str, keys: np.ndarray, vectors: np.ndarray) -> None:
        """Write rows, replacing existing ones; the last of repeated keys wins.

        Args:
            table: the table's tag.
            keys: int64 ``[n]``.
            vectors: float32 ``[n, dim]``.

        Raises:
            RequestError: the shapes disagree, or ``dim`` differs from the table's.
        """
        keys = np.ascontiguousarray(keys, dtype=np.int64).ravel()
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or len(vectors) != len(keys):
            raise RequestError(
                f"overlay {table}: {len(keys)} keys but vectors of shape {vectors.shape}"
            )
        with self._lock:
            held = self._tables.get(table)
            if held is None:
                held = _Table(vectors.shape[1])
            if held.dim != vectors.shape[1]:
                raise RequestError(
                    f"overlay {table}: rows of {vectors.shape[1]} floats, the table has {held.dim}"
                )
            # Plan every row before writing any, so an insert is applied whole.
            index = held.index
            rows = np.empty(len(keys), np.int64)
            added: dict[int, int] = {}
            next_row = len(index)
            for i, key in enumerate(keys.tolist()):
                row = index.get(key)
                if row is None:
                    row = added.get(key)
                    if row is None:
                        row = added[key] = next_row
                        next_row += 1
                rows[i] = row
            held.reserve(next_row)
            held.values[rows] = vectors  # repeated rows: NumPy keeps the last assignment
            index.update(added)
            self._tables[table] = held

    def remove(self, table: str, keys: np.ndarray) -> None:
        """Forget ``keys`` (used to undo a partly applied update); unknown keys are ignored.

        The rows stay allocated: removals are rare (undo only), so the table is not
        compacted; a removed key's row is simply no longer indexed.

        Args:
            table: the table's tag.
            keys: int64 keys.
        """
        with self._lock:
            held = self._tables.get(table)
            if held is None:
                return
            for key in np.asarray(keys, dtype=np.int64).ravel().tolist():
                held.index.pop(key, None)

    def load_sparse(self, table: str, folder: str | os.PathLike[str], dim: int) -> int:
        """Copy a sparse model folder into ``table`` (for tests; serving fills it by updates).

        Returns:
            Rows written.
        """
        return copy_sparse_folder(self, table, folder, dim)

    def lookup(
        self, table: str, keys: np.ndarray, dim: int, default: float = 0.0
    ) -> tuple[np.ndarray, np.ndarray]:
        """float32 ``[n, dim]`` vectors (``default`` where missing) and a bool found mask.

        Args:
            table: the table's tag.
            keys: int64 keys, any order, repeats allowed.
            dim: floats per vector.
            default: value of every element of a missing key's vector.

        Returns:
            ``(values, found)``.
        """
        keys = np.ascontiguousarray(keys, dtype=np.int64).ravel()
        values = np.full((len(keys), dim), default, np.float32)
        with self._lock:
            held = self._tables.get(table)
            if held is None or not held.index or not len(keys):
                return values, np.zeros(len(keys), bool)
            get = held.index.get
            rows = np.fromiter((get(k, -1) for k in keys.tolist()), np.int64, len(keys))
            found = rows >= 0
            if found.any():
                values[found] = held.values[rows[found], :dim]
        return values, found

    def close(self) -> None:
        """Drop every row (idempotent)."""
        with self._lock:
            self._tables.clear()
