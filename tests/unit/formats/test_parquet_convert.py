"""Parquet <-> HugeCTR sparse folder conversion, compared with the arrays written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from formats_testdata import INT64_MAX, RandomTable

from hps_core.errors import ModelFileError
from hps_core.formats.parquet import (
    list_parquet_files,
    parquet_to_sparse_table,
    sparse_table_to_parquet,
)
from hps_core.formats.sparse import read_sparse_table
from hps_core.formats.sparse_writer import write_sparse_table

VectorBuilder = Callable[[np.ndarray], pa.Array]


def _offsets(rows: int, dim: int, dtype: type) -> pa.Array:
    return pa.array(np.arange(rows + 1, dtype=dtype) * dim)


VECTOR_TYPES: dict[str, tuple[VectorBuilder, np.dtype]] = {
    "list<float>": (
        lambda v: pa.ListArray.from_arrays(
            _offsets(*v.shape, np.int32), pa.array(v.ravel().astype(np.float32))
        ),
        np.dtype(np.float32),
    ),
    "large_list<float>": (
        lambda v: pa.LargeListArray.from_arrays(
            _offsets(*v.shape, np.int64), pa.array(v.ravel().astype(np.float32))
        ),
        np.dtype(np.float32),
    ),
    "fixed_size_list<float>": (
        lambda v: pa.FixedSizeListArray.from_arrays(
            pa.array(v.ravel().astype(np.float32)), v.shape[1]
        ),
        np.dtype(np.float32),
    ),
    "list<double>": (
        lambda v: pa.ListArray.from_arrays(
            _offsets(*v.shape, np.int32), pa.array(v.ravel().astype(np.float64))
        ),
        np.dtype(np.float64),
    ),
    "large_list<double>": (
        lambda v: pa.LargeListArray.from_arrays(
            _offsets(*v.shape, np.int64), pa.array(v.ravel().astype(np.float64))
        ),
        np.dtype(np.float64),
    ),
    "list<halffloat>": (
        lambda v: pa.ListArray.from_arrays(
            _offsets(*v.shape, np.int32), pa.array(v.ravel().astype(np.float16))
        ),
        np.dtype(np.float16),
    ),
}


def _write_parquet(path: Path, columns: dict[str, pa.Array], row_group_size: int = 25) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return path


def _assert_table(folder: Path, keys: np.ndarray, vectors: np.ndarray) -> None:
    got_keys, got_vectors = read_sparse_table(folder, vectors.shape[1])
    np.testing.assert_array_equal(got_keys, keys)
    np.testing.assert_array_equal(got_vectors, vectors)


@pytest.mark.parametrize("vector_type", sorted(VECTOR_TYPES))
@pytest.mark.parametrize(("rows", "dim"), [(1, 1), (2, 128), (37, 8), (300, 3)])
def test_each_vector_column_type_converts(
    tmp_path: Path, random_table: RandomTable, vector_type: str, rows: int, dim: int
) -> None:
    keys, vectors = random_table(rows, dim)
    build, source_dtype = VECTOR_TYPES[vector_type]
    if source_dtype == np.float16:
        vectors = np.clip(vectors, -60000, 60000)
    source = _write_parquet(
        tmp_path / "t.parquet", {"key": pa.array(keys), "vector": build(vectors)}
    )
    # A reference independent of the converter: the float32 value of each source value.
    expected = vectors.astype(source_dtype).astype(np.float32)

    info = parquet_to_sparse_table(source, tmp_path / "out", batch_rows=16)
    assert (info.rows, info.dim, info.path) == (rows, dim, tmp_path / "out")
    _assert_table(tmp_path / "out", keys, expected)


@pytest.mark.parametrize(
    "key_type", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
)
def test_each_integer_key_type_converts_to_int64(
    tmp_path: Path, rng: np.random.Generator, key_type: type
) -> None:
    limits = np.iinfo(key_type)
    high = min(int(limits.max), INT64_MAX)  # uint64 keys beyond int64 are an error, see below
    inner = rng.integers(int(limits.min), high, 60, endpoint=True).astype(key_type)
    keys = np.unique(np.concatenate([np.array([limits.min, high], key_type), inner]))
    assert keys.dtype == key_type and keys.min() == limits.min and keys.max() == high
    vectors = rng.standard_normal((keys.size, 4)).astype(np.float32)
    source = _write_parquet(
        tmp_path / "k.parquet",
        {"id": pa.array(keys), "emb": VECTOR_TYPES["list<float>"][0](vectors)},
    )
    parquet_to_sparse_table(source, tmp_path / "out", key_column="id", vector_column="emb")
    _assert_table(tmp_path / "out", keys.astype(np.int64), vectors)


def test_pandas_style_file_from_python_lists(tmp_path: Path) -> None:
    keys = [10, -3, 2**40, 7]
    vectors = [[0.5, 1.25], [-2.0, 3.0], [1e-3, -1e3], [0.1, 0.2]]
    table = pa.Table.from_pydict(
        {"item": keys, "embedding": vectors, "__index_level_0__": [0, 1, 2, 3]},
        metadata={b"pandas": b'{"index_columns": ["__index_level_0__"]}'},
    )
    assert table.schema.field("embedding").type == pa.list_(pa.float64())
    pq.write_table(table, tmp_path / "df.parquet")

    info = parquet_to_sparse_table(
        tmp_path / "df.parquet", tmp_path / "out", key_column="item", vector_column="embedding"
    )
    assert (info.rows, info.dim) == (4, 2)
    _assert_table(tmp_path / "out", np.array(keys), np.array(vectors, np.float32))


def test_folder_of_part_files_like_spark(tmp_path: Path, random_table: RandomTable) -> None:
    keys, vectors = random_table(100, 5)
    build = VECTOR_TYPES["list<double>"][0]
    dataset = tmp_path / "emb.parquet"
    # Sorted path order: bucket=0/part-00000, part-00001 (empty), part-00002, part-00003.
    parts = [
        ("bucket=0/part-00000-abc.snappy.parquet", 0, 30),
        ("part-00001-abc.snappy.parquet", 30, 30),
        ("part-00002-abc.snappy.parquet", 30, 75),
        ("part-00003-abc.snappy.parquet", 75, 100),
    ]
    for name, start, stop in reversed(parts):
        _write_parquet(
            dataset / name,
            {"key": pa.array(keys[start:stop]), "vector": build(vectors[start:stop])},
        )
    (dataset / "_SUCCESS").write_bytes(b"")
    (dataset / ".part-00002-abc.snappy.parquet.crc").write_bytes(b"not parquet")
    (dataset / "_temporary").mkdir()
    (dataset / "_temporary" / "part-9.parquet").write_bytes(b"half written")

    assert list_parquet_files(dataset) == [dataset / name for name, _, _ in parts]
    info = parquet_to_sparse_table(dataset, tmp_path / "out", batch_rows=8)
    assert (info.rows, info.dim) == (100, 5)
    _assert_table(tmp_path / "out", keys, vectors)


@pytest.mark.parametrize(("rows", "dim"), [(0, 3), (1, 1), (7, 128), (250, 16)])
@pytest.mark.parametrize("row_group_rows", [None, 1, 40])
def test_sparse_to_parquet_round_trip(
    tmp_path: Path, random_table: RandomTable, rows: int, dim: int, row_group_rows: int | None
) -> None:
    keys, vectors = random_table(rows, dim)
    write_sparse_table(tmp_path / "t", keys, vectors)

    info = sparse_table_to_parquet(
        tmp_path / "t", tmp_path / "pq" / "t.parquet", dim=dim, row_group_rows=row_group_rows
    )
    assert (info.rows, info.dim) == (rows, dim)
    parquet_file = pq.ParquetFile(tmp_path / "pq" / "t.parquet")
    schema = parquet_file.schema_arrow
    assert schema.field("key").type == pa.int64() and not schema.field("key").nullable
    assert schema.field("vector").type.equals(
        pa.list_(pa.field("element", pa.float32(), nullable=False), dim)
    )
    if row_group_rows is not None:
        assert parquet_file.metadata.num_row_groups == -(-rows // row_group_rows)
    table = parquet_file.read()
    np.testing.assert_array_equal(table.column("key").to_numpy(), keys)
    flat = table.column("vector").combine_chunks().flatten().to_numpy()
    np.testing.assert_array_equal(flat.reshape(rows, dim), vectors)

    back = parquet_to_sparse_table(tmp_path / "pq" / "t.parquet", tmp_path / "back", dim=dim)
    assert back.rows == rows
    _assert_table(tmp_path / "back", keys, vectors)
    assert [p.name for p in (tmp_path / "pq").iterdir()] == ["t.parquet"]


def test_custom_column_names_on_export(tmp_path: Path, random_table: RandomTable) -> None:
    write_sparse_table(tmp_path / "t", *random_table(4, 2))
    sparse_table_to_parquet(
        tmp_path / "t", tmp_path / "o.parquet", key_column="id", vector_column="e"
    )
    assert pq.read_schema(tmp_path / "o.parquet").names == ["id", "e"]


# Errors --------------------------------------------------------------------------------


def _convert_error(source: Path, out: Path, **kwargs: object) -> str:
    with pytest.raises(ModelFileError) as err:
        parquet_to_sparse_table(source, out, batch_rows=10, **kwargs)  # type: ignore[arg-type]
    # Nothing is published on failure.
    assert not out.exists()
    return str(err.value)


def _lists(rows: list[list[float] | None], value_type: pa.DataType | None = None) -> pa.Array:
    return pa.array(rows, pa.list_(value_type or pa.float32()))


def test_ragged_rows_name_the_first_bad_row(tmp_path: Path) -> None:
    rows: list[list[float] | None] = [[1.0, 2.0, 3.0]] * 40
    rows[23] = [1.0]
    rows[31] = [1.0, 2.0]
    source = _write_parquet(
        tmp_path / "r.parquet", {"key": pa.array(range(40)), "vector": _lists(rows)}
    )
    assert _convert_error(source, tmp_path / "out") == (
        f"{source}: vector column 'vector' row 23 holds 1 values, expected 3 "
        f"(the length of row 0 of {source}); rows must all have the same length"
    )
    assert "row 0 holds 3 values, expected 4 (the dim given)" in _convert_error(
        source, tmp_path / "out", dim=4
    )


def test_null_vector_row_and_null_value(tmp_path: Path) -> None:
    rows: list[list[float | None] | None] = [[1.0, 2.0]] * 30
    rows[17] = None
    source = _write_parquet(
        tmp_path / "n.parquet", {"key": pa.array(range(30)), "vector": _lists(rows)}
    )
    assert (
        _convert_error(source, tmp_path / "out")
        == f"{source}: vector column 'vector' row 17 is null"
    )

    rows[17] = [1.0, 2.0]
    rows[26] = [3.0, None]
    source = _write_parquet(
        tmp_path / "e.parquet", {"key": pa.array(range(30)), "vector": _lists(rows)}
    )
    assert _convert_error(source, tmp_path / "out") == (
        f"{source}: vector column 'vector' row 26 holds a null"
    )


def test_null_key(tmp_path: Path) -> None:
    keys: list[int | None] = list(range(12))
    keys[11] = None
    source = _write_parquet(
        tmp_path / "k.parquet", {"key": pa.array(keys, pa.int32()), "vector": _lists([[1.0]] * 12)}
    )
    assert _convert_error(source, tmp_path / "out") == f"{source}: key column 'key' row 11 is null"


def test_uint64_key_beyond_int64(tmp_path: Path) -> None:
    keys = np.arange(15, dtype=np.uint64)
    keys[13] = np.uint64(INT64_MAX) + np.uint64(1)
    keys[14] = np.iinfo(np.uint64).max
    source = _write_parquet(
        tmp_path / "u.parquet", {"key": pa.array(keys), "vector": _lists([[1.0]] * 15)}
    )
    assert _convert_error(source, tmp_path / "out") == (
        f"{source}: key column 'key' row 13 holds {2**63}, which does not fit int64 "
        f"(2 such rows in this batch)"
    )


def test_double_beyond_float32_range(tmp_path: Path) -> None:
    rows = [[1.0, 2.0]] * 5 + [[1.0, 1e300]]
    source = _write_parquet(
        tmp_path / "d.parquet",
        {"key": pa.array(range(6)), "vector": _lists(rows, pa.float64())},
    )
    assert _convert_error(source, tmp_path / "out") == (
        f"{source}: vector column 'vector' row 5 holds 1e+300, beyond the float32 range"
    )


@pytest.mark.parametrize(
    ("columns", "expected"),
    [
        (
            {"id": pa.array([1]), "vector": _lists([[1.0]])},
            "no column 'key'; columns are id, vector",
        ),
        (
            {"key": pa.array([1]), "vec": _lists([[1.0]])},
            "no column 'vector'; columns are key, vec",
        ),
        (
            {"key": pa.array(["a"]), "vector": _lists([[1.0]])},
            "key column 'key' has type string; expected an integer type",
        ),
        (
            {"key": pa.array([1.5]), "vector": _lists([[1.0]])},
            "key column 'key' has type double; expected an integer type",
        ),
        (
            {"key": pa.array([1]), "vector": pa.array([1.0])},
            "vector column 'vector' has type double; expected a list of floats",
        ),
        (
            {"key": pa.array([1]), "vector": pa.array([[1]])},
            "vector column 'vector' has type list<element: int64>; expected a list of floats",
        ),
    ],
)
def test_wrong_columns(tmp_path: Path, columns: dict[str, pa.Array], expected: str) -> None:
    source = _write_parquet(tmp_path / "c.parquet", columns)
    assert _convert_error(source, tmp_path / "out").startswith(f"{source}: {expected}")


def test_fixed_size_list_of_another_dim(tmp_path: Path) -> None:
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(8, np.float32)), 4)
    source = _write_parquet(tmp_path / "f.parquet", {"key": pa.array([1, 2]), "vector": vectors})
    assert _convert_error(source, tmp_path / "out", dim=8) == (
        f"{source}: vector column 'vector' is a fixed_size_list of 4; expected 8 (the dim given)"
    )


def test_part_files_must_agree_on_dim(tmp_path: Path) -> None:
    _write_parquet(
        tmp_path / "d" / "a.parquet", {"key": pa.array([1]), "vector": _lists([[1.0, 2.0]])}
    )
    b = _write_parquet(
        tmp_path / "d" / "b.parquet", {"key": pa.array([2]), "vector": _lists([[1.0]])}
    )
    assert _convert_error(tmp_path / "d", tmp_path / "out") == (
        f"{b}: vector column 'vector' row 0 holds 1 values, expected 2 (the length of row 0 of "
        f"{tmp_path / 'd' / 'a.parquet'}); rows must all have the same length"
    )


def test_duplicate_keys_across_part_files(tmp_path: Path) -> None:
    _write_parquet(
        tmp_path / "d" / "a.parquet", {"key": pa.array([1, 5, 9]), "vector": _lists([[1.0]] * 3)}
    )
    _write_parquet(
        tmp_path / "d" / "b.parquet", {"key": pa.array([9, 2, 1]), "vector": _lists([[1.0]] * 3)}
    )
    assert _convert_error(tmp_path / "d", tmp_path / "out") == (
        f"{tmp_path / 'd'} column 'key': 2 keys appear more than once (2 extra rows): 1, 9"
    )
    info = parquet_to_sparse_table(tmp_path / "d", tmp_path / "out", check_unique=False)
    assert info.rows == 6


def test_unreadable_and_missing_inputs(tmp_path: Path) -> None:
    bad = tmp_path / "d" / "part-0.parquet"
    bad.parent.mkdir()
    bad.write_bytes(b"PAR1 but not really a parquet file")
    assert _convert_error(tmp_path / "d", tmp_path / "out").startswith(
        f"{bad}: not a readable Parquet file ("
    )
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "_SUCCESS").write_bytes(b"")
    assert _convert_error(tmp_path / "empty", tmp_path / "out") == (
        f"{tmp_path / 'empty'}: folder holds no Parquet data files"
    )
    assert _convert_error(tmp_path / "nope", tmp_path / "out") == (
        f"{tmp_path / 'nope'}: Parquet file or folder does not exist"
    )


def test_corrupt_row_group_names_file_and_row(tmp_path: Path) -> None:
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(1600, dtype=np.float32)), 4)
    source = tmp_path / "c.parquet"
    pq.write_table(
        pa.table({"key": pa.array(np.arange(400)), "vector": vectors}), source, row_group_size=100
    )
    page = pq.read_metadata(source).row_group(2).column(1).data_page_offset
    data = bytearray(source.read_bytes())
    data[page : page + 64] = b"\xff" * 64
    source.write_bytes(bytes(data))
    message = _convert_error(source, tmp_path / "out")
    assert message.startswith(f"{source}: cannot read from row 200 on: ")
    assert "\n" not in message


def test_empty_input_needs_a_dim(tmp_path: Path) -> None:
    source = _write_parquet(
        tmp_path / "e.parquet",
        {"key": pa.array([], pa.int64()), "vector": pa.array([], pa.list_(pa.float32()))},
    )
    assert "no rows, so the vector dim cannot be inferred" in _convert_error(
        source, tmp_path / "out"
    )
    info = parquet_to_sparse_table(source, tmp_path / "out", dim=6)
    assert (info.rows, info.dim, info.total_bytes) == (0, 6, 0)


def test_same_key_and_vector_column(tmp_path: Path) -> None:
    source = _write_parquet(
        tmp_path / "s.parquet", {"key": pa.array([1]), "vector": _lists([[1.0]])}
    )
    assert "key and vector column are both 'key'" in _convert_error(
        source, tmp_path / "out", vector_column="key"
    )


def test_export_refuses_existing_output(tmp_path: Path, random_table: RandomTable) -> None:
    write_sparse_table(tmp_path / "t", *random_table(3, 2))
    (tmp_path / "o.parquet").write_bytes(b"old")
    with pytest.raises(ModelFileError, match="already exists; pass --overwrite"):
        sparse_table_to_parquet(tmp_path / "t", tmp_path / "o.parquet")
    assert (tmp_path / "o.parquet").read_bytes() == b"old"
    sparse_table_to_parquet(tmp_path / "t", tmp_path / "o.parquet", overwrite=True)
    assert pq.read_metadata(tmp_path / "o.parquet").num_rows == 3
    with pytest.raises(ModelFileError, match="is a folder; expected a Parquet file name"):
        sparse_table_to_parquet(tmp_path / "t", tmp_path, overwrite=True)
    with pytest.raises(ModelFileError, match="or dim 3 is wrong: both files agree on dim 2"):
        sparse_table_to_parquet(tmp_path / "t", tmp_path / "p.parquet", dim=3)
    assert not (tmp_path / "p.parquet").exists()
    with pytest.raises(ModelFileError, match="key and vector column are both 'k'"):
        sparse_table_to_parquet(
            tmp_path / "t", tmp_path / "p.parquet", key_column="k", vector_column="k"
        )
    with pytest.raises(ModelFileError) as err:
        sparse_table_to_parquet(tmp_path / "t", tmp_path / "o.parquet" / "p.parquet")
    assert str(err.value).startswith(f"{tmp_path / 'o.parquet' / 'p.parquet'}: cannot write: ")
