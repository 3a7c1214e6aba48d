"""The persistent tier: embedding tables in a RocksDB database (ps.json ``persistent_db`` of
type ``rocks_db``), through ``rocksdict``.

The layout is HugeCTR's (``HugeCTR/src/hps/rocksdb_backend.cpp``), so a database written by
either can be read by the other: one column family per table, named with HPS's tag
``hps_et.<model>.<table>``; a key is the 8 bytes of the int64 key (little-endian); a value
is the ``dim`` float32 of the vector (little-endian). Reads and writes go in batches of at most
``max_batch_size`` keys (one ``MultiGet`` or one ``WriteBatch`` each).

This module is the tier itself (open, load a sparse model folder, insert, look up, drop a
table); :mod:`hps_core.tiers.factory` loads each table once per database and opens it
read-only in every serving process, and :mod:`hps_core.tiers.cascade` reads it below the
shared host tier.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from hps_core.config import PersistentDBConfig
from hps_core.errors import ModelFileError, RequestError
from hps_core.tiers.backing import copy_sparse_folder, key_bytes

_KEY = np.dtype("<i8")
_VALUE = np.dtype("<f4")


class RocksStore:
    """A RocksDB database of embedding tables, one column family each (a :class:`BackingStore`).

    Args:
        config: ps.json ``persistent_db`` (``path``, ``read_only``, ``num_threads``,
            ``max_batch_size``). A writable database is created where missing; a read-only
            one must exist.

    Raises:
        ModelFileError: the database cannot be opened (missing for ``read_only``, not a
            RocksDB folder, corrupt), naming the path and RocksDB's reason.

    Example:
        >>> with RocksStore(config) as store:  # doctest: +SKIP
        ...     store.load_sparse("hps_et.dlrm.t0", "0_sparse_model", dim=128)
        ...     vectors, found = store.lookup("hps_et.dlrm.t0", keys, dim=128)
    """

    def __init__(self, config: PersistentDBConfig) -> None:
        from rocksdict import AccessType, Rdict  # here: only models with a persistent tier

        self.kind = "rocks_db"
        self.errors = 0

        self.path = Path(config.path)
        self.read_only = config.read_only
        self.max_batch_size = config.max_batch_size
        if self.max_batch_size < 1:
            raise ModelFileError(
                f"persistent_db.max_batch_size must be at least 1, got {self.max_batch_size}"
            )
        exists = (self.path / "CURRENT").is_file()
        if self.read_only and not exists:
            raise ModelFileError(
                f"persistent_db.path '{self.path}': no RocksDB database there (a read_only "
                "database is opened, never created)"
            )
        options = self._options(config.num_threads)
        try:
            families = Rdict.list_cf(str(self.path), options) if exists else ["default"]
            self._db = Rdict(
                str(self.path),
                options,
                column_families={name: self._options() for name in families},
                access_type=AccessType.read_only() if self.read_only else AccessType.read_write(),
            )
        except Exception as exc:  # rocksdict raises bare Exception with RocksDB's status
            raise ModelFileError(f"persistent_db.path '{self.path}': {exc}") from exc
        self._families: dict[str, Any] = {
            name: self._db.get_column_family(name) for name in families if name != "default"
        }

    @staticmethod
    def _options(threads: int | None = None) -> Any:
        from rocksdict import Options

        options = Options(raw_mode=True)
        options.create_if_missing(True)
        # As HugeCTR's backend: tuned for point lookups (hash index, bloom filter, 8 MB block
        # cache), level-style compaction: 1.6-1.9x the lookup rate of default options here.
        options.optimize_for_point_lookup(8)
        options.optimize_level_style_compaction(512 << 20)  # RocksDB's default budget
        if threads is not None:
            options.increase_parallelism(max(1, min(threads, os.cpu_count() or 1)))
        return options

    def tables(self) -> list[str]:
        """The tables (column families) in the database, sorted."""
        return sorted(self._families)

    def insert(self, table: str, keys: np.ndarray, vectors: np.ndarray) -> None:
        """Write rows, replacing any stored under the same keys; the table is created if new.

        Args:
            table: column family, e.g. :func:`table_tag`.
            keys: int64 ``[n]``.
            vectors: float32 ``[n, dim]``.

        Raises:
            RequestError: the database is read-only, or the shapes disagree.
        """
        from rocksdict import WriteBatch

        if self.read_only:
            raise RequestError(f"persistent_db '{self.path}' is read_only: cannot insert")
        keys = np.ascontiguousarray(keys, dtype=_KEY)
        vectors = np.ascontiguousarray(vectors, dtype=_VALUE)
        if vectors.ndim != 2 or vectors.shape[0] != keys.shape[0]:
            raise RequestError(
                f"table '{table}': {keys.shape[0]} keys need vectors [n, dim], got {vectors.shape}"
            )
        self._family(table, create=True)
        handle = self._db.get_column_family_handle(table)
        for start in range(0, keys.shape[0], self.max_batch_size):
            stop = start + self.max_batch_size
            batch = WriteBatch(raw_mode=True)
            batch.set_default_column_family(handle)
            for key, value in zip(key_bytes(keys[start:stop]), vectors[start:stop], strict=True):
                batch.put(key, value.tobytes())
            self._db.write(batch)

    def load_sparse(self, table: str, folder: str | os.PathLike[str], dim: int) -> int:
        """Copy a HugeCTR sparse model folder (``key``, ``emb_vector``) into ``table``.

        Args:
            table: column family to fill (created if new).
            folder: the sparse model folder (local path or URI).
            dim: floats per vector.

        Returns:
            Rows written.

        Raises:
            ModelFileError: the folder is invalid or ends early.
        """
        return copy_sparse_folder(self, table, folder, dim)

    def lookup(
        self, table: str, keys: np.ndarray, dim: int, default: float = 0.0
    ) -> tuple[np.ndarray, np.ndarray]:
        """The stored vectors of ``keys``.

        Args:
            table: column family to read.
            keys: int64 ``[n]``, any order, repeats allowed.
            dim: floats per vector.
            default: the value of every float of a key not stored.

        Returns:
            float32 ``[n, dim]`` vectors and a bool ``[n]`` mask of the keys found.

        Raises:
            RequestError: the database has no such table (the message lists those it has).
            ModelFileError: a stored value is not ``dim`` floats long.
        """
        keys = np.ascontiguousarray(keys, dtype=_KEY)
        family = self._family(table, create=False)
        out = np.full((keys.shape[0], dim), default, dtype=np.float32)
        found = np.zeros(keys.shape[0], dtype=bool)
        width = dim * _VALUE.itemsize
        for start in range(0, keys.shape[0], self.max_batch_size):
            values = family.get(key_bytes(keys[start : start + self.max_batch_size]))
            hits = [i for i, value in enumerate(values) if value is not None]
            stored = b"".join(values[i] for i in hits)
            if len(stored) != len(hits) * width:
                self._wrong_width(table, keys[start:], values, width, dim)
            rows = np.asarray(hits, dtype=np.int64) + start
            out[rows] = np.frombuffer(stored, dtype=_VALUE).reshape(len(hits), dim)
            found[rows] = True
        return out, found

    def _wrong_width(
        self, table: str, keys: np.ndarray, values: list[bytes | None], width: int, dim: int
    ) -> None:
        for key, value in zip(keys.tolist(), values, strict=False):
            if value is not None and len(value) != width:
                raise ModelFileError(
                    f"persistent_db '{self.path}', table '{table}': key {key} holds "
                    f"{len(value)} bytes, dim {dim} needs {width}"
                )

    def _family(self, table: str, create: bool) -> Any:
        family = self._families.get(table)
        if family is not None:
            return family
        if not create:
            raise RequestError(
                f"persistent_db '{self.path}' has no table '{table}'; it has: "
                f"{', '.join(self.tables()) or 'none'}"
            )
        family = self._db.create_column_family(table, self._options())
        self._families[table] = family
        return family

    def drop_table(self, table: str) -> None:
        """Remove a table (column family) and all its rows; nothing if it does not exist.

        The lookup cascade reloads a table whose sparse files changed: rows of the old files
        must not outlive them.

        Raises:
            RequestError: the database is read-only.
        """
        if self.read_only:
            raise RequestError(f"persistent_db '{self.path}' is read_only: cannot drop a table")
        if self._families.pop(table, None) is not None:
            self._db.drop_column_family(table)

    def flush(self) -> None:
        """Write every table's memtable to disk, so that read-only openers see it in files."""
        for family in self._families.values():
            family.flush()
        self._db.flush()

    def close(self) -> None:
        """Flush and close the database (idempotent)."""
        if self._db is not None:
            self._families.clear()
            self._db.close()
            self._db = None

    def __enter__(self) -> RocksStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
