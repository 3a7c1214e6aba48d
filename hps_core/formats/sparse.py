"""Reading HugeCTR sparse model folders (``0_sparse_model/`` and the like).

A sparse model folder holds one embedding table as two raw files, without any header:

- ``key``: the keys, int64 little-endian, one per row;
- ``emb_vector``: the vectors, float32 little-endian, row-major, ``dim`` floats per row, in
  the same order as ``key``.

Nothing in the folder records ``dim``: HugeCTR takes it from ps.json
(``embedding_vecsize_per_table``), so here it is either given and checked against the file
sizes, or inferred from them. Other files that HugeCTR may leave next to these are ignored:
``slot_id`` (one ``size_t`` per key, written by localized-slot embeddings in training),
``meta`` (one int64 per key, read by HPS only for its UVM/threshold loading) and optimizer
states (``Adam.m``, ``Ftrl.n``, ...). ``slot_id`` is reported by :func:`inspect_sparse_table`.

Unlike HugeCTR's HPS loader, which rejects empty files and never compares the two file
sizes, an empty table (0 rows) is valid here and ``emb_vector`` must hold exactly
``rows * dim`` floats, so a truncated file is an error rather than silently shifted rows.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from io import RawIOBase
from pathlib import Path
from typing import NamedTuple

import numpy as np

from hps_core.errors import ModelFileError
from hps_core.formats.progress import RowProgress, wants_progress
from hps_core.formats.uris import ModelPath, model_path
from hps_core.wording import plural

logger = logging.getLogger(__name__)

KEY_FILE = "key"
VECTOR_FILE = "emb_vector"
SLOT_ID_FILE = "slot_id"
META_FILE = "meta"
# On-disk dtypes are little-endian whatever the host, as HugeCTR writes them on x86/ARM.
KEY_DTYPE = np.dtype("<i8")
VECTOR_DTYPE = np.dtype("<f4")

# Rows per chunk are chosen so that one chunk of keys + vectors is about this large.
DEFAULT_CHUNK_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class SparseTableInfo:
    """What the file sizes of a sparse model folder say about its table.

    Args:
        path: the folder.
        rows: number of keys (and vectors).
        dim: floats per vector.
        key_bytes: size of ``key``.
        vector_bytes: size of ``emb_vector``.
        has_slot_id: whether a ``slot_id`` file is present (it is ignored).
    """

    path: Path
    rows: int
    dim: int
    key_bytes: int
    vector_bytes: int
    has_slot_id: bool

    @property
    def total_bytes(self) -> int:
        """Bytes of keys and vectors together: the table's size on disk and in memory."""
        return self.key_bytes + self.vector_bytes


class SparseChunk(NamedTuple):
    """A run of consecutive rows of a sparse table.

    Args:
        start_row: index of the first row of the chunk in the table.
        keys: int64 array of shape ``[n]``.
        vectors: float32 array of shape ``[n, dim]``.
    """

    start_row: int
    keys: np.ndarray
    vectors: np.ndarray


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _file_size(path: Path, what: str) -> int:
    if not path.exists():
        raise ModelFileError(
            f"{path}: missing; a sparse model folder holds '{KEY_FILE}' (int64 keys) and "
            f"'{VECTOR_FILE}' (float32 vectors), {what} is absent"
        )
    if not path.is_file():
        raise ModelFileError(f"{path}: is not a regular file ({what})")
    return path.stat().st_size


