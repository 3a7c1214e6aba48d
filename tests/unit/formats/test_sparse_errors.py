"""Bad sparse model folders and bad arrays: each error names the path and the numbers."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from formats_testdata import EXTREME_KEYS, INT64_MAX, INT64_MIN, RandomTable

from hps_core.errors import HPSError, ModelFileError
from hps_core.formats.keys import check_unique_keys, find_duplicate_keys
from hps_core.formats.sparse import inspect_sparse_table, iter_sparse_table, read_sparse_table
from hps_core.formats.sparse_writer import write_sparse_table


def _folder(tmp_path: Path, key_bytes: int, vector_bytes: int) -> Path:
    folder = tmp_path / "0_sparse_model"
    folder.mkdir()
    (folder / "key").write_bytes(b"\1" * key_bytes)
    (folder / "emb_vector").write_bytes(b"\2" * vector_bytes)
    return folder


def _error(path: Path, dim: int | None = None) -> str:
    with pytest.raises(ModelFileError) as err:
        inspect_sparse_table(path, dim)
    assert isinstance(err.value, HPSError)
    # Reading goes through the same checks, before touching the data.
    with pytest.raises(ModelFileError) as err_read:
        read_sparse_table(path, dim)
    with pytest.raises(ModelFileError) as err_iter:
        iter_sparse_table(path, dim)
    assert str(err_read.value) == str(err_iter.value) == str(err.value)
    return str(err.value)


def test_missing_folder(tmp_path: Path) -> None:
    message = _error(tmp_path / "absent")
    assert message == f"{tmp_path / 'absent'}: sparse model folder does not exist"


def test_path_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"")
    assert _error(tmp_path / "f").startswith(f"{tmp_path / 'f'}: is not a folder")


@pytest.mark.parametrize("absent", ["key", "emb_vector"])
def test_missing_file(tmp_path: Path, absent: str) -> None:
    folder = _folder(tmp_path, 80, 320)
    (folder / absent).unlink()
    message = _error(folder, 4)
    assert message.startswith(f"{folder / absent}: missing;")


def test_truncated_key_file(tmp_path: Path) -> None:
    folder = _folder(tmp_path, 8 * 10 + 3, 4 * 40)
    message = _error(folder, 4)
    assert message.startswith(f"{folder / 'key'}: size 83 bytes is not a multiple of 8")


def test_truncated_emb_vector(tmp_path: Path) -> None:
    folder = _folder(tmp_path, 80, 4 * 40 - 1)
    message = _error(folder, 4)
    assert message.startswith(f"{folder / 'emb_vector'} looks truncated, 1 byte short")
    # Without a dim to trust, the size alone says it is not whole floats.
    message = _error(folder)
    assert message.startswith(f"{folder / 'emb_vector'}: size 159 bytes is not a multiple of 4")


def test_wrong_dim(tmp_path: Path) -> None:
    folder = _folder(tmp_path, 8 * 100, 4 * 1234)
    assert _error(folder, 16) == (
        f"{folder / 'emb_vector'} looks truncated, 1,464 bytes short, cut inside a vector: key "
        f"holds 100 keys of dim 16, which need 6,400 bytes; emb_vector holds 4,936 (77%); or it "
        f"is not this table's file"
    )


def test_dim_given_but_a_whole_row_is_missing(tmp_path: Path) -> None:
    folder = _folder(tmp_path, 8 * 10, 4 * 16 * 9)
    assert _error(folder, 16).startswith(
        f"{folder / 'emb_vector'} looks truncated, 1 vector (64 bytes) short"
    )


def test_inferred_dim_does_not_divide(tmp_path: Path) -> None:
    folder = _folder(tmp_path, 8 * 100, 4 * 1234)
    message = _error(folder)
    assert message.startswith(
        f"{folder / 'emb_vector'}: emb_vector holds 1234 floats for 100 keys (12.34 per key), "
        f"not a whole positive number per key"
    )
    assert str(folder / "key") in message


def test_keys_without_vectors(tmp_path: Path) -> None:
    assert "holds 0 floats for 3 keys" in _error(_folder(tmp_path, 24, 0))


def test_vectors_without_keys(tmp_path: Path) -> None:
    folder = _folder(tmp_path, 0, 20)
    assert _error(folder, 5) == (
        f"{folder / 'emb_vector'}: emb_vector holds 5 floats but {folder / 'key'} holds 0 keys"
    )


def test_empty_table_needs_a_dim(tmp_path: Path) -> None:
    folder = _folder(tmp_path, 0, 0)
    assert "table is empty (0 keys)" in _error(folder)
    assert inspect_sparse_table(folder, 3).rows == 0


@pytest.mark.parametrize("bad", [0, -2, True, 2.0])
def test_dim_and_chunk_rows_must_be_positive_integers(tmp_path: Path, bad: object) -> None:
    folder = _folder(tmp_path, 8, 8)
    with pytest.raises(ValueError, match="dim must be a positive integer"):
        inspect_sparse_table(folder, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="chunk_rows must be a positive integer"):
        iter_sparse_table(folder, 2, chunk_rows=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("keys", "vectors", "expected"),
    [
        (np.arange(3, dtype=np.int32), np.zeros((3, 2), np.float32), "keys must be a 1-D int64"),
        (np.arange(3).reshape(3, 1), np.zeros((3, 2), np.float32), "keys must be a 1-D int64"),
        ([1, 2, 3], np.zeros((3, 2), np.float32), "keys must be a 1-D int64 array, got list"),
        (np.arange(3), np.zeros((3, 2)), "vectors must be a 2-D float32 array, got float64"),
        (np.arange(3), np.zeros(6, np.float32), "vectors must be a 2-D float32 array"),
        (np.arange(3), np.zeros((4, 2), np.float32), "3 keys but 4 vectors"),
        (np.arange(3), np.zeros((3, 0), np.float32), "vectors have dim 0"),
    ],
)
def test_write_validates_dtypes_and_shapes(
    tmp_path: Path, keys: object, vectors: object, expected: str
) -> None:
    with pytest.raises(ModelFileError, match=expected) as err:
        write_sparse_table(tmp_path / "t", keys, vectors)  # type: ignore[arg-type]
    assert str(err.value).startswith(f"{tmp_path / 't'}: ")
    assert not (tmp_path / "t").exists()


def test_write_refuses_to_replace_a_table_unless_asked(
    tmp_path: Path, random_table: RandomTable
) -> None:
    write_sparse_table(tmp_path / "t", *random_table(3, 2))
    with pytest.raises(ModelFileError, match="already exists; refusing to overwrite") as err:
        write_sparse_table(tmp_path / "t", *random_table(3, 2))
    assert str(tmp_path / "t" / "key") in str(err.value)
    (tmp_path / "f").write_text("x")
    with pytest.raises(ModelFileError, match="exists and is not a folder"):
        write_sparse_table(tmp_path / "f", *random_table(3, 2))


def test_write_into_an_impossible_folder(tmp_path: Path, random_table: RandomTable) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ModelFileError) as err:
        write_sparse_table(tmp_path / "file" / "t", *random_table(3, 2))
    assert str(err.value).startswith(f"{tmp_path / 'file' / 't'}: cannot create the table files: ")
    assert (tmp_path / "file").read_text() == "x"


def test_write_refuses_duplicate_keys_and_leaves_nothing(tmp_path: Path) -> None:
    keys = np.array([4, 9, 4, INT64_MIN, 9, 4, INT64_MIN, 1], np.int64)
    with pytest.raises(ModelFileError) as err:
        write_sparse_table(tmp_path / "t", keys, np.zeros((8, 2), np.float32))
    assert str(err.value) == (
        f"{tmp_path / 't'}: 3 keys appear more than once (4 extra rows): {INT64_MIN}, 4, 9"
    )
    assert not (tmp_path / "t").exists()
    write_sparse_table(tmp_path / "t", keys, np.zeros((8, 2), np.float32), check_unique=False)
    assert inspect_sparse_table(tmp_path / "t", 2).rows == 8


@pytest.mark.parametrize("size", [0, 1, 2, 10, 1000, 20000])
@pytest.mark.parametrize("spread", [5, 1 << 40])
def test_find_duplicate_keys_matches_a_counter(
    rng: np.random.Generator, size: int, spread: int
) -> None:
    keys = rng.integers(-spread, spread, size, dtype=np.int64)
    # Plant the extremes, some of them twice.
    keys = np.concatenate([keys, np.array(EXTREME_KEYS + EXTREME_KEYS[::3], np.int64)])
    rng.shuffle(keys)
    expected = sorted(k for k, n in Counter(keys.tolist()).items() if n > 1)
    got = find_duplicate_keys(keys)
    assert got.dtype == np.int64
    assert got.tolist() == expected


def test_unique_keys_pass_including_extremes(rng: np.random.Generator) -> None:
    keys = np.array(EXTREME_KEYS, np.int64)
    assert find_duplicate_keys(keys).size == 0
    check_unique_keys(keys, "t")
    check_unique_keys(np.empty(0, np.int64), "t")
    check_unique_keys(np.array([INT64_MAX]), "t")


def test_check_unique_keys_lists_five_and_counts(rng: np.random.Generator) -> None:
    repeated = rng.choice(np.arange(-1000, 1000), 12, replace=False)
    keys = np.concatenate([np.arange(5000, 5100), repeated, repeated, repeated[:3]])
    rng.shuffle(keys)
    with pytest.raises(ModelFileError) as err:
        check_unique_keys(keys, "/m/0_sparse_model/key")
    shown = ", ".join(str(k) for k in sorted(repeated.tolist())[:5])
    assert str(err.value) == (
        f"/m/0_sparse_model/key: 12 keys appear more than once (15 extra rows): {shown}, ..."
    )
