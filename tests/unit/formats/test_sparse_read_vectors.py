"""``read_vectors``: a table's vector file read on several threads, straight into place or chunk
by chunk, each chunk prepared (its pages allocated) before it is read, against NumPy's own read
of the file."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

import hps_core.formats.sparse as sparse_module
from hps_core.errors import ModelFileError
from hps_core.formats.sparse import VECTOR_FILE, inspect_sparse_table, read_vectors
from hps_core.formats.sparse_writer import write_sparse_table


@pytest.fixture
def table(tmp_path: Path) -> tuple[Path, np.ndarray]:
    rng = np.random.default_rng(5)
    vectors = rng.standard_normal((1001, 6)).astype(np.float32)
    write_sparse_table(tmp_path / "t", np.arange(1001, dtype=np.int64) * 3, vectors)
    return tmp_path / "t", vectors


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("chunk_rows", [1, 7, 5000])
def test_read_straight_into_place_equals_the_file(
    table, monkeypatch: pytest.MonkeyPatch, threads: int, chunk_rows: int
) -> None:
    folder, vectors = table
    monkeypatch.setattr(sparse_module, "DEFAULT_CHUNK_BYTES", chunk_rows * 6 * 4)
    info = inspect_sparse_table(folder, 6)
    for rows in (1001, 500, 0):  # the whole table, its first rows, none
        out = np.full((rows, 6), np.nan, np.float32)
        read_vectors(info, rows, out=out, threads=threads)
        np.testing.assert_array_equal(out, vectors[:rows])


def test_chunks_are_prepared_in_order_before_they_are_read(
    table, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, vectors = table
    monkeypatch.setattr(sparse_module, "DEFAULT_CHUNK_BYTES", 100 * 6 * 4)
    prepared: list[tuple[int, int]] = []
    read: dict[int, np.ndarray] = {}
    lock = threading.Lock()

    def consume(start: int, chunk: np.ndarray) -> None:
        with lock:
            assert (start, start + len(chunk)) in prepared  # prepared before it was read
            read[start] = chunk.copy()

    read_vectors(
        inspect_sparse_table(folder, 6),
        1001,
        consume=consume,
        prepare=lambda a, b: prepared.append((a, b)),
        threads=3,
    )
    assert prepared == [(a, min(a + 100, 1001)) for a in range(0, 1001, 100)]
    np.testing.assert_array_equal(np.concatenate([read[a] for a in sorted(read)]), vectors)


def test_a_chunk_that_cannot_be_prepared_fails_the_read(
    table, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, _ = table
    monkeypatch.setattr(sparse_module, "DEFAULT_CHUNK_BYTES", 100 * 6 * 4)

    def prepare(start: int, stop: int) -> None:
        if start >= 300:
            raise OSError("no space left for rows 300-")

    out = np.zeros((1001, 6), np.float32)
    with pytest.raises(OSError, match="no space left for rows 300-"):
        read_vectors(inspect_sparse_table(folder, 6), 1001, out=out, prepare=prepare, threads=2)
    assert not out[300:].any()  # no chunk past the failure was read


def test_a_file_cut_while_it_is_read_names_it(table) -> None:
    folder, _ = table
    info = inspect_sparse_table(folder, 6)
    with open(folder / VECTOR_FILE, "r+b") as f:
        f.truncate(500 * 6 * 4)
    with pytest.raises(ModelFileError, match=r"emb_vector: file ended at byte 12000"):
        read_vectors(info, 1001, out=np.zeros((1001, 6), np.float32))
