"""Parquet datasets for offline scoring, read batch by batch as HugeCTR's Parquet reader lays
them out.

A dataset is a Parquet file, a folder of them (every file at any depth, skipping names that
start with ``_`` or ``.``, as Spark and Hive write them), or HugeCTR's ``_file_list.txt``
(first line: the number of files; then one path per line, relative paths taken from the
list's folder), on the local disk or named by URI (``s3://bucket/data/``, HugeCTR's S3 HTTPS
form, ``hdfs://``; see :mod:`hps_core.formats.uris`). Each row is a sample; its columns are,
in HugeCTR's order:

- the labels (``label_dim`` columns; none in a dataset without labels),
- the dense features (``maxnum_des_feature_per_sample`` columns, numbers),
- one categorical column per slot, tables in the network's order and slots in order within a
  table: an integer (one key) or a list of integers (multi-hot; an empty list is an empty
  slot).

The columns are found by name from ``_metadata.json`` beside the files when there is one (the
``labels``, ``conts`` and ``cats`` lists NVTabular and HugeCTR's data generator write), else
by Criteo's names when the files use them (:func:`expected_columns`: ``label``, ``I1``...,
``C1``...; any order, other columns ignored, a missing one named), else by position. Every
batch becomes a :class:`~hps_core.infer.SparseBatch` for the model.
"""

from __future__ import annotations

import json
import os
import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hps_core.errors import ModelFileError
from hps_core.formats.parquet import list_parquet_files, open_parquet
from hps_core.formats.uris import ModelPath, is_uri, model_path
from hps_core.infer.inputs.batch import SparseBatch
from hps_core.infer.inputs.layout import RankingLayout

FILE_LIST = "_file_list.txt"
METADATA = "_metadata.json"
READ_ROWS = 8192
"""Rows read from a Parquet file at a time (then cut into batches; see :func:`iter_dataset`)."""


@dataclass(frozen=True)
class DatasetColumns:
    """Names of a dataset's columns, in HugeCTR's order.

    Args:
        labels: the label columns (empty: the dataset has no labels).
        dense: the dense feature columns.
        categorical: one column per slot, tables in order, slots in order.
        by_position: the names were taken by position (the files name no column as expected
            and have no ``_metadata.json``): a type error then says how they were read.
    """

    labels: tuple[str, ...]
    dense: tuple[str, ...]
    categorical: tuple[str, ...]
    by_position: bool = False

    def hint(self) -> str:
        """What a column error adds where the columns were taken by position."""
        if not self.by_position:
            return ""
        total = len(self.all)
        return (
            f" (the file's {total} columns are read by position as {len(self.labels)} label, "
            f"{len(self.dense)} dense and {len(self.categorical)} categorical: a column too "
            "few or too many shifts them; name them as Criteo's, label I1... C1..., or add "
            f"{METADATA})"
        )

    @property
    def all(self) -> tuple[str, ...]:
        """Every column, in the order above."""
        return (*self.labels, *self.dense, *self.categorical)


@dataclass(frozen=True)
class DatasetBatch:
    """One batch of a dataset: its samples and, when the dataset has them, the labels.

    Args:
        samples: the model's input.
        labels: float32 ``[batch, label_dim]``, or None.
    """

    samples: SparseBatch
    labels: np.ndarray | None


def dataset_files(source: str | os.PathLike[str]) -> list[ModelPath]:
    """The Parquet files of a dataset (see the module docstring), in reading order.

    Args:
        source: a Parquet file, a folder, or a ``_file_list.txt``; a local path or a URI.

    Returns:
        The files.

    Raises:
        ModelFileError: no such file or folder, a malformed list or one naming missing files,
            or no data file.
    """
    root = model_path(source)
    if root.name.endswith(".txt") and root.is_file():
        return _listed_files(root)
    return list_parquet_files(source)


