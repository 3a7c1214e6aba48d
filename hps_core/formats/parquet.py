"""Conversion between Parquet tables and HugeCTR sparse model folders.

A Parquet embedding table has one integer key column and one list column of floats (one
vector per row). It may be a single file or a folder of part files, as Spark, Dask or
pandas write them. Both directions stream: Parquet is read batch by batch into a
:class:`SparseTableWriter`, and a sparse table is read chunk by chunk into row groups, so
memory stays bounded whatever the table size (the duplicate-key check of an import holds
the keys only, 8 bytes per row).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hps_core.errors import OVERWRITE_HINT, ModelFileError
from hps_core.formats.keys import check_unique_keys
from hps_core.formats.progress import RowProgress, wants_progress
from hps_core.formats.sparse import (
    KEY_DTYPE,
    VECTOR_DTYPE,
    SparseTableInfo,
    inspect_sparse_table,
    iter_sparse_table,
)
from hps_core.formats.sparse_writer import SparseTableWriter
from hps_core.formats.uris import FsPath, ModelPath, model_path

DEFAULT_BATCH_ROWS = 65536
# Rows per written row group are chosen so that one row group is about this large; writing
# (and reading back) holds a few row groups' worth of memory.
DEFAULT_ROW_GROUP_BYTES = 64 * 1024 * 1024
_INT64_MAX = np.iinfo(np.int64).max


def list_parquet_files(path: str | os.PathLike[str]) -> list[ModelPath]:
    """The Parquet files of a dataset: the file itself, or every data file under a folder,
    on the local disk or named by URI (``s3://bucket/table/``; see
    :mod:`hps_core.formats.uris`).

    In a folder, names starting with ``_`` or ``.`` are skipped at any depth, as Spark and
    Hive do (``_SUCCESS``, ``_metadata``, ``.part-0.parquet.crc``); every other file must be
    Parquet. Files are returned in path order, so a table converts to the same row order
    every time.

    Args:
        path: a Parquet file or a folder of them (subfolders included).

    Returns:
        The files, sorted.

    Raises:
        ModelFileError: the path does not exist or a folder holds no data file.
    """
    root = model_path(path)
    if isinstance(root, FsPath):
        return _list_remote(root)
    if not root.exists():
        raise ModelFileError(f"{root}: Parquet file or folder does not exist")
    if root.is_file():
        return [root]
    files = sorted(
        p
        for p in root.rglob("*")
        if p.is_file()
        and not any(part.startswith(("_", ".")) for part in p.relative_to(root).parts)
    )
    if not files:
        raise ModelFileError(f"{root}: folder holds no Parquet data files")
    return files


def _list_remote(root: FsPath) -> list[ModelPath]:
    if not root.exists():
        raise ModelFileError(f"{root}: Parquet file or folder does not exist")
    if root.is_file():
        return [root]
    base = root.path.rstrip("/")
    files: list[ModelPath] = [
        f for f in root.files_below()
        if not any(part.startswith(("_", ".")) for part in f.path[len(base) :].split("/"))
    ]  # fmt: skip
    if not files:
        raise ModelFileError(f"{root}: folder holds no Parquet data files")
    return files


def open_parquet(file: ModelPath) -> pq.ParquetFile:
    """A Parquet file of :func:`list_parquet_files`, local or remote, opened for reading.

    Raises:
        ModelFileError: it is not a Parquet file, or its footer is damaged (naming it).
    """
    try:
        return pq.ParquetFile(file.open_input_file() if isinstance(file, FsPath) else file)
    except (pa.ArrowException, OSError) as exc:
        raise ModelFileError(f"{file}: not a readable Parquet file ({exc})") from None


@dataclass
class _Dim:
    """The vector length every row must have, and where it came from (for messages)."""

    value: int | None
    source: str


def _check_schema(
    file: Path, schema: pa.Schema, key_column: str, vector_column: str, dim: _Dim
) -> None:
    names = schema.names
    for column in (key_column, vector_column):
        if column not in names:
            raise ModelFileError(
                f"{file}: no column '{column}'; columns are {', '.join(names) or '(none)'}"
            )
    key_type = schema.field(key_column).type
    if not pa.types.is_integer(key_type):
        raise ModelFileError(
            f"{file}: key column '{key_column}' has type {key_type}; expected an integer type"
        )
    vec_type = schema.field(vector_column).type
    is_list = (
        pa.types.is_list(vec_type)
        or pa.types.is_large_list(vec_type)
        or pa.types.is_fixed_size_list(vec_type)
    )
    if not is_list or not pa.types.is_floating(vec_type.value_type):
        raise ModelFileError(
            f"{file}: vector column '{vector_column}' has type {vec_type}; expected a list "
            f"of floats (list, large_list or fixed_size_list of float16/32/64)"
        )
    if pa.types.is_fixed_size_list(vec_type):
        size = vec_type.list_size
        if size < 1:
            raise ModelFileError(
                f"{file}: vector column '{vector_column}' is a fixed_size_list of 0 values"
            )
        if dim.value is None:
            dim.value, dim.source = size, f"the list size of {file}"
        elif size != dim.value:
            raise ModelFileError(
                f"{file}: vector column '{vector_column}' is a fixed_size_list of {size}; "
                f"expected {dim.value} ({dim.source})"
            )


def _one_line(exc: BaseException) -> str:
    # Arrow messages span lines; the command line prints one line per error line.
    return " ".join(str(exc).split())


def _first_null(array: pa.Array) -> int:
    return int(np.flatnonzero(~array.is_valid().to_numpy(zero_copy_only=False))[0])


def _keys_to_int64(array: pa.Array, file: Path, column: str, row0: int) -> np.ndarray:
    if array.null_count:
        raise ModelFileError(
            f"{file}: key column '{column}' row {row0 + _first_null(array)} is null"
        )
    keys = array.to_numpy()
    if keys.dtype == np.uint64:
        over = np.flatnonzero(keys > np.uint64(_INT64_MAX))
        if over.size:
            raise ModelFileError(
                f"{file}: key column '{column}' row {row0 + int(over[0])} holds "
                f"{int(keys[over[0]])}, which does not fit int64 ({over.size} such rows "
                f"in this batch)"
            )
    return keys.astype(KEY_DTYPE, copy=False)


def _vectors_to_float32(
    array: pa.Array, file: Path, column: str, row0: int, dim: _Dim
) -> np.ndarray:
    where = f"{file}: vector column '{column}'"
    if array.null_count:
        raise ModelFileError(f"{where} row {row0 + _first_null(array)} is null")
    n = len(array)
    if n == 0:
        return np.empty((0, dim.value or 0), VECTOR_DTYPE)
    lengths = pc.list_value_length(array).to_numpy()
    if dim.value is None:
        dim.value, dim.source = int(lengths[0]), f"the length of row {row0} of {file}"
    bad = np.flatnonzero(lengths != dim.value)
    if bad.size:
        row = int(bad[0])
        raise ModelFileError(
            f"{where} row {row0 + row} holds {int(lengths[row])} values, expected "
            f"{dim.value} ({dim.source}); rows must all have the same length"
        )
    if dim.value == 0:
        raise ModelFileError(f"{where} row {row0} is an empty list; dim must be at least 1")
    values = array.flatten()
    if values.null_count:
        raise ModelFileError(f"{where} row {row0 + _first_null(values) // dim.value} holds a null")
    floats = values.to_numpy()
    with np.errstate(over="ignore"):
        vectors = floats.astype(VECTOR_DTYPE, copy=False)
    if floats.dtype == np.float64:
        # float64 values beyond float32's range would silently become inf.
        overflow = np.flatnonzero(np.isinf(vectors) & np.isfinite(floats))
        if overflow.size:
            raise ModelFileError(
                f"{where} row {row0 + int(overflow[0]) // dim.value} holds "
                f"{float(floats[overflow[0]])!r}, beyond the float32 range"
            )
    return vectors.reshape(n, dim.value)


def _iter_batches(
    file: ModelPath, batch_rows: int, key_column: str, vector_column: str
) -> Iterator[pa.RecordBatch]:
    """Read the two columns of ``file`` batch by batch; Arrow read errors name the file."""
    row = 0
    try:
        with open_parquet(file) as parquet_file:
            # One row group at a time: iterating over the whole file lets Arrow read ahead
            # and hold several row groups (seen: all of a 500 MB file) instead of one.
            for group in range(parquet_file.num_row_groups):
                for batch in parquet_file.iter_batches(
                    batch_size=batch_rows, row_groups=[group], columns=[key_column, vector_column]
                ):
                    yield batch
                    row += batch.num_rows
    except (pa.ArrowException, OSError) as exc:
        raise ModelFileError(f"{file}: cannot read from row {row} on: {_one_line(exc)}") from exc


def parquet_to_sparse_table(
    parquet_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    key_column: str = "key",
    vector_column: str = "vector",
    dim: int | None = None,
    overwrite: bool = False,
    check_unique: bool = True,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    progress: bool | None = None,
) -> SparseTableInfo:
    """Convert a Parquet table (file or folder of part files) to a HugeCTR sparse folder.

    Args:
        parquet_path: a Parquet file or a folder of them (see :func:`list_parquet_files`).
        out_dir: the sparse model folder to write.
        key_column: integer column (any width, signed or not) holding the keys.
        vector_column: list, large_list or fixed_size_list column of float16/32/64 values.
        dim: floats per vector; ``None`` takes it from the column type or the first row.
        overwrite: replace a table already in ``out_dir``.
        check_unique: refuse keys that appear more than once.
        batch_rows: rows read from Parquet at a time.
        progress: ``True``/``False`` forces a progress report; ``None`` reports for inputs
            over 256 MiB.

    Returns:
        The :class:`SparseTableInfo` of the written folder.

    Raises:
        ModelFileError: a file is unreadable, a column is missing or of the wrong type, a
            value is null, a vector has the wrong length, a key does not fit int64, or keys
            repeat; the message names the file, column and row (0-based within the file).
            ``out_dir`` is left as it was.

    Example:
        >>> parquet_to_sparse_table("emb.parquet", "model/0_sparse_model")  # doctest: +SKIP
        SparseTableInfo(path=..., rows=1000, dim=16, ...)
    """
    if dim is not None and dim < 1:
        raise ValueError(f"dim must be a positive integer, got {dim!r}")
    files = list_parquet_files(parquet_path)
    if key_column == vector_column:
        raise ModelFileError(f"{parquet_path}: key and vector column are both '{key_column}'")
    target = _Dim(dim, "the dim given")

    # Check every file's schema before writing anything, so a bad part file fails fast.
    total_rows = 0
    for file in files:
        try:
            metadata = open_parquet(file).metadata
        except (pa.ArrowException, OSError) as exc:
            raise ModelFileError(f"{file}: not a readable Parquet file ({_one_line(exc)})") from exc
        _check_schema(file, metadata.schema.to_arrow_schema(), key_column, vector_column, target)
        total_rows += metadata.num_rows

    enabled = wants_progress(progress, sum(f.stat().st_size for f in files))
    with (
        SparseTableWriter(out_dir, overwrite=overwrite) as writer,
        RowProgress(total_rows, f"converting {parquet_path}", enabled) as bar,
    ):
        for file in files:
            row0 = 0
            for batch in _iter_batches(file, batch_rows, key_column, vector_column):
                keys = _keys_to_int64(batch.column(key_column), file, key_column, row0)
                vectors = _vectors_to_float32(
                    batch.column(vector_column), file, vector_column, row0, target
                )
                if len(keys):
                    writer.append(keys, vectors)
                row0 += len(keys)
                bar.update(len(keys))
        if target.value is None:
            raise ModelFileError(
                f"{parquet_path}: no rows, so the vector dim cannot be inferred; pass dim"
            )
        if check_unique:
            check_unique_keys(writer.keys_written(), f"{parquet_path} column '{key_column}'")
    return inspect_sparse_table(out_dir, target.value)


def _default_row_group_rows(dim: int) -> int:
    row_bytes = KEY_DTYPE.itemsize + dim * VECTOR_DTYPE.itemsize
    return max(1, DEFAULT_ROW_GROUP_BYTES // row_bytes)


def sparse_table_to_parquet(
    table_dir: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    dim: int | None = None,
    key_column: str = "key",
    vector_column: str = "vector",
    row_group_rows: int | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
) -> SparseTableInfo:
    """Write a HugeCTR sparse model folder as one Parquet file.

    The file has a non-null ``int64`` key column and a non-null
    ``fixed_size_list<float32>[dim]`` vector column, rows in the folder's order. It is
    written under a temporary name and renamed when complete.

    Args:
        table_dir: the sparse model folder.
        out_path: the Parquet file to write; parent folders are created.
        dim: floats per vector; ``None`` infers it from the file sizes.
        key_column: name of the key column.
        vector_column: name of the vector column.
        row_group_rows: rows per row group; ``None`` picks about 64 MiB per row group.
        overwrite: replace an existing ``out_path``.
        progress: as for :func:`hps_core.formats.sparse.iter_sparse_table`.

    Returns:
        The :class:`SparseTableInfo` of the source folder.

    Raises:
        ModelFileError: the folder is invalid, or ``out_path`` exists without ``overwrite``.
    """
    info = inspect_sparse_table(table_dir, dim)
    out = Path(out_path)
    if key_column == vector_column:
        raise ModelFileError(f"{out}: key and vector column are both '{key_column}'")
    if out.is_dir():
        raise ModelFileError(f"{out}: is a folder; expected a Parquet file name")
    if out.exists() and not overwrite:
        raise ModelFileError(f"{out}: already exists; {OVERWRITE_HINT} it")
    if row_group_rows is None:
        row_group_rows = _default_row_group_rows(info.dim)
    schema = pa.schema(
        [
            pa.field(key_column, pa.int64(), nullable=False),
            pa.field(
                vector_column,
                pa.list_(pa.field("element", pa.float32(), nullable=False), info.dim),
                nullable=False,
            ),
        ]
    )
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    chunks = iter_sparse_table(info.path, info.dim, chunk_rows=row_group_rows, progress=progress)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # Random floats and unique keys do not repeat: dictionary encoding only costs time.
        with pq.ParquetWriter(tmp, schema, use_dictionary=False) as writer:
            for chunk in chunks:
                vectors = pa.FixedSizeListArray.from_arrays(
                    pa.array(chunk.vectors.reshape(-1)), type=schema.field(vector_column).type
                )
                batch = pa.record_batch([pa.array(chunk.keys), vectors], schema=schema)
                writer.write_batch(batch, row_group_size=row_group_rows)
        os.replace(tmp, out)
    except (pa.ArrowException, OSError) as exc:
        raise ModelFileError(f"{out}: cannot write: {_one_line(exc)}") from exc
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return info


def iter_parquet_rows(
    path: str | os.PathLike[str],
    key_column: str = "key",
    vector_column: str = "vector",
    dim: int | None = None,
    batch_rows: int = 65536,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(keys, vectors)`` batches of a Parquet embedding table (a file or a folder of them),
    with the checks and messages (naming file, column and row) of
    :func:`parquet_to_sparse_table`, so that every reader accepts and refuses the same files.

    Args:
        path: a Parquet file or folder (local path or URI).
        key_column, vector_column: the columns holding keys and vectors.
        dim: the vector length expected; ``None``: the first file's.
        batch_rows: rows per batch read.

    Returns:
        An iterator of int64 ``[n]`` keys and float32 ``[n, dim]`` vectors.

    Raises:
        ModelFileError: a file is unreadable, a column is missing or of the wrong type, a
            value is null or a vector has the wrong length.
    """
    target = _Dim(dim, "the dim given")
    files = list_parquet_files(path)
    for file in files:
        metadata = open_parquet(file).metadata
        _check_schema(file, metadata.schema.to_arrow_schema(), key_column, vector_column, target)
    for file in files:
        row0 = 0
        for batch in _iter_batches(file, batch_rows, key_column, vector_column):
            keys = _keys_to_int64(batch.column(key_column), file, key_column, row0)
            vectors = _vectors_to_float32(
                batch.column(vector_column), file, vector_column, row0, target
            )
            row0 += len(keys)
            if len(keys):
                yield keys, vectors
