"""What a tier below the shared host tier offers the lookup cascade.

HugeCTR's hierarchy is GPU cache -> volatile database -> persistent database. Here the
volatile level is the shared host tier (:mod:`hps_core.tiers.host_table`) and, when ps.json
asks for ``redis_cluster``, a Redis cluster below it; the persistent level is RocksDB
(:mod:`hps_core.tiers.rocks_store`). Both lower tiers name a table by HPS's tag
(:func:`table_tag`) and store float32 vectors under int64 keys.
"""

from __future__ import annotations

import os
from typing import Protocol

import numpy as np

from hps_core.formats.sparse import iter_sparse_table


def table_tag(model: str, table: str) -> str:
    """The name a lower tier stores a model's table under: HPS's ``hps_et.<model>.<table>``.

    Example:
        >>> table_tag("dlrm", "sparse_embedding1")
        'hps_et.dlrm.sparse_embedding1'
    """
    return f"hps_et.{model}.{table}"


def key_bytes(keys: np.ndarray) -> list[bytes]:
    """Each int64 key as its 8 little-endian bytes: how HugeCTR's Redis and RocksDB backends
    store a key (and so how ours do).

    Example:
        >>> key_bytes(np.array([1, -1], dtype=np.int64))
        [b'\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00', b'\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xff']
    """
    raw = np.ascontiguousarray(keys, dtype="<i8").tobytes()
    return [raw[i : i + 8] for i in range(0, len(raw), 8)]


class BackingStore(Protocol):
    """A key-value tier of embedding tables below the shared host tier."""

    kind: str
    """The ps.json type it serves (``redis_cluster``, ``rocks_db``): its label in metrics."""

    errors: int
    """Requests that failed since it opened (a node down, a timeout); counted, not raised."""

    def tables(self) -> list[str]:
        """The tables it holds, sorted."""
        ...

    def insert(self, table: str, keys: np.ndarray, vectors: np.ndarray) -> None:
        """Write rows (int64 ``[n]``, float32 ``[n, dim]``), replacing existing ones."""
        ...

    def load_sparse(self, table: str, folder: str | os.PathLike[str], dim: int) -> int:
        """Copy a HugeCTR sparse model folder into ``table``; returns the rows written."""
        ...

    def lookup(
        self, table: str, keys: np.ndarray, dim: int, default: float = 0.0
    ) -> tuple[np.ndarray, np.ndarray]:
        """float32 ``[n, dim]`` vectors (``default`` where missing) and a bool found mask.

        Keys the tier cannot answer (their node is down) are reported not found and the
        failure is counted in :attr:`errors`; the lookup goes on below.

        Raises:
            TierUnavailableError: no part of the tier answered.
        """
        ...

    def close(self) -> None:
        """Release connections and handles (idempotent)."""
        ...


def copy_sparse_folder(
    store: BackingStore, table: str, folder: str | os.PathLike[str], dim: int
) -> int:
    """Insert a HugeCTR sparse model folder into ``store`` chunk by chunk (what each store's
    ``load_sparse`` does; the chunks bound the memory a large table needs).

    Args:
        store: the tier to fill.
        table: the table's name there.
        folder: the sparse model folder (local path or URI).
        dim: floats per vector.

    Returns:
        Rows written.

    Raises:
        ModelFileError: the folder is invalid or ends early.
    """
    rows = 0
    for chunk in iter_sparse_table(folder, dim):
        store.insert(table, chunk.keys, chunk.vectors)
        rows += chunk.keys.shape[0]
    return rows