def inspect_sparse_table(path: str | os.PathLike[str], dim: int | None = None) -> SparseTableInfo:
    """Validate a sparse model folder from its file sizes, without reading the data.

    Args:
        path: the sparse model folder.
        dim: expected floats per vector; ``None`` infers it from the sizes.

    Returns:
        The table's :class:`SparseTableInfo`.

    Raises:
        ModelFileError: the folder or a file is missing, a size is not a whole number of
            elements, or the two files disagree (the message names the file and numbers).
        ValueError: ``dim`` is not a positive integer.

    Example:
        >>> info = inspect_sparse_table("model/0_sparse_model", dim=16)  # doctest: +SKIP
        >>> info.rows, info.dim
        (100000, 16)
    """
    folder = model_path(path)
    if dim is not None:
        _check_positive("dim", dim)
    if not folder.exists():
        raise ModelFileError(f"{folder}: sparse model folder does not exist")
    if not folder.is_dir():
        raise ModelFileError(
            f"{folder}: is not a folder; a sparse model is a folder holding "
            f"'{KEY_FILE}' and '{VECTOR_FILE}'"
        )
    key_path = folder / KEY_FILE
    vec_path = folder / VECTOR_FILE
    key_bytes = _file_size(key_path, "the key file")
    vector_bytes = _file_size(vec_path, "the vector file")

    if key_bytes % KEY_DTYPE.itemsize:
        raise ModelFileError(
            f"{key_path}: size {key_bytes} bytes is not a multiple of {KEY_DTYPE.itemsize} "
            f"(int64 keys); the file is truncated or not a HugeCTR key file"
        )
    rows = key_bytes // KEY_DTYPE.itemsize
    if dim is not None and rows and vector_bytes < rows * dim * VECTOR_DTYPE.itemsize:
        # The ps.json's dim is trusted: a smaller emb_vector was cut short.
        raise ModelFileError(_short_vectors_message(vec_path, rows, vector_bytes, dim))
    if vector_bytes % VECTOR_DTYPE.itemsize:
        raise ModelFileError(
            f"{vec_path}: size {vector_bytes:,} bytes is not a multiple of "
            f"{VECTOR_DTYPE.itemsize} (float32 values); the file is truncated or not a "
            f"HugeCTR emb_vector file"
        )
    floats = vector_bytes // VECTOR_DTYPE.itemsize

    if rows == 0:
        if floats:
            raise ModelFileError(
                f"{vec_path}: emb_vector holds {floats} floats but {key_path} holds 0 keys"
            )
        if dim is None:
            raise ModelFileError(
                f"{folder}: table is empty (0 keys), so its dim cannot be inferred"
            )
    else:
        per_key = f"{floats} floats for {rows} keys ({floats / rows:.2f} per key)"
        if dim is not None and floats != rows * dim:
            raise ModelFileError(_long_vectors_message(key_path, vec_path, rows, floats, dim))
        if dim is None:
            if floats % rows or floats == 0:
                raise ModelFileError(
                    f"{vec_path}: emb_vector holds {per_key}, not a whole positive number per "
                    f"key; {key_path} or emb_vector is truncated or belongs to another table"
                )
            dim = floats // rows

    slot_path = folder / SLOT_ID_FILE
    has_slot_id = slot_path.is_file()
    if has_slot_id and slot_path.stat().st_size != key_bytes:
        logger.warning(
            "%s: %d bytes for %d keys (expected %d); slot_id is ignored",
            slot_path,
            slot_path.stat().st_size,
            rows,
            key_bytes,
        )
    return SparseTableInfo(folder, rows, int(dim), key_bytes, vector_bytes, has_slot_id)


def _short_vectors_message(vec_path: Path, rows: int, vector_bytes: int, dim: int) -> str:
    """Say how much of ``emb_vector`` is missing when it is smaller than ``rows * dim`` floats.

    ``dim`` is the one the ps.json gives, so it is trusted: the file was cut short, even when
    what is left happens to be whole rows of a smaller dim (a file of dim 16 cut at exactly
    half reads as dim 8). That other dim is named second.

    Args:
        vec_path: the vector file.
        rows: keys in ``key`` (at least 1).
        vector_bytes: size of ``emb_vector``, below ``rows * dim * 4``.
        dim: the expected floats per vector.

    Returns:
        The message: the vectors (or bytes) missing, and the bytes the file holds of those its
        keys need.

    Example:
        100,000 keys of dim 16 and an ``emb_vector`` cut at half::

            .../emb_vector looks truncated, 50,000 vectors (3,200,000 bytes) short: key holds
            100,000 keys of dim 16, which need 6,400,000 bytes; emb_vector holds 3,200,000
            (50%), 50,000 vectors; or dim 16 is wrong: both files agree on dim 8
    """
    row_bytes = dim * VECTOR_DTYPE.itemsize
    expected = rows * row_bytes
    need = (
        f"{KEY_FILE} holds {rows:,} keys of dim {dim}, which need {expected:,} bytes; "
        f"emb_vector holds {vector_bytes:,} ({_percent(vector_bytes, expected)})"
    )
    if vector_bytes % row_bytes == 0:
        vec_rows = vector_bytes // row_bytes
        message = (
            f"{vec_path} looks truncated, {plural(rows - vec_rows, 'vector')} "
            f"({expected - vector_bytes:,} bytes) short: {need}, {plural(vec_rows, 'vector')}"
        )
    else:
        inside = "a float" if vector_bytes % VECTOR_DTYPE.itemsize else "a vector"
        message = (
            f"{vec_path} looks truncated, {plural(expected - vector_bytes, 'byte')} short, cut "
            f"inside {inside}: {need}"
        )
    if vector_bytes and vector_bytes % (rows * VECTOR_DTYPE.itemsize) == 0:
        other_dim = vector_bytes // (rows * VECTOR_DTYPE.itemsize)
        return f"{message}; or dim {dim} is wrong: both files agree on dim {other_dim}"
    if vector_bytes % row_bytes:
        return f"{message}; or it is not this table's file"
    return message