def _listed_files(listing: ModelPath) -> list[ModelPath]:
    lines = [line.strip() for line in listing.read_text().splitlines() if line.strip()]
    if not lines or not lines[0].isdigit():
        raise ModelFileError(
            f"{listing}: a HugeCTR file list starts with the number of files, got "
            f"{lines[0] if lines else 'an empty file'!r}"
        )
    files = [
        model_path(p) if is_uri(p) or Path(p).is_absolute() else listing.parent / p
        for p in lines[1:]
    ]
    if len(files) != int(lines[0]):
        raise ModelFileError(f"{listing}: says {lines[0]} files but lists {len(files)}")
    if not files:
        raise ModelFileError(f"{listing}: lists no files")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ModelFileError(f"{listing}: listed files do not exist: {', '.join(missing[:5])}")
    return files


def dataset_columns(
    files: Sequence[ModelPath], layout: RankingLayout, source: str | os.PathLike[str]
) -> DatasetColumns:
    """The columns of a dataset for ``layout``: by name from ``_metadata.json`` beside the
    files or the source, else by position.

    Args:
        files: the dataset's files (their first file's schema is read).
        layout: the model.
        source: what the user named (its folder is searched for ``_metadata.json``).

    Returns:
        The columns.

    Raises:
        ModelFileError: the counts of columns do not fit the model (naming what it expects).
    """
    with open_parquet(files[0]) as reader:
        names = reader.schema_arrow.names
    root = model_path(source)
    base = root if root.is_dir() else root.parent
    for folder in (base, files[0].parent):
        metadata = folder / METADATA
        if metadata.is_file():
            return _from_metadata(metadata, layout, names)
    named = expected_columns(layout)
    features = (*named.dense, *named.categorical)
    if any(name in names for name in features):
        missing = [name for name in features if name not in names]
        if missing:
            raise ModelFileError(
                f"{files[0]}: columns named as Criteo's ({named.dense[0]}..., "
                f"{named.categorical[0]}...), but missing: {', '.join(missing[:8])}"
                + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            )
        labels = named.labels if all(name in names for name in named.labels) else ()
        return DatasetColumns(labels, named.dense, named.categorical)
    dense, slots, label_dim = layout.dense_dim, layout.total_slots, layout.label_dim
    if len(names) == dense + slots:
        return DatasetColumns((), tuple(names[:dense]), tuple(names[dense:]), by_position=True)
    if len(names) == label_dim + dense + slots:
        return DatasetColumns(
            tuple(names[:label_dim]),
            tuple(names[label_dim : label_dim + dense]),
            tuple(names[label_dim + dense :]),
            by_position=True,
        )
    raise ModelFileError(
        f"{files[0]}: {len(names)} columns, but model '{layout.model}' reads {label_dim} "
        f"label, {dense} dense and {slots} categorical columns ({label_dim + dense + slots}, "
        f"or {dense + slots} without labels); add a {METADATA} naming them"
    )


def expected_columns(layout: RankingLayout) -> DatasetColumns:
    """The column names of a dataset for ``layout`` in Criteo's naming: ``label`` (or
    ``label0``, ``label1``, ... for several), ``I1``... for the dense features, ``C1``... for
    the slots (tables in order, slots in order).

    Example:
        >>> columns = expected_columns(layout)  # doctest: +SKIP
        >>> columns.labels, columns.dense[:2], columns.categorical[-1]  # doctest: +SKIP
        (('label',), ('I1', 'I2'), 'C26')
    """
    n = layout.label_dim
    labels = ("label",) if n == 1 else tuple(f"label{i}" for i in range(n))
    return DatasetColumns(
        labels,
        tuple(f"I{i + 1}" for i in range(layout.dense_dim)),
        tuple(f"C{i + 1}" for i in range(layout.total_slots)),
    )


def _from_metadata(path: ModelPath, layout: RankingLayout, names: Sequence[str]) -> DatasetColumns:
    try:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict):
            raise TypeError(f"a JSON {type(doc).__name__}, not an object")
        groups = {
            key: tuple(str(entry["col_name"]) for entry in doc.get(key, []))
            for key in ("labels", "conts", "cats")
        }
    except (ValueError, TypeError, KeyError) as exc:
        raise ModelFileError(f"{path}: not a dataset metadata file ({exc})") from exc
    columns = DatasetColumns(groups["labels"], groups["conts"], groups["cats"])
    expected = (("conts", layout.dense_dim, columns.dense), ("cats", layout.total_slots,
                columns.categorical))  # fmt: skip
    for key, count, got in expected:
        if len(got) != count:
            raise ModelFileError(
                f"{path}: '{key}' lists {len(got)} columns, model '{layout.model}' reads {count}"
            )
    missing = [n for n in columns.all if n not in names]
    if missing:
        raise ModelFileError(f"{path}: columns not in the data files: {', '.join(missing[:5])}")
    return columns


