"""Reading and writing HugeCTR sparse model folders, checked against byte-level references."""

from __future__ import annotations

import io
import logging
import re
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from formats_testdata import EXTREME_KEYS, RandomTable

from hps_core.errors import ModelFileError
from hps_core.formats.sparse import (
    SparseChunk,
    inspect_sparse_table,
    iter_sparse_table,
    read_sparse_table,
)
from hps_core.formats.sparse_writer import SparseTableWriter, write_sparse_table

SIZES = [(0, 1), (0, 7), (1, 1), (1, 128), (2, 3), (7, 16), (100, 5), (1000, 128)]


def _bits(vectors: np.ndarray) -> np.ndarray:
    # Compare floats by their bits, so -0.0, NaN payloads and subnormals must survive too.
    return vectors.view(np.uint32)


def _write_raw(folder: Path, keys: list[int], floats: list[float]) -> None:
    """Write a sparse folder with struct, independently of the code under test."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "key").write_bytes(struct.pack(f"<{len(keys)}q", *keys))
    (folder / "emb_vector").write_bytes(struct.pack(f"<{len(floats)}f", *floats))


@pytest.mark.parametrize(("rows", "dim"), SIZES)
def test_written_files_hold_little_endian_keys_and_row_major_vectors(
    tmp_path: Path, random_table: RandomTable, rows: int, dim: int
) -> None:
    keys, vectors = random_table(rows, dim)
    folder = tmp_path / "0_sparse_model"
    write_sparse_table(folder, keys, vectors)

    key_bytes = (folder / "key").read_bytes()
    vec_bytes = (folder / "emb_vector").read_bytes()
    assert key_bytes == struct.pack(f"<{rows}q", *keys.tolist())
    assert vec_bytes == struct.pack(f"<{rows * dim}f", *vectors.ravel().tolist())
    assert sorted(p.name for p in folder.iterdir()) == ["emb_vector", "key"]


@pytest.mark.parametrize(("rows", "dim"), SIZES)
def test_round_trip_returns_the_written_arrays(
    tmp_path: Path, random_table: RandomTable, rows: int, dim: int
) -> None:
    keys, vectors = random_table(rows, dim)
    write_sparse_table(tmp_path / "t", keys, vectors)

    info = inspect_sparse_table(tmp_path / "t", dim)
    assert (info.rows, info.dim) == (rows, dim)
    if rows:
        assert inspect_sparse_table(tmp_path / "t") == info  # dim inferred from the sizes
    assert (info.key_bytes, info.vector_bytes) == (8 * rows, 4 * rows * dim)
    assert info.total_bytes == 8 * rows + 4 * rows * dim
    assert info.has_slot_id is False

    got_keys, got_vectors = read_sparse_table(tmp_path / "t", dim)
    assert got_keys.dtype == np.int64 and got_vectors.dtype == np.float32
    assert got_vectors.shape == (rows, dim)
    np.testing.assert_array_equal(got_keys, keys)
    np.testing.assert_array_equal(_bits(got_vectors), _bits(vectors))


def test_reader_decodes_files_written_independently(tmp_path: Path) -> None:
    keys = list(EXTREME_KEYS)
    floats = [float(i) * 0.5 - 3.0 for i in range(len(keys) * 3)]
    _write_raw(tmp_path / "t", keys, floats)

    got_keys, got_vectors = read_sparse_table(tmp_path / "t")
    assert got_keys.tolist() == keys
    assert got_vectors.tolist() == [floats[i : i + 3] for i in range(0, len(floats), 3)]


def test_special_float_values_survive_bit_for_bit(tmp_path: Path) -> None:
    special = np.array(
        [[0.0, -0.0, np.inf, -np.inf], [np.nan, 1e-45, -3.4028235e38, 1.0]], np.float32
    )
    write_sparse_table(tmp_path / "t", np.array([3, -3], np.int64), special)
    _, got = read_sparse_table(tmp_path / "t", 4)
    np.testing.assert_array_equal(_bits(got), _bits(special))


@pytest.mark.parametrize("chunk_rows", [1, 7, 10, 59, 60, 61, 1000])
def test_chunks_cover_the_table_in_order(
    tmp_path: Path, random_table: RandomTable, chunk_rows: int
) -> None:
    rows, dim = 60, 6
    keys, vectors = random_table(rows, dim)
    write_sparse_table(tmp_path / "t", keys, vectors)

    chunks = list(iter_sparse_table(tmp_path / "t", dim, chunk_rows=chunk_rows))
    assert all(isinstance(c, SparseChunk) for c in chunks)
    assert [c.start_row for c in chunks] == list(range(0, rows, chunk_rows))
    assert [len(c.keys) for c in chunks] == [
        min(chunk_rows, rows - s) for s in range(0, rows, chunk_rows)
    ]
    for start, chunk_keys, chunk_vectors in chunks:
        n = len(chunk_keys)
        np.testing.assert_array_equal(chunk_keys, keys[start : start + n])
        np.testing.assert_array_equal(chunk_vectors, vectors[start : start + n])
    whole_keys, whole_vectors = read_sparse_table(tmp_path / "t", dim)
    np.testing.assert_array_equal(np.concatenate([c.keys for c in chunks]), whole_keys)
    np.testing.assert_array_equal(np.concatenate([c.vectors for c in chunks]), whole_vectors)


def test_default_chunking_and_empty_table(tmp_path: Path, random_table: RandomTable) -> None:
    keys, vectors = random_table(33, 4)
    write_sparse_table(tmp_path / "t", keys, vectors)
    (chunk,) = iter_sparse_table(tmp_path / "t")
    np.testing.assert_array_equal(chunk.vectors, vectors)

    write_sparse_table(tmp_path / "e", *random_table(0, 4))
    assert list(iter_sparse_table(tmp_path / "e", 4)) == []


@pytest.mark.parametrize("victim", ["key", "emb_vector"])
def test_file_truncated_while_reading_is_an_error(
    tmp_path: Path, random_table: RandomTable, victim: str
) -> None:
    write_sparse_table(tmp_path / "t", *random_table(100, 4))
    chunks = iter_sparse_table(tmp_path / "t", 4, chunk_rows=10)
    next(chunks)
    path = tmp_path / "t" / victim
    row_bytes = 8 if victim == "key" else 16
    with open(path, "r+b") as f:
        f.truncate(25 * row_bytes)
    with pytest.raises(ModelFileError) as err:
        list(chunks)
    message = str(err.value)
    assert str(path) in message
    assert f"file ended at byte {25 * row_bytes}" in message
    assert f"from byte {20 * row_bytes}" in message


def test_slot_id_is_reported_and_ignored(
    tmp_path: Path, random_table: RandomTable, caplog: pytest.LogCaptureFixture
) -> None:
    keys, vectors = random_table(5, 2)
    write_sparse_table(tmp_path / "t", keys, vectors)
    (tmp_path / "t" / "slot_id").write_bytes(struct.pack("<5Q", 0, 1, 0, 2, 1))
    info = inspect_sparse_table(tmp_path / "t", 2)
    assert info.has_slot_id and info.rows == 5 and info.total_bytes == 40 + 40
    np.testing.assert_array_equal(read_sparse_table(tmp_path / "t", 2)[0], keys)
    assert not caplog.records

    (tmp_path / "t" / "slot_id").write_bytes(b"\0" * 16)
    with caplog.at_level(logging.WARNING, logger="hps_core"):
        assert inspect_sparse_table(tmp_path / "t", 2).has_slot_id
    assert "16 bytes for 5 keys (expected 40)" in caplog.text


def test_writer_streams_appends_and_commits_atomically(
    tmp_path: Path, random_table: RandomTable
) -> None:
    keys, vectors = random_table(50, 3)
    folder = tmp_path / "nested" / "t"
    with SparseTableWriter(folder) as writer:
        for start in range(0, 50, 20):
            writer.append(keys[start : start + 20], vectors[start : start + 20])
            # Nothing is published under the real names before the commit.
            assert not (folder / "key").exists() and not (folder / "emb_vector").exists()
        np.testing.assert_array_equal(writer.keys_written(), keys)
    assert writer.rows == 50 and writer.dim == 3
    got_keys, got_vectors = read_sparse_table(folder, 3)
    np.testing.assert_array_equal(got_keys, keys)
    np.testing.assert_array_equal(got_vectors, vectors)
    assert sorted(p.name for p in folder.iterdir()) == ["emb_vector", "key"]


def test_failed_write_keeps_the_previous_table(tmp_path: Path, random_table: RandomTable) -> None:
    old_keys, old_vectors = random_table(4, 2)
    write_sparse_table(tmp_path / "t", old_keys, old_vectors)
    with pytest.raises(RuntimeError), SparseTableWriter(tmp_path / "t", overwrite=True) as w:
        w.append(*random_table(9, 2))
        raise RuntimeError("conversion failed half way")
    got_keys, got_vectors = read_sparse_table(tmp_path / "t", 2)
    np.testing.assert_array_equal(got_keys, old_keys)
    np.testing.assert_array_equal(got_vectors, old_vectors)
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["emb_vector", "key"]


def test_overwrite_replaces_table_and_drops_stale_companions(
    tmp_path: Path, random_table: RandomTable
) -> None:
    write_sparse_table(tmp_path / "t", *random_table(4, 2))
    (tmp_path / "t" / "slot_id").write_bytes(b"\0" * 32)
    (tmp_path / "t" / "meta").write_bytes(b"\0" * 32)
    (tmp_path / "t" / "notes.txt").write_text("kept")
    keys, vectors = random_table(6, 5)
    write_sparse_table(tmp_path / "t", keys, vectors, overwrite=True)
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["emb_vector", "key", "notes.txt"]
    np.testing.assert_array_equal(read_sparse_table(tmp_path / "t", 5)[1], vectors)


def test_progress_logs_about_every_tenth_with_rate(
    tmp_path: Path, random_table: RandomTable, caplog: pytest.LogCaptureFixture
) -> None:
    write_sparse_table(tmp_path / "t", *random_table(100, 2))
    with caplog.at_level(logging.INFO, logger="hps_core"):
        list(iter_sparse_table(tmp_path / "t", 2, chunk_rows=5, progress=True))
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("hps_core")]
    assert len(lines) == 10
    assert all(f"reading {tmp_path / 't'}" in line and "rows/s" in line for line in lines)
    assert lines[0].split(": ")[1].startswith("10% (10/100 rows")
    assert "100% (100/100 rows" in lines[-1]

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hps_core"):
        list(iter_sparse_table(tmp_path / "t", 2, chunk_rows=5, progress=False))
        read_sparse_table(tmp_path / "t", 2)  # small table, progress=None: quiet
    assert not caplog.records


def test_progress_draws_a_bar_on_a_terminal(
    tmp_path: Path, random_table: RandomTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    write_sparse_table(tmp_path / "t", *random_table(40, 2))
    read_sparse_table(tmp_path / "t", 2, progress=True)
    assert re.search(r"100%.*40(\.0)?/40(\.0)? .*rows/s", terminal.getvalue())


def test_writer_rejects_a_dim_change_between_appends(
    tmp_path: Path, random_table: RandomTable
) -> None:
    with pytest.raises(ModelFileError, match=r"dim 3 appended to a table of dim 2"):  # noqa: SIM117
        with SparseTableWriter(tmp_path / "t") as writer:
            writer.append(*random_table(2, 2))
            writer.append(*random_table(2, 3))
    assert not (tmp_path / "t" / "key").exists()
