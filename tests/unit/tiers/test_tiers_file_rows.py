"""The model files as a tier (``hps_core.tiers.file_rows``): every answer compared with a
Python dict of the file rows, on several sizes and key kinds, repeats and unknown keys."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from tiers_testdata import make_keys, mixed_queries, random_vectors, row_reference

from hps_core.errors import ModelFileError, TierUnavailableError
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.tiers.file_rows import ModelFileRows, index_layout

DEFAULT = -2.5


def write(root: Path, rng: np.random.Generator, rows: int, dim: int, kind: str = "wide"):
    keys = make_keys(rng, rows, kind)
    vectors = random_vectors(rng, rows, dim)
    write_sparse_table(root / "t0", keys, vectors, overwrite=True)
    return keys, vectors


@pytest.mark.parametrize(
    ("rows", "dim", "kind"),
    [(1, 1, "dense"), (97, 4, "wide"), (5000, 16, "dense"), (20000, 3, "wide")],
)
def test_lookup_matches_a_dict_of_the_file_rows(
    tmp_path: Path, rng: np.random.Generator, shm_path: Path, rows: int, dim: int, kind: str
) -> None:
    keys, vectors = write(tmp_path, rng, rows, dim, kind)
    reference = row_reference(keys)
    files = ModelFileRows(tmp_path / "t0", dim)
    assert files.rows == rows and files.index_nbytes == index_layout(rows, dim).nbytes
    for n in (1, 64, 3 * rows):  # the binary-search and the bucket-probe paths
        queries = mixed_queries(rng, keys, n)
        values, found = files.lookup("any", queries, dim, DEFAULT)
        row = np.array([reference.get(q, -1) for q in queries.tolist()])
        np.testing.assert_array_equal(found, row >= 0)
        np.testing.assert_array_equal(values[row >= 0], vectors[row[row >= 0]])
        assert (values[row < 0] == np.float32(DEFAULT)).all()
    assert sorted(files.keys().tolist()) == sorted(keys.tolist())
    files.close()
    assert list(shm_path.iterdir()) == []


def test_two_opens_share_one_index_built_once(
    tmp_path: Path, rng: np.random.Generator, shm_path: Path
) -> None:
    keys, vectors = write(tmp_path, rng, 300, 4)
    first = ModelFileRows(tmp_path / "t0", 4)
    second = ModelFileRows(tmp_path / "t0", 4)
    assert first._segment.built_here and not second._segment.built_here
    first.close()
    values, found = second.lookup("t", keys[::-1].copy(), 4)
    assert found.all()
    np.testing.assert_array_equal(values, vectors[::-1])
    second.close()
    assert list(shm_path.iterdir()) == []


def test_files_changed_in_place_make_the_tier_unavailable(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    """The index belongs to the files it was built from: rows of rewritten files are never
    mixed with it (the tier fails, naming the folder and `hps reload`)."""
    keys, vectors = write(tmp_path, rng, 50, 4)
    files = ModelFileRows(tmp_path / "t0", 4)
    path = tmp_path / "t0" / "emb_vector"
    (vectors + 1).tofile(path)  # same size, new values, a new modification time
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    with pytest.raises(TierUnavailableError, match=r"t0: changed since the server loaded.*reload"):
        files.lookup("t", keys[:3], 4)
    path.unlink()
    with pytest.raises(TierUnavailableError, match="cannot be read"):
        files.lookup("t", keys[:3], 4)
    files.close()


def test_duplicate_keys_name_the_key_file(tmp_path: Path, shm_path: Path) -> None:
    folder = tmp_path / "t0"
    folder.mkdir()
    np.array([5, 9, 5], "<i8").tofile(folder / "key")  # the writer refuses to write this
    np.zeros((3, 2), "<f4").tofile(folder / "emb_vector")
    with pytest.raises(ModelFileError, match=r"t0/key: 1 duplicate keys: 5"):
        ModelFileRows(tmp_path / "t0", 2)
    assert list(shm_path.iterdir()) == []
