"""The model's own sparse files as the last tier of a cascade: rows read in place, by key.

A Redis cluster without RocksDB below it is the only copy of a table that the server reads
(the shared host tier is empty, as HugeCTR's volatile level is the cluster). When a node is
lost, or comes back empty, its keys are nowhere else: HugeCTR answers them with the default
vector, status OK. Here the sparse files the cluster was filled from answer them instead:
:class:`ModelFileRows` finds a key's row in the files through an index built once per machine
(``mix64`` hashes sorted, their bucket directory and each one's row in the files, about 14
bytes a row in a shared segment: the host tier's index, :mod:`hps_core.tiers.hash_layout`)
and reads the row from ``emb_vector`` in place (a read-only mapping of a local file: the
page cache keeps what is read often; a URI's file is read row by row).

The files must not change under a running server: each lookup compares their identity (path,
size, modification time, inode) with the one indexed, and a changed file makes the tier
unavailable (the request fails naming it) rather than answer rows of another version.
"""

from __future__ import annotations

import hashlib
import mmap
from pathlib import Path

import numpy as np

from hps_core.errors import ModelFileError, TierUnavailableError
from hps_core.formats.sparse import KEY_FILE, VECTOR_FILE, inspect_sparse_table, read_keys
from hps_core.formats.uris import ModelPath, model_path
from hps_core.hashing import unmix64
from hps_core.tiers.hash_layout import (
    DuplicateKeysError,
    HashLayout,
    build_index,
    entry_rows,
    find_rows,
)
from hps_core.tiers.host_table import LAYOUT_VERSION
from hps_core.tiers.shm_segment import SharedSegment, file_identity

KIND = "model_files"
"""The tier's label in counters and metrics."""


def index_layout(rows: int, dim: int) -> HashLayout:
    """The layout of a sparse folder's key index: the host tier's, without the rows.

    Example:
        >>> index_layout(1000, 16).nbytes <= 1000 * 14 + 3 * 64
        True
    """
    return HashLayout(rows, dim, positions=True, values=False)


def index_name(sparse_dir: ModelPath, dim: int) -> str:
    """The shared segment name of a sparse folder's key index (its files' identity)."""
    parts = [
        f"file-index-v{LAYOUT_VERSION}",
        f"dim={dim}",
        file_identity(sparse_dir / KEY_FILE),
        file_identity(sparse_dir / VECTOR_FILE),
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


class ModelFileRows:
    """A sparse model folder as a read-only :class:`~hps_core.tiers.backing.BackingStore`.

    Answers any table name with the folder's rows (a cascade gives each table its own).

    Args:
        sparse_dir: HugeCTR sparse model folder (``key`` + ``emb_vector``), local or a URI.
        dim: embedding vector size.

    Example:
        >>> files = ModelFileRows(Path("t0"), dim=16)  # doctest: +SKIP
        >>> values, found = files.lookup("t0", np.array([3, 9], np.int64), 16)  # doctest: +SKIP
    """

    kind = KIND
    errors = 0

    def __init__(self, sparse_dir: ModelPath | str, dim: int) -> None:
        self.sparse_dir = model_path(sparse_dir)
        self.dim = dim
        self.rows = inspect_sparse_table(self.sparse_dir, dim).rows
        self._identity = self._files_identity()
        self.layout = index_layout(self.rows, dim)
        self._segment = SharedSegment.open(
            index_name(self.sparse_dir, dim),
            self.layout.nbytes,
            self._build,
            sources=(self.sparse_dir / KEY_FILE, self.sparse_dir / VECTOR_FILE),
        )
        buffer = self._segment.buffer if self._segment.buffer is not None else bytearray(0)
        self._hashes, self._starts, self._positions, _ = self.layout.views(buffer)
        self._vectors: np.ndarray | None = None
        self._map: mmap.mmap | None = None
        if isinstance(self.sparse_dir, Path) and self.rows:
            with open(self.sparse_dir / VECTOR_FILE, "rb") as stream:
                self._map = mmap.mmap(stream.fileno(), 0, mmap.MAP_SHARED, mmap.PROT_READ)
            self._vectors = np.frombuffer(self._map, np.float32, self.rows * dim).reshape(
                self.rows, dim
            )

    @property
    def index_nbytes(self) -> int:
        """Bytes of shared memory the key index takes."""
        return self.layout.nbytes

    def _files_identity(self) -> tuple[str, str]:
        return (
            file_identity(self.sparse_dir / KEY_FILE),
            file_identity(self.sparse_dir / VECTOR_FILE),
        )

    def _build(self, buffer: mmap.mmap) -> None:
        keys = read_keys(self.sparse_dir, self.rows)
        try:
            build_index(self.layout, self.layout.views(buffer), keys)
        except DuplicateKeysError as exc:
            raise ModelFileError(f"{self.sparse_dir / KEY_FILE}: {exc}") from None

    def tables(self) -> list[str]:
        """Nothing is stored by name here."""
        return []

    def keys(self) -> np.ndarray:
        """Every key of the files (int64, in the index's order, not the files')."""
        return unmix64(self._hashes[: self.rows])

    def lookup(
        self, table: str, keys: np.ndarray, dim: int, default: float = 0.0
    ) -> tuple[np.ndarray, np.ndarray]:
        """The files' vectors of ``keys``.

        Args:
            table: ignored (the folder is one table).
            keys: int64 ``[n]``, any order, repeats allowed.
            dim: floats per vector (the folder's).
            default: every float of a key the files do not hold.

        Returns:
            float32 ``[n, dim]`` vectors and a bool ``[n]`` mask of the keys found.

        Raises:
            TierUnavailableError: the files changed since the index was built (or vanished).
        """
        if dim != self.dim:
            raise ValueError(f"{self.sparse_dir}: dim {dim} asked of a table of dim {self.dim}")
        try:
            changed = self._files_identity() != self._identity
        except OSError as exc:
            changed, why = True, f"cannot be read ({exc.strerror or exc})"
        else:
            why = "changed since the server loaded them"
        if changed:
            raise TierUnavailableError(
                f"model files {self.sparse_dir}: {why}; `hps reload` serves the new files"
            )
        keys = np.ascontiguousarray(keys, dtype=np.int64).ravel()
        out = np.full((len(keys), dim), default, np.float32)
        rows = entry_rows(self._positions, find_rows(self.layout, self._hashes, self._starts, keys))
        found = rows >= 0
        if found.any():
            out[found] = self._read(rows[found])
        return out, found

    def _read(self, rows: np.ndarray) -> np.ndarray:
        if self._vectors is not None:
            return self._vectors[rows]
        width = self.dim * 4
        out = np.empty((len(rows), self.dim), np.float32)
        with (self.sparse_dir / VECTOR_FILE).open_input_file() as stream:
            for i, row in enumerate(rows.tolist()):
                out[i] = np.frombuffer(stream.read_at(width, row * width), np.float32)
        return out

    def close(self) -> None:
        """Unmap the files and detach from the index (idempotent)."""
        self._vectors = None
        self._hashes = self._starts = self._positions = np.empty(0, np.int64)
        if self._map is not None:
            self._map.close()
            self._map = None
        self._segment.close()
