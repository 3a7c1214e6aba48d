"""Writing HugeCTR sparse model folders (``key`` + ``emb_vector``), streamed and atomic.

Rows are appended to hidden temporary files in the target folder; only :meth:`commit` gives
them their real names (``os.replace``), so a reader never sees a half-written file, and a
failed conversion leaves an existing table untouched. The two renames are two steps: a reader
that inspects the folder exactly between them sees a size mismatch, never wrong data.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from types import TracebackType

import numpy as np

from hps_core.errors import OVERWRITE_HINT, ModelFileError
from hps_core.formats.keys import check_unique_keys
from hps_core.formats.sparse import (
    KEY_DTYPE,
    KEY_FILE,
    META_FILE,
    SLOT_ID_FILE,
    VECTOR_DTYPE,
    VECTOR_FILE,
)

# Files that describe the rows of a previous table in the folder; they would no longer
# match the new one, so overwriting a table removes them.
_STALE_COMPANIONS = (SLOT_ID_FILE, META_FILE)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SparseTableWriter:
    """Streams rows into a new sparse model folder; use as a context manager.

    Leaving the ``with`` block normally commits the files; leaving it by an exception
    removes the temporary files and keeps whatever the folder held before.

    Args:
        path: the sparse model folder; created (with parents) if missing.
        overwrite: replace a table already in the folder (and drop its stale ``slot_id``
            and ``meta`` files); otherwise an existing table is an error.

    Example:
        >>> with SparseTableWriter("out/0_sparse_model") as writer:  # doctest: +SKIP
        ...     for keys, vectors in batches:
        ...         writer.append(keys, vectors)
    """

    def __init__(self, path: str | os.PathLike[str], overwrite: bool = False) -> None:
        self.path = Path(path)
        self.rows = 0
        self.dim: int | None = None
        if self.path.exists() and not self.path.is_dir():
            raise ModelFileError(f"{self.path}: exists and is not a folder")
        existing = [self.path / n for n in (KEY_FILE, VECTOR_FILE) if (self.path / n).exists()]
        if existing and not overwrite:
            raise ModelFileError(
                f"{existing[0]}: already exists; refusing to overwrite a sparse table; "
                f"{OVERWRITE_HINT} it"
            )
        self._created_folder = not self.path.exists()
        token = f"{os.getpid()}-{secrets.token_hex(4)}"
        self._tmp_key = self.path / f".{KEY_FILE}.tmp-{token}"
        self._tmp_vec = self.path / f".{VECTOR_FILE}.tmp-{token}"
        self._open = False
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._key_file = open(self._tmp_key, "wb")  # noqa: SIM115 - closed in commit/abort
            try:
                self._vec_file = open(self._tmp_vec, "wb")  # noqa: SIM115 - as above
            except BaseException:
                self._key_file.close()
                raise
        except OSError as exc:
            self.abort()
            raise ModelFileError(f"{self.path}: cannot create the table files: {exc}") from exc
        self._open = True

    def append(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        """Append rows at the end of the table.

        Args:
            keys: int64 array ``[n]``.
            vectors: float32 array ``[n, dim]``; ``dim`` must be the same for every call.

        Raises:
            ModelFileError: wrong dtype, shape, or a ``dim`` different from earlier rows.
        """
        _check_rows(self.path, keys, vectors)
        dim = int(vectors.shape[1])
        if self.dim is None:
            self.dim = dim
        elif dim != self.dim:
            raise ModelFileError(
                f"{self.path}: vectors of dim {dim} appended to a table of dim {self.dim}"
            )
        try:
            keys.astype(KEY_DTYPE, copy=False).tofile(self._key_file)
            np.ascontiguousarray(vectors, VECTOR_DTYPE).tofile(self._vec_file)
        except OSError as exc:
            raise ModelFileError(f"{self.path}: cannot write the table files: {exc}") from exc
        self.rows += int(keys.shape[0])

    def keys_written(self) -> np.ndarray:
        """Map the keys appended so far (read-only), e.g. to check them before committing.

        Returns:
            int64 array ``[rows]`` backed by the temporary key file.
        """
        self._key_file.flush()
        if self.rows == 0:
            return np.empty(0, KEY_DTYPE)
        return np.memmap(self._tmp_key, KEY_DTYPE, mode="r", shape=(self.rows,))

    def commit(self) -> None:
        """Flush the files to disk and give them their final names.

        Committing twice (explicitly, then by leaving the ``with`` block) is harmless.

        Raises:
            ModelFileError: the disk refused the data (full, read-only, ...).
        """
        if not self._open:
            return
        try:
            for f in (self._key_file, self._vec_file):
                f.flush()
                os.fsync(f.fileno())
                f.close()
            self._open = False
            for name in _STALE_COMPANIONS:
                (self.path / name).unlink(missing_ok=True)
            os.replace(self._tmp_vec, self.path / VECTOR_FILE)
            os.replace(self._tmp_key, self.path / KEY_FILE)
            _fsync_dir(self.path)
        except OSError as exc:
            raise ModelFileError(f"{self.path}: cannot write the table files: {exc}") from exc

    def abort(self) -> None:
        """Drop the temporary files; the folder keeps what it held before.

        A folder this writer created is removed again if nothing else appeared in it.
        """
        if self._open:
            self._key_file.close()
            self._vec_file.close()
            self._open = False
        # Cleaning up must not hide the error that made the caller abort.
        with contextlib.suppress(OSError):
            self._tmp_key.unlink(missing_ok=True)
            self._tmp_vec.unlink(missing_ok=True)
            if self._created_folder and not any(self.path.iterdir()):
                self.path.rmdir()

    def __enter__(self) -> SparseTableWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            try:
                self.commit()
            except BaseException:
                self.abort()
                raise
        else:
            self.abort()


def _check_rows(where: Path, keys: np.ndarray, vectors: np.ndarray) -> None:
    if not isinstance(keys, np.ndarray) or keys.dtype != np.int64 or keys.ndim != 1:
        raise ModelFileError(f"{where}: keys must be a 1-D int64 array, got {_describe(keys)}")
    if not isinstance(vectors, np.ndarray) or vectors.dtype != np.float32 or vectors.ndim != 2:
        raise ModelFileError(
            f"{where}: vectors must be a 2-D float32 array, got {_describe(vectors)}"
        )
    if vectors.shape[0] != keys.shape[0]:
        raise ModelFileError(f"{where}: {keys.shape[0]} keys but {vectors.shape[0]} vectors")
    if vectors.shape[1] < 1:
        raise ModelFileError(f"{where}: vectors have dim 0; dim must be at least 1")


def _describe(array: object) -> str:
    if isinstance(array, np.ndarray):
        return f"{array.dtype} array of shape {array.shape}"
    return type(array).__name__


def write_sparse_table(
    path: str | os.PathLike[str],
    keys: np.ndarray,
    vectors: np.ndarray,
    overwrite: bool = False,
    check_unique: bool = True,
) -> None:
    """Write a whole table as a HugeCTR sparse model folder.

    Args:
        path: the folder to write; created (with parents) if missing.
        keys: int64 array ``[rows]``.
        vectors: float32 array ``[rows, dim]``, row ``i`` belonging to ``keys[i]``.
        overwrite: replace a table already in the folder.
        check_unique: refuse keys that appear more than once.

    Raises:
        ModelFileError: wrong dtype or shape, duplicate keys, or an existing table without
            ``overwrite``; the folder is left as it was.

    Example:
        >>> write_sparse_table("out/0_sparse_model", np.arange(4), np.zeros((4, 8), np.float32))
        ... # doctest: +SKIP
    """
    where = Path(path)
    _check_rows(where, keys, vectors)
    if check_unique:
        check_unique_keys(keys, str(where))
    with SparseTableWriter(where, overwrite=overwrite) as writer:
        writer.append(keys, vectors)