def iter_dataset(
    files: Sequence[ModelPath], columns: DatasetColumns, layout: RankingLayout, batch_size: int
) -> Iterator[DatasetBatch]:
    """Read the dataset ``batch_size`` rows at a time (a file's last batch may be smaller).

    Args:
        files: the Parquet files.
        columns: their columns.
        layout: the model.
        batch_size: samples per batch.

    Yields:
        The batches, in file and row order.

    Raises:
        ModelFileError: a column is missing, has nulls or values of the wrong kind (naming
            the file, column and row).
    """
    # Reading and converting a record costs a few operations per column whatever its rows:
    # records of about READ_ROWS rows, cut into batches, make that cost small (the demo DLRM's
    # 40 columns: 1.27M rows/s read in records of 8,192, 0.14M in records of 256).
    per_read = batch_size * max(1, READ_ROWS // batch_size)
    for path in files:
        with open_parquet(path) as reader:
            missing = [c for c in columns.all if c not in reader.schema_arrow.names]
            if missing:
                raise ModelFileError(f"{path}: missing columns {', '.join(missing[:5])}")
            row = 0
            records = reader.iter_batches(batch_size=per_read, columns=list(columns.all))
            for record in _named_errors(records, path):
                read = _batch(record, path, row, columns, layout)
                n = read.samples.batch_size
                for first in range(0, n, batch_size):
                    stop = min(first + batch_size, n)
                    labels = None if read.labels is None else read.labels[first:stop]
                    yield DatasetBatch(read.samples.sample_range(first, stop), labels)
                row += n


T = TypeVar("T")


def _named_errors(records: Iterator[T], path: ModelPath) -> Iterator[T]:
    """``records``, a damaged file's read error (a page cut short) naming the file."""
    try:
        yield from records
    except (pa.ArrowException, OSError) as exc:
        raise ModelFileError(f"{path}: not a readable Parquet file ({exc})") from None


_END = object()
"""What :func:`read_ahead`'s thread puts after the last item (with the error, if any)."""


def read_ahead(items: Iterator[T], depth: int = 2) -> Iterator[T]:
    """``items``, produced by a thread of their own up to ``depth`` ahead of the consumer: the
    next batches are read and converted (Arrow and NumPy release the GIL for most of it)
    while the consumer scores the current one, on the GPU or the other cores.

    Args:
        items: an iterator; a generator is closed when the consumer stops early.
        depth: most items produced and not yet consumed.

    Yields:
        The items, in order; an exception ``items`` raised is raised here, after the items
        before it.

    Example:
        >>> list(read_ahead(iter(range(5))))
        [0, 1, 2, 3, 4]
    """
    slots: queue.Queue[tuple[object, BaseException | None]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(entry: tuple[object, BaseException | None]) -> bool:
        while not stop.is_set():  # the consumer may be gone: never block for good
            try:
                slots.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((item, None)):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            put((_END, exc))
            return
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()
        put((_END, None))

    thread = threading.Thread(target=produce, name="hps-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item, error = slots.get()
            if item is _END:
                if error is not None:
                    raise error
                return
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        thread.join()


def dataset_rows(files: Sequence[ModelPath]) -> int:
    """Rows of every file of a dataset (from the Parquet footers)."""
    total = 0
    for path in files:
        with open_parquet(path) as reader:
            total += reader.metadata.num_rows
    return total


def _batch(
    record: pa.RecordBatch,
    path: ModelPath,
    row: int,
    columns: DatasetColumns,
    layout: RankingLayout,
) -> DatasetBatch:
    def numbers(name: str) -> np.ndarray:
        array = record.column(name)
        where = f"{path}: column '{name}'"
        if array.null_count:
            first = row + int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
            raise ModelFileError(f"{where} is null at row {first}")
        if not (pa.types.is_integer(array.type) or pa.types.is_floating(array.type)):
            raise ModelFileError(f"{where} must hold numbers, holds {array.type}{columns.hint()}")
        return array.to_numpy(zero_copy_only=False)

    n = record.num_rows
    dense = np.empty((n, layout.dense_dim), np.float32)
    with np.errstate(over="ignore"):  # a value beyond float32 becomes inf, refused below
        for j, name in enumerate(columns.dense):
            dense[:, j] = numbers(name)
    finite = np.isfinite(dense)
    if not finite.all():  # as the server refuses it: a NaN feature would score NaN
        sample, j = (int(i[0]) for i in np.nonzero(~finite))
        raise ModelFileError(
            f"{path}: column '{columns.dense[j]}' is {dense[sample, j]} at row {row + sample} "
            "(beyond float32 or not a number); dense features must be finite numbers"
        )
    labels = None
    if columns.labels:
        labels = np.stack([numbers(name) for name in columns.labels], axis=1).astype(np.float32)
    keys, offsets, at = [], [], 0
    for slots in layout.slot_nums:
        table_columns = columns.categorical[at : at + slots]
        at += slots
        table_keys, table_offsets = _table_keys(record, path, row, table_columns, columns.hint())
        keys.append(table_keys)
        offsets.append(table_offsets)
    return DatasetBatch(SparseBatch(dense, tuple(keys), tuple(offsets)), labels)


def _table_keys(
    record: pa.RecordBatch, path: ModelPath, row: int, names: Sequence[str], hint: str = ""
) -> tuple[np.ndarray, np.ndarray | None]:
    """One table's keys, sample-major, and its row offsets (None when every slot is one
    integer column: one key per (sample, slot)); ``hint`` ends a type error."""
    arrays = [record.column(name) for name in names]
    for name, array in zip(names, arrays, strict=True):
        kind = array.type.value_type if _is_list(array.type) else array.type
        if not pa.types.is_integer(kind):
            raise ModelFileError(
                f"{path}: categorical column '{name}' must hold integers or lists of them, "
                f"holds {array.type}{hint}"
            )
        if array.null_count:
            first = row + int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
            raise ModelFileError(f"{path}: categorical column '{name}' is null at row {first}")
    n, slots = record.num_rows, len(names)
    if not any(_is_list(a.type) for a in arrays):
        stacked = np.stack(
            [_as_int64(a, path, name) for a, name in zip(arrays, names, strict=True)], axis=1
        )
        return stacked.reshape(-1), None
    counts = np.empty((n, slots), np.int64)
    values, bags = [], []
    for s, (array, name) in enumerate(zip(arrays, names, strict=True)):
        if _is_list(array.type):
            lengths = pc.list_value_length(array).to_numpy(zero_copy_only=False).astype(np.int64)
            keys = array.flatten()
            if keys.null_count:
                at = int(np.flatnonzero(keys.is_null().to_numpy(zero_copy_only=False))[0])
                first = row + int(np.searchsorted(np.cumsum(lengths), at, side="right"))
                raise ModelFileError(
                    f"{path}: categorical column '{name}' holds a null key at row {first}"
                )
            flat = _as_int64(keys, path, name)
        else:
            lengths = np.ones(n, np.int64)
            flat = _as_int64(array, path, name)
        counts[:, s] = lengths
        values.append(flat)
        bags.append(np.repeat(np.arange(n, dtype=np.int64) * slots + s, lengths))
    # Sample-major: every key of bag (b, s) lands at bag b * S + s; a stable sort keeps each
    # bag's keys in their list order.
    order = np.argsort(np.concatenate(bags), kind="stable")
    offsets = np.concatenate([[0], np.cumsum(counts.reshape(-1))]).astype(np.int64)
    return np.concatenate(values)[order], offsets


def _is_list(kind: pa.DataType) -> bool:
    """A list column of any layout: ``list``, ``large_list`` (Polars' default) or
    ``fixed_size_list``."""
    return (
        pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
    )


def _as_int64(array: pa.Array, path: ModelPath, name: str) -> np.ndarray:
    values = array.to_numpy(zero_copy_only=False)
    if values.dtype == np.uint64 and values.size and int(values.max()) > np.iinfo(np.int64).max:
        raise ModelFileError(f"{path}: categorical column '{name}' holds keys above 2^63 - 1")
    return values.astype(np.int64, copy=False)