def _long_vectors_message(key_path: Path, vec_path: Path, rows: int, floats: int, dim: int) -> str:
    """Say which file looks wrong when ``emb_vector`` holds more than ``rows * dim`` floats.

    A vector file larger than its keys need is no cut ``emb_vector``. When both files are
    whole rows of another dim, a ps.json dim smaller than the files' is the common mistake,
    said first, and a ``key`` file cut short second; otherwise whole vectors of ``dim`` mean
    the key file was cut.

    Args:
        key_path: the key file.
        vec_path: the vector file.
        rows: keys in ``key`` (at least 1).
        floats: floats in ``emb_vector``, more than ``rows * dim``.
        dim: the expected floats per vector.

    Returns:
        The message, the likeliest cause first.
    """
    per_key = f"emb_vector holds {floats:,} floats for {rows:,} keys ({floats / rows:.2f} per key)"
    other_dim = floats // rows if floats % rows == 0 else None
    wrong_dim = (
        f"{vec_path}: dim {dim} does not match: {per_key}; the two files agree on dim {other_dim}"
    )
    if floats % dim:
        if other_dim is not None:
            return wrong_dim
        expected = rows * dim * VECTOR_DTYPE.itemsize
        return (
            f"{vec_path}: {floats * VECTOR_DTYPE.itemsize - expected:,} bytes more than "
            f"{rows:,} keys of dim {dim} need ({expected:,}), not whole vectors; {per_key}"
        )
    vec_rows = floats // dim
    key_bytes, expected_keys = rows * KEY_DTYPE.itemsize, vec_rows * KEY_DTYPE.itemsize
    key_cut = (
        f"{key_path} looks truncated, {plural(vec_rows - rows, 'key')} "
        f"({expected_keys - key_bytes:,} bytes) short: emb_vector holds {vec_rows:,} vectors "
        f"of dim {dim}, which need {expected_keys:,} bytes of keys; key holds {key_bytes:,} "
        f"({_percent(key_bytes, expected_keys)}), {plural(rows, 'key')}"
    )
    return key_cut if other_dim is None else f"{wrong_dim}; or {key_cut}"


def _percent(part: int, whole: int) -> str:
    """``part`` as a share of ``whole``, rounded down (a file one byte short never reads 100%).

    Example:
        >>> _percent(1, 2), _percent(6_399_999, 6_400_000)
        ('50%', '99%')
    """
    return f"{100 * part // whole}%"


def _fill(stream: RawIOBase, out: np.ndarray, path: Path, offset: int) -> None:
    """Fill ``out`` from ``stream``; a short read means the file shrank after inspection."""
    view = memoryview(out).cast("B")
    filled = 0
    while filled < len(view):
        try:
            n = stream.readinto(view[filled:])
        except OSError as exc:
            raise ModelFileError(f"{path}: cannot read byte {offset + filled}: {exc}") from exc
        if not n:
            raise ModelFileError(
                f"{path}: file ended at byte {offset + filled} while reading "
                f"{len(view)} bytes from byte {offset}; it was truncated while being read"
            )
        filled += n


def _open_unbuffered(path: ModelPath) -> RawIOBase:
    # Unbuffered: reads are whole chunks, so a buffer would only add a copy. A URI's stream
    # (pyarrow) reads what is asked the same way.
    try:
        return path.open("rb", buffering=0)
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot open: {exc.strerror or exc}") from exc


def read_keys(folder: ModelPath, rows: int, out: np.ndarray | None = None) -> np.ndarray:
    """The first ``rows`` keys of a sparse model folder's ``key`` file (local or by URI).

    Args:
        folder: the sparse model folder.
        rows: keys to read.
        out: an int64 ``[rows]`` array to read them into (else a new one).

    Returns:
        The keys.

    Raises:
        ModelFileError: the file is shorter (it changed since it was inspected).
    """
    keys = np.empty(rows, dtype=KEY_DTYPE) if out is None else out
    path = folder / KEY_FILE
    with _open_unbuffered(path) as stream:
        _fill(stream, keys, path, 0)
    return keys


