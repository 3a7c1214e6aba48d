"""A sparse table whose two files disagree: the message says which file looks truncated.

The ps.json's dim is trusted: an ``emb_vector`` smaller than its keys need is a cut file,
whatever whole rows of another dim it may still hold (issue 47); a larger one is a wrong dim
or a cut ``key`` file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from formats_testdata import RandomTable

from hps_core.errors import ModelFileError
from hps_core.formats.sparse import inspect_sparse_table, read_sparse_table
from hps_core.formats.sparse_writer import write_sparse_table


def _raw_folder(tmp_path: Path, keys: int, floats: int) -> Path:
    folder = tmp_path / "0_sparse_model"
    folder.mkdir()
    (folder / "key").write_bytes(np.arange(keys, dtype="<i8").tobytes())
    (folder / "emb_vector").write_bytes(np.zeros(floats, dtype="<f4").tobytes())
    return folder


def _message(folder: Path, dim: int) -> str:
    with pytest.raises(ModelFileError) as err:
        inspect_sparse_table(folder, dim)
    with pytest.raises(ModelFileError) as err_read:
        read_sparse_table(folder, dim)
    assert str(err_read.value) == str(err.value)
    return str(err.value)


def test_key_file_one_key_short(tmp_path: Path) -> None:
    # The case of issue 12: 100,000 vectors of dim 16 and a key file cut one key short.
    folder = _raw_folder(tmp_path, 99_999, 16 * 100_000)
    assert _message(folder, 16) == (
        f"{folder / 'key'} looks truncated, 1 key (8 bytes) short: emb_vector holds 100,000 "
        f"vectors of dim 16, which need 800,000 bytes of keys; key holds 799,992 (99%), "
        f"99,999 keys"
    )


def test_key_file_cut_by_the_filesystem(tmp_path: Path, random_table: RandomTable) -> None:
    folder = tmp_path / "t"
    write_sparse_table(folder, *random_table(50, 8))
    with (folder / "key").open("r+b") as f:
        f.truncate(8 * 47)
    message = _message(folder, 8)
    assert message.startswith(f"{folder / 'key'} looks truncated, 3 keys (24 bytes) short")


def test_emb_vector_rows_short(tmp_path: Path, random_table: RandomTable) -> None:
    folder = tmp_path / "t"
    write_sparse_table(folder, *random_table(50, 8))
    with (folder / "emb_vector").open("r+b") as f:
        f.truncate(4 * 8 * 48)
    assert _message(folder, 8) == (
        f"{folder / 'emb_vector'} looks truncated, 2 vectors (64 bytes) short: key holds 50 "
        f"keys of dim 8, which need 1,600 bytes; emb_vector holds 1,536 (96%), 48 vectors"
    )


def test_empty_emb_vector(tmp_path: Path) -> None:
    folder = _raw_folder(tmp_path, 3, 0)
    assert _message(folder, 2) == (
        f"{folder / 'emb_vector'} looks truncated, 3 vectors (24 bytes) short: key holds "
        f"3 keys of dim 2, which need 24 bytes; emb_vector holds 0 (0%), 0 vectors"
    )


def test_files_that_agree_on_a_larger_dim(tmp_path: Path) -> None:
    # Written with dim 16, the ps.json says 8: a wrong dim first (a vector file is never cut
    # longer), a key file cut at half second.
    folder = _raw_folder(tmp_path, 100, 100 * 16)
    assert _message(folder, 8) == (
        f"{folder / 'emb_vector'}: dim 8 does not match: emb_vector holds 1,600 floats for 100 "
        f"keys (16.00 per key); the two files agree on dim 16; or {folder / 'key'} looks "
        f"truncated, 100 keys (800 bytes) short: emb_vector holds 200 vectors of dim 8, which "
        f"need 1,600 bytes of keys; key holds 800 (50%), 100 keys"
    )


def test_a_vector_file_cut_inside_a_vector_says_how_many_bytes_are_missing(
    tmp_path: Path,
) -> None:
    # 20,000 keys of dim 32 need 640,000 floats; 25 floats (100 bytes) are gone.
    folder = _raw_folder(tmp_path, 20000, 639975)
    assert _message(folder, 32) == (
        f"{folder / 'emb_vector'} looks truncated, 100 bytes short, cut inside a vector: key "
        f"holds 20,000 keys of dim 32, which need 2,560,000 bytes; emb_vector holds 2,559,900 "
        f"(99%); or it is not this table's file"
    )


def test_extra_bytes_that_are_not_whole_vectors_are_counted(tmp_path: Path) -> None:
    folder = _raw_folder(tmp_path, 100, 1634)
    assert _message(folder, 16) == (
        f"{folder / 'emb_vector'}: 136 bytes more than 100 keys of dim 16 need (6,400), not "
        f"whole vectors; emb_vector holds 1,634 floats for 100 keys (16.34 per key)"
    )


def test_a_vector_file_cut_inside_a_float_says_how_many_bytes_are_missing(
    tmp_path: Path,
) -> None:
    folder = _raw_folder(tmp_path, 10, 40)
    with (folder / "emb_vector").open("r+b") as f:
        f.truncate(4 * 40 - 3)
    assert _message(folder, 4) == (
        f"{folder / 'emb_vector'} looks truncated, 3 bytes short, cut inside a float: key holds "
        f"10 keys of dim 4, which need 160 bytes; emb_vector holds 157 (98%); or it is not this "
        f"table's file"
    )


# Issue 47: 100,000 keys of dim 16 (6,400,000 bytes of emb_vector), the vector file cut.
ROWS, DIM, NEED = 100_000, 16, 100_000 * 16 * 4


def _cut_table(tmp_path: Path, vector_bytes: int, key_rows: int = ROWS) -> Path:
    folder = tmp_path / "0_sparse_model"
    write_sparse_table(
        folder,
        np.arange(ROWS, dtype=np.int64),
        np.random.default_rng(1).standard_normal((ROWS, DIM), dtype=np.float32),
    )
    with (folder / "emb_vector").open("r+b") as f:
        f.truncate(vector_bytes)
    with (folder / "key").open("r+b") as f:
        f.truncate(8 * key_rows)
    return folder


def test_a_vector_file_cut_at_exactly_half_is_truncated_not_another_dim(tmp_path: Path) -> None:
    # Half of dim 16 is whole rows of dim 8: the ps.json's dim 16 is trusted, dim 8 is named
    # as the other explanation only.
    folder = _cut_table(tmp_path, NEED // 2)
    assert _message(folder, DIM) == (
        f"{folder / 'emb_vector'} looks truncated, 50,000 vectors (3,200,000 bytes) short: key "
        f"holds 100,000 keys of dim 16, which need 6,400,000 bytes; emb_vector holds 3,200,000 "
        f"(50%), 50,000 vectors; or dim 16 is wrong: both files agree on dim 8"
    )


def test_a_vector_file_cut_at_70_percent(tmp_path: Path) -> None:
    folder = _cut_table(tmp_path, NEED * 7 // 10)
    assert _message(folder, DIM) == (
        f"{folder / 'emb_vector'} looks truncated, 30,000 vectors (1,920,000 bytes) short: key "
        f"holds 100,000 keys of dim 16, which need 6,400,000 bytes; emb_vector holds 4,480,000 "
        f"(70%), 70,000 vectors"
    )


def test_a_vector_file_one_byte_short(tmp_path: Path) -> None:
    folder = _cut_table(tmp_path, NEED - 1)
    assert _message(folder, DIM) == (
        f"{folder / 'emb_vector'} looks truncated, 1 byte short, cut inside a float: key holds "
        f"100,000 keys of dim 16, which need 6,400,000 bytes; emb_vector holds 6,399,999 (99%); "
        f"or it is not this table's file"
    )


def test_a_table_written_with_a_larger_dim_is_a_dim_mismatch(
    tmp_path: Path, random_table: RandomTable
) -> None:
    # Written with dim 32, the ps.json says 16: the file is larger than its keys need.
    folder = tmp_path / "t"
    write_sparse_table(folder, *random_table(1000, 32))
    assert _message(folder, 16).startswith(
        f"{folder / 'emb_vector'}: dim 16 does not match: emb_vector holds 32,000 floats for "
        f"1,000 keys (32.00 per key); the two files agree on dim 32; or {folder / 'key'} looks "
        f"truncated"
    )


def test_a_table_written_with_a_smaller_dim_names_it_second(
    tmp_path: Path, random_table: RandomTable
) -> None:
    # Written with dim 10, the ps.json says 16: not whole vectors of 16, whole rows of 10.
    folder = tmp_path / "t"
    write_sparse_table(folder, *random_table(100, 10))
    assert _message(folder, 16) == (
        f"{folder / 'emb_vector'} looks truncated, 2,400 bytes short, cut inside a vector: key "
        f"holds 100 keys of dim 16, which need 6,400 bytes; emb_vector holds 4,000 (62%); or dim "
        f"16 is wrong: both files agree on dim 10"
    )


def test_a_key_file_cut_at_70_percent(tmp_path: Path) -> None:
    folder = _cut_table(tmp_path, NEED, key_rows=70_000)
    assert _message(folder, DIM) == (
        f"{folder / 'key'} looks truncated, 30,000 keys (240,000 bytes) short: emb_vector holds "
        f"100,000 vectors of dim 16, which need 800,000 bytes of keys; key holds 560,000 (70%), "
        f"70,000 keys"
    )


def test_a_key_file_cut_at_half_names_both_explanations(tmp_path: Path) -> None:
    # 50,000 keys and 100,000 vectors of dim 16 are as well 50,000 rows of dim 32.
    folder = _cut_table(tmp_path, NEED, key_rows=50_000)
    message = _message(folder, DIM)
    assert message.startswith(f"{folder / 'emb_vector'}: dim 16 does not match")
    assert message.endswith(
        f"or {folder / 'key'} looks truncated, 50,000 keys (400,000 bytes) short: emb_vector "
        f"holds 100,000 vectors of dim 16, which need 800,000 bytes of keys; key holds 400,000 "
        f"(50%), 50,000 keys"
    )


def test_the_whole_table_still_reads(tmp_path: Path) -> None:
    folder = _cut_table(tmp_path, NEED)
    keys, vectors = read_sparse_table(folder, DIM)
    assert keys.shape == (ROWS,) and vectors.shape == (ROWS, DIM)
