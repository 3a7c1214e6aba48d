"""Redis and RocksDB tables holding a compressed table's stored rows instead of FP32 vectors.

HugeCTR's layout in both databases is a vector of ``dim`` float32 per key, and by default
the lower tiers keep it, so that HugeCTR can share the databases. With ``store_compressed``
(``volatile_db`` and ``persistent_db``, an extension of this project, see
:mod:`hps_core.config.parse`) a table stored ``fp16``, ``int8`` or ``fp8`` is written there
as the host tier and the GPU caches hold it: ``row_bytes`` bytes per key
(:class:`~hps_core.quant.rows.RowFormat`), encoded once from the FP32 source as the host
tier encodes its rows, so a key answers the same whichever tier holds it. Such a table is
named :func:`encoded_tag` (the precision appended to HPS's tag), so that HugeCTR, or a server
configured without ``store_compressed``, never reads compressed bytes as FP32 vectors of the
same name; an FP32 table is stored as HugeCTR stores it, under its usual tag.

The databases store a value as its bytes; :class:`EncodedRows` hands them the stored rows
viewed as float32 (``row_words`` 4-byte words, bits unchanged) and views what they return
back, so neither database module knows about precisions.
"""

from __future__ import annotations

import os

import numpy as np

from hps_core.quant import RowFormat, StoragePrecision
from hps_core.tiers.backing import BackingStore, copy_sparse_folder


def encoded_tag(tag: str, precision: StoragePrecision) -> str:
    """The name a database stores a table's compressed rows under.

    Example:
        >>> encoded_tag("hps_et.dlrm.t0", StoragePrecision.FP16)
        'hps_et.dlrm.t0@fp16'
    """
    return f"{tag}@{precision.value}"


def other_copies(names: list[str], tag: str, used: str) -> list[str]:
    """The tables of a database listing (``names``) that hold ``tag``'s rows under another
    name than ``used``: FP32 under ``tag`` or compressed under ``tag@precision``, left by an
    earlier ``storage`` or ``store_compressed`` setting.

    Example:
        >>> other_copies(["hps_et.m.t", "hps_et.m.t@fp16", "hps_et.m.t2"], "hps_et.m.t",
        ...              "hps_et.m.t@fp16")
        ['hps_et.m.t']
    """
    return sorted(name for name in names if name.partition("@")[0] == tag and name != used)


class EncodedRows:
    """A :class:`~hps_core.tiers.backing.BackingStore` whose tables hold stored rows of one
    precision, over a Redis or RocksDB store (shared by every table of the database).

    Like :class:`~hps_core.tiers.overlay.OverlayStore`: :meth:`insert` takes FP32 vectors and
    encodes them once, :meth:`lookup` answers decoded vectors, :meth:`lookup_stored` and
    :meth:`insert_stored` move the stored rows themselves (what the GPU caches take, and what
    is written up from RocksDB to Redis, never encoded again from decoded values).

    Args:
        store: the database.
        precision: the tables' storage precision (not fp32).

    Example:
        >>> rows = EncodedRows(store, StoragePrecision.INT8)  # doctest: +SKIP
        >>> rows.insert("hps_et.m.t0@int8", keys, vectors)  # doctest: +SKIP
        >>> stored, found = rows.lookup_stored("hps_et.m.t0@int8", keys, dim=16)  # doctest: +SKIP
    """

    stores_encoded = True
    """Lookups through :meth:`lookup_stored` give rows in the table's precision."""

    def __init__(self, store: BackingStore, precision: StoragePrecision) -> None:
        if precision is StoragePrecision.FP32:
            raise ValueError("an fp32 table is stored as FP32 vectors: use the store itself")
        self.store = store
        self.precision = precision

    @property
    def kind(self) -> str:
        """The database's kind (``redis_cluster``, ``rocks_db``)."""
        return self.store.kind

    @property
    def errors(self) -> int:
        """The database's failed requests."""
        return self.store.errors

    @property
    def reports_unanswered(self) -> bool:
        """Whether lookups say which keys the database did not answer (a Redis cluster)."""
        return bool(getattr(self.store, "reports_unanswered", False))

    def failure_reason(self) -> str:
        """The database's :meth:`~hps_core.tiers.redis_store.RedisClusterStore.failure_reason`
        (empty for a store that keeps none)."""
        reason = getattr(self.store, "failure_reason", None)
        return reason() if reason is not None else ""

    def tables(self) -> list[str]:
        """The database's tables, sorted."""
        return self.store.tables()

    def insert(self, table: str, keys: np.ndarray, vectors: np.ndarray) -> None:
        """Encode float32 ``[n, dim]`` vectors and write them under int64 ``[n]`` keys."""
        vectors = np.asarray(vectors, dtype=np.float32)
        stored = RowFormat(self.precision, vectors.shape[1]).encode_stored(vectors)
        self.store.insert(table, keys, stored.view(np.float32))

    def insert_missing(self, table: str, keys: np.ndarray, vectors: np.ndarray) -> None:
        """:meth:`insert` of the keys ``table`` does not hold (the store's ``insert_missing``)."""
        vectors = np.asarray(vectors, dtype=np.float32)
        stored = RowFormat(self.precision, vectors.shape[1]).encode_stored(vectors)
        self.store.insert_missing(table, keys, stored.view(np.float32))

    def insert_stored(
        self, table: str, keys: np.ndarray, stored: np.ndarray, dim: int, replace: bool = True
    ) -> None:
        """Write stored rows (``[n, row_words]`` uint32 words) as they are; with ``replace``
        false, only under the keys ``table`` does not hold."""
        fmt = RowFormat(self.precision, dim)
        stored = np.ascontiguousarray(stored, dtype=fmt.stored_dtype)
        if stored.ndim != 2 or stored.shape[1] != fmt.row_words:
            raise ValueError(
                f"stored rows of {fmt} must be [n, {fmt.row_words}], got {stored.shape}"
            )
        write = self.store.insert if replace else self.store.insert_missing
        write(table, keys, stored.view(np.float32))

    def load_sparse(self, table: str, folder: str | os.PathLike[str], dim: int) -> int:
        """Copy a HugeCTR sparse model folder into ``table``, encoding it chunk by chunk."""
        return copy_sparse_folder(self, table, folder, dim)

    def lookup_stored(
        self, table: str, keys: np.ndarray, dim: int, **unanswered: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The stored rows of ``keys`` (uint32 ``[n, row_words]``, zero where missing) and a
        bool found mask; ``unanswered=mask`` goes to a store that :attr:`reports_unanswered`."""
        fmt = RowFormat(self.precision, dim)
        words, found = self.store.lookup(table, keys, fmt.row_words, 0.0, **unanswered)
        stored = np.ascontiguousarray(words).view(fmt.stored_dtype)
        stored[~found] = 0
        return stored, found

    def lookup(
        self, table: str, keys: np.ndarray, dim: int, default: float = 0.0, **unanswered: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Decoded float32 ``[n, dim]`` vectors (``default`` where missing) and the found
        mask; ``unanswered`` as :meth:`lookup_stored`."""
        stored, found = self.lookup_stored(table, keys, dim, **unanswered)
        values = np.full((len(found), dim), default, np.float32)
        if found.any():
            values[found] = RowFormat(self.precision, dim).decode_stored(stored[found])
        return values, found

    def close(self) -> None:
        """Nothing: the database is closed by its owner."""