class _TableReader:
    """Both files of a table opened side by side, read front to back in row ranges."""

    def __init__(self, info: SparseTableInfo) -> None:
        self.info = info
        self.key_path = info.path / KEY_FILE
        self.vec_path = info.path / VECTOR_FILE
        self._keys = _open_unbuffered(self.key_path)
        try:
            self._vecs = _open_unbuffered(self.vec_path)
        except BaseException:
            self._keys.close()
            raise

    def read_into(self, start_row: int, keys: np.ndarray, vectors: np.ndarray) -> None:
        row_bytes = self.info.dim * VECTOR_DTYPE.itemsize
        _fill(self._keys, keys, self.key_path, start_row * KEY_DTYPE.itemsize)
        _fill(self._vecs, vectors, self.vec_path, start_row * row_bytes)

    def close(self) -> None:
        self._keys.close()
        self._vecs.close()


def _default_chunk_rows(dim: int) -> int:
    return max(1, DEFAULT_CHUNK_BYTES // (KEY_DTYPE.itemsize + dim * VECTOR_DTYPE.itemsize))


def iter_sparse_table(
    path: str | os.PathLike[str],
    dim: int | None = None,
    chunk_rows: int | None = None,
    progress: bool | None = None,
) -> Iterator[SparseChunk]:
    """Read a sparse model folder in chunks of rows, holding one chunk in memory at a time.

    Args:
        path: the sparse model folder.
        dim: floats per vector; ``None`` infers it from the file sizes.
        chunk_rows: rows per chunk (the last one may be shorter); ``None`` picks about
            64 MiB per chunk.
        progress: ``True``/``False`` forces a progress report on or off; ``None`` reports
            for tables over 256 MiB (a tqdm bar on a TTY, else ``hps_core`` log lines).

    Returns:
        An iterator of :class:`SparseChunk`, fresh arrays each (callers may keep them).

    Raises:
        ModelFileError: the folder is invalid (see :func:`inspect_sparse_table`) or a file
            ends early while being read.

    Example:
        >>> for start, keys, vectors in iter_sparse_table("0_sparse_model", 16):  # doctest: +SKIP
        ...     store.insert(keys, vectors)
    """
    info = inspect_sparse_table(path, dim)
    if chunk_rows is None:
        chunk_rows = _default_chunk_rows(info.dim)
    _check_positive("chunk_rows", chunk_rows)
    return _iter_chunks(info, chunk_rows, progress)


def _iter_chunks(
    info: SparseTableInfo, chunk_rows: int, progress: bool | None
) -> Iterator[SparseChunk]:
    # A separate generator so that argument and inspection errors surface at the call,
    # not at the first next().
    reader = _TableReader(info)
    enabled = wants_progress(progress, info.total_bytes)
    try:
        with RowProgress(info.rows, f"reading {info.path}", enabled) as bar:
            for start in range(0, info.rows, chunk_rows):
                n = min(chunk_rows, info.rows - start)
                keys = np.empty(n, KEY_DTYPE)
                vectors = np.empty((n, info.dim), VECTOR_DTYPE)
                reader.read_into(start, keys, vectors)
                bar.update(n)
                yield SparseChunk(start, keys, vectors)
    finally:
        reader.close()


def read_threads() -> int:
    """Threads that read a table's vector file at once: every core (at most 16); reads of
    disjoint ranges overlap the disk's and the page cache's work, and the copies out of it."""
    return max(1, min(16, len(os.sched_getaffinity(0))))


def read_vectors(
    info: SparseTableInfo,
    rows: int,
    out: np.ndarray | None = None,
    consume: Callable[[int, np.ndarray], None] | None = None,
    prepare: Callable[[int, int], None] | None = None,
    threads: int | None = None,
    progress: bool | None = None,
) -> None:
    """Read the first ``rows`` vectors of a sparse table, in file order, on several threads.

    Either straight into ``out`` (a writable float32 ``[rows, dim]`` array, the rows' final
    place: no second copy), or chunk by chunk into buffers handed to ``consume(start_row,
    vectors)``, which must be safe to call from several threads at once (each call gets its
    own rows) and must not keep ``vectors``: each reading thread reuses its buffer (a fresh
    one per chunk would fault its pages in again every time).

    Args:
        info: the table (:func:`inspect_sparse_table`).
        rows: vectors to read, the first ones of the file.
        out: where to read them.
        consume: called with each chunk instead (``out`` None).
        prepare: called as ``prepare(start_row, stop_row)`` for each chunk, in order, on a
            thread of its own that runs ahead of the readers: a chunk is read once it is
            prepared (the host tier allocates its pages there, while earlier chunks are read).
        threads: readers at once; ``None``: :func:`read_threads`.
        progress: as for :func:`iter_sparse_table`, with GB/s.

    Raises:
        ModelFileError: the file cannot be read or ends early.
    """
    row_bytes = info.dim * VECTOR_DTYPE.itemsize
    path = info.path / VECTOR_FILE
    if out is not None and out.shape != (rows, info.dim):
        raise ValueError(f"out must be [{rows}, {info.dim}], got {out.shape}")
    chunk_rows = max(1, DEFAULT_CHUNK_BYTES // max(row_bytes, 1))
    starts = range(0, rows, chunk_rows)
    threads = min(threads or read_threads(), max(len(starts), 1))
    local = isinstance(path, Path)
    opened = threading.local()
    ready = {start: threading.Event() for start in starts} if prepare is not None else {}
    failed: list[BaseException] = []

    def prepare_all() -> None:
        try:
            for start in starts:
                if failed:
                    return
                assert prepare is not None
                prepare(start, min(start + chunk_rows, rows))
                ready[start].set()
        except BaseException as exc:
            failed.append(exc)
        finally:
            for event in ready.values():
                event.set()  # readers waiting on a chunk never prepared find the error

    def read(start: int) -> int:
        if ready:
            ready[start].wait()
            if failed:
                raise failed[0]
        stop = min(start + chunk_rows, rows)
        if out is not None:
            dest = out[start:stop]
        else:
            if not hasattr(opened, "buffer"):
                opened.buffer = np.empty((min(chunk_rows, rows), info.dim), VECTOR_DTYPE)
            dest = opened.buffer[: stop - start]
        if local:
            if not hasattr(opened, "fd"):
                opened.fd = _open_fd(path)
                held.append(opened.fd)
            _pread_into(opened.fd, memoryview(dest).cast("B"), path, start * row_bytes)
        else:
            with path.open_input_file() as stream:
                data = stream.read_at(dest.nbytes, start * row_bytes)
            if len(data) != dest.nbytes:
                raise ModelFileError(
                    f"{path}: file ended at byte {start * row_bytes + len(data)} while reading "
                    f"{dest.nbytes} bytes from byte {start * row_bytes}"
                )
            dest.reshape(-1)[:] = np.frombuffer(data, VECTOR_DTYPE)
        if consume is not None:
            consume(start, dest)
        return stop - start

    held: list[int] = []
    enabled = wants_progress(progress, rows * row_bytes)
    label = f"reading {path}"
    preparer = threading.Thread(target=prepare_all, name="hps-read-prepare", daemon=True)
    try:
        with (
            RowProgress(rows, label, enabled, row_bytes) as bar,
            ThreadPoolExecutor(threads, thread_name_prefix="hps-read") as pool,
        ):
            if ready:
                preparer.start()
            for done in pool.map(read, starts):
                bar.update(done)
    except BaseException as exc:
        failed.append(exc)  # stops the preparer
        raise
    finally:
        if preparer.is_alive():
            preparer.join()
        for fd in held:
            os.close(fd)


def _open_fd(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot open: {exc.strerror or exc}") from exc


def _pread_into(fd: int, view: memoryview, path: Path, offset: int) -> None:
    """Fill ``view`` from byte ``offset`` of the file (``pread`` may return less than asked)."""
    filled = 0
    while filled < len(view):
        try:
            n = os.preadv(fd, [view[filled:]], offset + filled)
        except OSError as exc:
            raise ModelFileError(f"{path}: cannot read byte {offset + filled}: {exc}") from exc
        if not n:
            raise ModelFileError(
                f"{path}: file ended at byte {offset + filled} while reading "
                f"{len(view)} bytes from byte {offset}; it was truncated while being read"
            )
        filled += n


def read_sparse_table(
    path: str | os.PathLike[str], dim: int | None = None, progress: bool | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Read a whole sparse model folder into memory.

    Args:
        path: the sparse model folder.
        dim: floats per vector; ``None`` infers it from the file sizes.
        progress: as for :func:`iter_sparse_table`.

    Returns:
        ``(keys, vectors)``: int64 ``[rows]`` and float32 ``[rows, dim]``.

    Raises:
        ModelFileError: the folder is invalid or a file ends early while being read.
    """
    info = inspect_sparse_table(path, dim)
    keys = np.empty(info.rows, KEY_DTYPE)
    vectors = np.empty((info.rows, info.dim), VECTOR_DTYPE)
    chunk_rows = _default_chunk_rows(info.dim)
    reader = _TableReader(info)
    enabled = wants_progress(progress, info.total_bytes)
    try:
        with RowProgress(info.rows, f"reading {info.path}", enabled) as bar:
            # Read straight into the result in slices so progress can be reported.
            for start in range(0, info.rows, chunk_rows):
                stop = min(start + chunk_rows, info.rows)
                reader.read_into(start, keys[start:stop], vectors[start:stop])
                bar.update(stop - start)
    finally:
        reader.close()
    return keys, vectors
