"""A sparse table whose two files disagree: the message says which file looks truncated."""

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
        f"{folder / 'key'} looks truncated, 1 key (8 bytes) short: emb_vector holds 100000 "
        f"vectors of dim 16, key 99999 keys"
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
        f"keys, emb_vector 48 vectors of dim 8"
    )


def test_empty_emb_vector(tmp_path: Path) -> None:
    folder = _raw_folder(tmp_path, 3, 0)
    assert _message(folder, 2) == (
        f"{folder / 'emb_vector'} looks truncated, 3 vectors (24 bytes) short: key holds "
        f"3 keys, emb_vector 0 vectors of dim 2"
    )


def test_files_that_agree_on_another_dim(tmp_path: Path) -> None:
    # A wrong dim (in the ps.json, say), not a truncated file.
    folder = _raw_folder(tmp_path, 100, 100 * 16)
    assert _message(folder, 8) == (
        f"{folder / 'emb_vector'}: dim 8 does not match: emb_vector holds 1600 floats for 100 "
        f"keys (16.00 per key); the two files agree on dim 16"
    )


def test_a_vector_file_cut_inside_a_vector_says_how_many_bytes_are_missing(
    tmp_path: Path,
) -> None:
    # 20,000 keys of dim 32 need 640,000 floats; 25 floats (100 bytes) are gone.
    folder = _raw_folder(tmp_path, 20000, 639975)
    assert _message(folder, 32) == (
        f"{folder / 'emb_vector'}: 100 bytes missing: 20000 keys of dim 32 need 2,560,000 "
        f"bytes of emb_vector, it holds 2,559,900 (cut inside a vector, or not this table's file)"
    )


def test_extra_bytes_that_are_not_whole_vectors_are_counted(tmp_path: Path) -> None:
    folder = _raw_folder(tmp_path, 100, 1634)
    assert _message(folder, 16) == (
        f"{folder / 'emb_vector'}: 136 bytes more than 100 keys of dim 16 need (6,400), not "
        f"whole vectors; emb_vector holds 1634 floats for 100 keys (16.34 per key)"
    )


def test_a_vector_file_cut_inside_a_float_says_how_many_bytes_are_missing(
    tmp_path: Path,
) -> None:
    folder = _raw_folder(tmp_path, 10, 40)
    with (folder / "emb_vector").open("r+b") as f:
        f.truncate(4 * 40 - 3)
    assert _message(folder, 4).endswith(
        "is not a multiple of 4 (float32 values); the file is truncated or not a HugeCTR "
        "emb_vector file; 10 keys of dim 4 need 160 bytes: 3 bytes missing"
    )
