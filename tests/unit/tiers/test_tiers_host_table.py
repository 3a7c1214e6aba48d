"""SharedHostTable: lookups against a dict of the file rows, errors, segment sharing."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
from quant_reference import reference_decoded, reference_stored
from tiers_testdata import (
    EXTREME_KEYS,
    expected_rows,
    make_keys,
    mixed_queries,
    random_vectors,
    row_reference,
)

import hps_core.formats.sparse as sparse_module
import hps_core.tiers.host_table as host_table_module
from hps_core.errors import ModelFileError
from hps_core.formats.sparse import KEY_FILE, VECTOR_FILE
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.hashing import mix64
from hps_core.quant import RowFormat, StoragePrecision
from hps_core.tiers.host_table import SharedHostTable, segment_name


def write_table(folder: Path, rng: np.random.Generator, rows: int, dim: int, kind: str = "wide"):
    keys = make_keys(rng, rows, kind)
    vectors = random_vectors(rng, rows, dim)
    write_sparse_table(folder, keys, vectors, overwrite=True)
    return keys, vectors


def reference_lookup(
    keys: np.ndarray, vectors: np.ndarray, queries: np.ndarray, default: float
) -> tuple[np.ndarray, np.ndarray]:
    rows = expected_rows(row_reference(keys), queries)
    expected = np.full((len(queries), vectors.shape[1]), default, dtype=np.float32)
    expected[rows >= 0] = vectors[rows[rows >= 0]]
    return expected, rows >= 0


def data_files(shm_path: Path) -> list[Path]:
    return sorted(shm_path.glob("*.data"))


@pytest.mark.parametrize(
    ("rows", "dim"),
    [(0, 4), (1, 1), (7, 3), (8, 16), (1000, 1), (1000, 33), (20_000, 8)],
    ids=str,
)
@pytest.mark.parametrize("kind", ["wide", "dense"])
def test_lookup_matches_reference(
    tmp_path: Path, shm_path: Path, rng: np.random.Generator, rows: int, dim: int, kind: str
) -> None:
    keys, vectors = write_table(tmp_path / "t", rng, rows, dim, kind)
    default = float(rng.uniform(-2, 2))
    table = SharedHostTable(tmp_path / "t", dim, default_value=default)
    assert table.built_here and (table.rows, table.dim) == (rows, dim)
    assert table.file_bytes == rows * (8 + 4 * dim)
    queries = mixed_queries(rng, keys, max(64, rows))
    values, found = table.lookup(queries)
    expected, expected_found = reference_lookup(keys, vectors, queries, default)
    assert values.dtype == np.float32 and values.shape == (len(queries), dim)
    np.testing.assert_array_equal(found, expected_found)
    np.testing.assert_array_equal(values, expected)
    rows_found = table.find(queries)
    assert (rows_found >= 0).tolist() == expected_found.tolist()
    table.close()
    assert list(shm_path.iterdir()) == []


def test_lookup_into_out_and_of_2d_keys(
    tmp_path: Path, shm_path: Path, rng: np.random.Generator
) -> None:
    keys, vectors = write_table(tmp_path / "t", rng, 500, 6)
    table = SharedHostTable(tmp_path / "t", 6, default_value=-1.5)
    queries = mixed_queries(rng, keys, 300)
    expected, expected_found = reference_lookup(keys, vectors, queries, -1.5)

    out = np.full((len(queries), 6), np.nan, dtype=np.float32)
    values, found = table.lookup(queries, out=out)
    assert values is out
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(found, expected_found)

    n = len(queries) // 2 * 2
    values, found = table.lookup(queries[:n].reshape(2, -1))
    np.testing.assert_array_equal(values, expected[:n])
    np.testing.assert_array_equal(found, expected_found[:n])

    values, found = table.lookup(np.empty(0, np.int64))
    assert values.shape == (0, 6) and found.shape == (0,)
    table.close()


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8", "fp8"])
@pytest.mark.parametrize("n", [5, 2000])
def test_lookup_of_hashed_keys_equals_lookup(
    tmp_path: Path, rng: np.random.Generator, precision: str, n: int
) -> None:
    """``lookup_hashed`` (keys the caller hashed with ``mix64``, several tables' in one pass)
    answers as ``lookup`` does, through the binary search of a few keys and the bucket search
    of many, into a poisoned ``out`` as well."""
    keys, _ = write_table(tmp_path / "t", rng, 1000, 6)
    table = SharedHostTable(tmp_path / "t", 6, default_value=0.5, precision=precision)
    queries = mixed_queries(rng, keys, n)
    want, want_found = table.lookup(queries)
    out = np.full_like(want, np.nan)
    values, found = table.lookup_hashed(mix64(queries), out=out)
    assert values is out
    np.testing.assert_array_equal(values, want)
    np.testing.assert_array_equal(found, want_found)
    table.close()


@pytest.mark.parametrize("dtype", [np.int32, np.uint64, np.float64])
def test_lookup_rejects_non_int64_keys(tmp_path: Path, rng: np.random.Generator, dtype) -> None:
    write_table(tmp_path / "t", rng, 10, 2)
    table = SharedHostTable(tmp_path / "t", 2)
    with pytest.raises(TypeError, match=f"keys must be int64, got {np.dtype(dtype)}"):
        table.lookup(np.arange(3).astype(dtype))
    table.close()


def test_default_value_for_every_key_of_an_empty_table(tmp_path: Path, shm_path: Path) -> None:
    write_sparse_table(tmp_path / "t", np.empty(0, np.int64), np.empty((0, 5), np.float32))
    table = SharedHostTable(tmp_path / "t", 5, default_value=0.75)
    values, found = table.lookup(np.array(EXTREME_KEYS, dtype=np.int64))
    assert not found.any()
    np.testing.assert_array_equal(values, np.full((len(EXTREME_KEYS), 5), 0.75, np.float32))
    table.close()
    assert list(shm_path.iterdir()) == []


def test_duplicate_keys_in_the_file_name_the_key_file(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    keys = np.array([4, 8, 15, 16, 23, 42, 15, 4], dtype=np.int64)
    folder = tmp_path / "dups"
    write_sparse_table(folder, keys, random_vectors(rng, 8, 2), check_unique=False)
    with pytest.raises(ModelFileError) as info:
        SharedHostTable(folder, 2)
    message = str(info.value)
    assert message.startswith(f"{folder / KEY_FILE}: 2 duplicate keys: ")
    assert "4" in message and "15" in message
    # A corrected table loads (no half-built segment stands in the way).
    write_sparse_table(folder, keys[:6], random_vectors(rng, 6, 2), overwrite=True)
    table = SharedHostTable(folder, 2)
    assert table.rows == 6
    table.close()


def truncate(path: Path, nbytes: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(nbytes)


@pytest.mark.parametrize(
    ("damage", "dim", "named"),
    [
        (lambda d: truncate(d / VECTOR_FILE, 40 * 4 * 3 - 4), 3, VECTOR_FILE),
        (lambda d: truncate(d / KEY_FILE, 40 * 8 - 3), 3, KEY_FILE),
        (lambda d: truncate(d / KEY_FILE, 39 * 8), 3, KEY_FILE),  # the one cut short
        (lambda d: None, 4, VECTOR_FILE),  # the ps.json's dim disagrees with the files
        (lambda d: (d / VECTOR_FILE).unlink(), 3, VECTOR_FILE),
        (lambda d: (d / KEY_FILE).unlink(), 3, KEY_FILE),
    ],
    ids=["vector-truncated", "key-partial", "key-short", "wrong-dim", "no-vectors", "no-keys"],
)
def test_broken_files_raise_model_file_error_naming_the_file(
    tmp_path: Path, shm_path: Path, rng: np.random.Generator, damage, dim: int, named: str
) -> None:
    folder = tmp_path / "t"
    write_table(folder, rng, 40, 3)
    damage(folder)
    with pytest.raises(ModelFileError, match=re.escape(str(folder / named))):
        SharedHostTable(folder, dim)
    assert data_files(shm_path) == []


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(
        ModelFileError, match=re.escape(f"{tmp_path / 'nowhere'}: sparse model folder")
    ):
        SharedHostTable(tmp_path / "nowhere", 4)


def test_file_truncated_during_build_raises_model_file_error(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "t"
    write_table(folder, rng, 50, 4)
    inspect = host_table_module.inspect_sparse_table

    def inspect_then_truncate(path, dim):
        info = inspect(path, dim)
        truncate(Path(path) / VECTOR_FILE, 100)  # another process rewrites the table now
        return info

    monkeypatch.setattr(host_table_module, "inspect_sparse_table", inspect_then_truncate)
    with pytest.raises(ModelFileError, match=re.escape(str(folder / VECTOR_FILE))):
        SharedHostTable(folder, 4)


def test_two_tables_on_one_folder_share_one_segment(
    tmp_path: Path, shm_path: Path, rng: np.random.Generator
) -> None:
    keys, vectors = write_table(tmp_path / "t", rng, 2000, 16)
    first = SharedHostTable(tmp_path / "t", 16)
    second = SharedHostTable(tmp_path / "t", 16, default_value=9.0)
    assert first.built_here and not second.built_here
    assert first.segment_path == second.segment_path
    assert data_files(shm_path) == [first.segment_path]
    assert first.segment_path.stat().st_size == first.nbytes
    assert first.nbytes <= 1.3 * first.file_bytes

    queries = mixed_queries(rng, keys, 1000)
    first.close()
    values, _ = second.lookup(queries)  # still served after the other one detached
    np.testing.assert_array_equal(values, reference_lookup(keys, vectors, queries, 9.0)[0])
    second.close()
    assert list(shm_path.iterdir()) == []


def test_rewritten_folder_gets_a_new_segment(
    tmp_path: Path, shm_path: Path, rng: np.random.Generator
) -> None:
    folder = tmp_path / "t"
    old_keys, old_vectors = write_table(folder, rng, 300, 4)
    old = SharedHostTable(folder, 4)
    new_keys, new_vectors = write_table(folder, rng, 300, 4)
    new = SharedHostTable(folder, 4)
    assert new.built_here and new.segment_path != old.segment_path
    assert len(data_files(shm_path)) == 2

    values, _ = new.lookup(new_keys)
    np.testing.assert_array_equal(values, new_vectors)
    values, _ = old.lookup(old_keys)  # the old mapping still holds the old rows
    np.testing.assert_array_equal(values, old_vectors)
    old.close()
    new.close()
    assert list(shm_path.iterdir()) == []


def test_segment_name_covers_dim_and_file_identity(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    folder = tmp_path / "t"
    write_table(folder, rng, 20, 2)
    name = segment_name(folder, 2)
    assert name == segment_name(folder, 2) == segment_name(tmp_path / "." / "t", 2)
    assert len(name) == 32 and int(name, 16) >= 0
    assert segment_name(folder, 4) != name
    st = (folder / VECTOR_FILE).stat()
    os.utime(folder / VECTOR_FILE, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert segment_name(folder, 2) != name


# ---------------------------------------------------------------- compressed storage

COMPRESSED = [StoragePrecision.FP16, StoragePrecision.INT8, StoragePrecision.FP8]


def small_chunks(monkeypatch: pytest.MonkeyPatch, rows: int, dim: int) -> None:
    """Read the vector file in chunks of ``rows`` rows (on several threads) while a segment
    is built."""
    monkeypatch.setattr(sparse_module, "DEFAULT_CHUNK_BYTES", rows * 4 * dim)


@pytest.mark.parametrize("precision", COMPRESSED, ids=str)
@pytest.mark.parametrize(("rows", "dim"), [(0, 4), (7, 3), (1000, 33), (5000, 128)], ids=str)
def test_compressed_table_answers_its_quantised_rows(
    tmp_path: Path,
    shm_path: Path,
    rng: np.random.Generator,
    monkeypatch: pytest.MonkeyPatch,
    precision: StoragePrecision,
    rows: int,
    dim: int,
) -> None:
    """Built chunk by chunk (7 rows at a time), a compressed table holds the reference
    quantiser's bytes for each file row, answers them decoded, and takes less memory."""
    keys, vectors = write_table(tmp_path / "t", rng, rows, dim)
    # Rows of every scale, and the edge rows of each codec: constant, zero, huge.
    vectors *= (10.0 ** rng.uniform(-3, 3, (rows, 1))).astype(np.float32)
    if rows >= 7:
        vectors[1] = 0.0
        vectors[2] = 3.5
        vectors[3, 0] = 3e38
    write_sparse_table(tmp_path / "t", keys, vectors, overwrite=True)
    small_chunks(monkeypatch, 7, dim)
    fmt = RowFormat(precision, dim)
    default = float(rng.uniform(-2, 2))
    table = SharedHostTable(tmp_path / "t", dim, default_value=default, precision=precision)
    fp32 = SharedHostTable(tmp_path / "t", dim, default_value=default)
    assert table.row_format == fmt and table.segment_path != fp32.segment_path
    assert table.nbytes <= fp32.nbytes  # equal only where the row is not smaller (int8, dim 3)
    queries = mixed_queries(rng, keys, max(64, rows))
    file_rows = expected_rows(row_reference(keys), queries)
    known = file_rows >= 0
    want_stored = np.empty((len(queries), fmt.row_words), fmt.stored_dtype)
    want_stored[known] = reference_stored(fmt, vectors[file_rows[known]])
    want_stored[~known] = reference_stored(fmt, np.full((1, dim), default, np.float32))
    want = np.full((len(queries), dim), default, np.float32)
    want[known] = reference_decoded(fmt, vectors[file_rows[known]])

    stored, found = table.lookup_stored(queries)
    np.testing.assert_array_equal(found, known)
    assert stored.dtype == fmt.stored_dtype
    np.testing.assert_array_equal(stored, want_stored)
    out = np.full((len(queries), dim), np.nan, np.float32)  # poisoned: every row is written
    values, found = table.lookup(queries, out=out)
    assert values is out
    np.testing.assert_array_equal(found, known)
    np.testing.assert_array_equal(values, want)
    np.testing.assert_array_equal(table.read_rows(table.find(queries[known])), want[known])
    keys_held, decoded = table.contents()
    order = expected_rows(row_reference(keys), keys_held)
    np.testing.assert_array_equal(decoded, reference_decoded(fmt, vectors[order]))
    np.testing.assert_array_equal(table.stored_contents()[1], reference_stored(fmt, vectors[order]))
    table.close()
    fp32.close()


@pytest.mark.parametrize("precision", COMPRESSED, ids=str)
def test_compressed_rows_written_in_place_are_quantised(
    tmp_path: Path, rng: np.random.Generator, precision: StoragePrecision
) -> None:
    keys, _ = write_table(tmp_path / "t", rng, 300, 12)
    fmt = RowFormat(precision, 12)
    table = SharedHostTable(tmp_path / "t", 12, writable=True, precision=precision)
    rows = table.find(keys[:50])
    update = (rng.standard_normal((50, 12)) * 7).astype(np.float32)
    table.write_rows(rows, update)
    np.testing.assert_array_equal(table.read_stored(rows), reference_stored(fmt, update))
    np.testing.assert_array_equal(table.lookup(keys[:50])[0], reference_decoded(fmt, update))
    before = table.read_stored(rows[:5])
    table.write_stored(rows[:5], table.read_stored(rows[5:10]))
    np.testing.assert_array_equal(table.read_stored(rows[:5]), table.read_stored(rows[5:10]))
    table.write_stored(rows[:5], before)  # an undo puts the bytes back exactly
    np.testing.assert_array_equal(table.read_stored(rows[:5]), before)
    table.close()
