"""The RocksDB tier (``hps_core.tiers.rocks_store``) against a plain dict of the same rows,
on a real RocksDB database in a temporary folder."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np
import pytest

from hps_core.config import DatabaseType, PersistentDBConfig
from hps_core.errors import ModelFileError, RequestError
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.tiers.backing import table_tag
from hps_core.tiers.rocks_store import RocksStore


def config(path: Path, read_only: bool = False, batch: int = 7) -> PersistentDBConfig:
    return PersistentDBConfig(
        type=DatabaseType.ROCKS_DB, path=path, read_only=read_only, max_batch_size=batch,
        num_threads=2,
    )  # fmt: skip


def rows(rng: np.random.Generator, n: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    keys = rng.choice(np.arange(-(10**12), 10**12, 7919), n, replace=False).astype(np.int64)
    return keys, rng.standard_normal((n, dim)).astype(np.float32)


def reference(
    stored: dict[int, np.ndarray], queries: np.ndarray, dim: int, default: float
) -> tuple[np.ndarray, np.ndarray]:
    want = np.full((len(queries), dim), default, np.float32)
    found = np.zeros(len(queries), bool)
    for i, key in enumerate(queries.tolist()):
        if key in stored:
            want[i], found[i] = stored[key], True
    return want, found


@pytest.mark.parametrize(("n", "dim", "batch"), [(1, 1, 1), (50, 16, 7), (3000, 5, 1024)])
def test_lookups_equal_a_dict_of_the_rows(tmp_path: Path, n: int, dim: int, batch: int) -> None:
    rng = np.random.default_rng(n)
    keys, vectors = rows(rng, n, dim)
    stored = dict(zip(keys.tolist(), vectors, strict=True))
    table = table_tag("dlrm", "t0")
    with RocksStore(config(tmp_path / "db", batch=batch)) as store:
        half = n // 2
        store.insert(table, keys[:half], vectors[:half])
        store.insert(table, keys[half:], vectors[half:])
        # Known keys, repeated, shuffled, with unknown ones (including 0 and the extremes).
        unknown = np.array([0, -1, np.iinfo(np.int64).max, np.iinfo(np.int64).min], np.int64)
        queries = rng.permutation(np.concatenate([keys, keys[: n // 3], unknown]))
        got, found = store.lookup(table, queries, dim, default=-2.5)
        want, want_found = reference(stored, queries, dim, -2.5)
        np.testing.assert_array_equal(found, want_found)
        np.testing.assert_array_equal(got, want)
        assert store.tables() == [table]


def test_insert_replaces_rows_and_tables_are_apart(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    keys, vectors = rows(rng, 20, 4)
    with RocksStore(config(tmp_path / "db")) as store:
        store.insert("hps_et.m.a", keys, vectors)
        store.insert("hps_et.m.b", keys, -vectors)
        store.insert("hps_et.m.a", keys[:5], vectors[:5] + 1)
        got_a, _ = store.lookup("hps_et.m.a", keys, 4)
        got_b, found_b = store.lookup("hps_et.m.b", keys, 4)
    np.testing.assert_array_equal(got_a[:5], vectors[:5] + 1)
    np.testing.assert_array_equal(got_a[5:], vectors[5:])
    np.testing.assert_array_equal(got_b, -vectors)
    assert found_b.all()


def test_rows_persist_and_reopen_read_only(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    keys, vectors = rows(rng, 100, 8)
    path = tmp_path / "db"
    with RocksStore(config(path)) as store:
        store.insert("hps_et.m.t", keys, vectors)
    with RocksStore(config(path, read_only=True)) as store:
        got, found = store.lookup("hps_et.m.t", keys[::-1], 8)
        assert found.all()
        np.testing.assert_array_equal(got, vectors[::-1])
        with pytest.raises(RequestError, match="read_only"):
            store.insert("hps_et.m.t", keys[:1], vectors[:1])


def test_stored_bytes_are_hugectrs_encoding(tmp_path: Path) -> None:
    """Key: the int64's 8 little-endian bytes; value: dim little-endian float32."""
    from rocksdict import Options, Rdict

    path = tmp_path / "db"
    with RocksStore(config(path)) as store:
        store.insert("hps_et.m.t", np.array([258], np.int64), np.array([[1.5, -2.0]], np.float32))
    db = Rdict(
        str(path), Options(raw_mode=True), column_families={"hps_et.m.t": Options(raw_mode=True)}
    )
    try:
        family = db.get_column_family("hps_et.m.t")
        assert family.get(struct.pack("<q", 258)) == struct.pack("<2f", 1.5, -2.0)
    finally:
        db.close()


def test_load_sparse_copies_a_model_folder(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    keys, vectors = rows(rng, 1000, 16)
    write_sparse_table(tmp_path / "0_sparse_model", keys, vectors)
    with RocksStore(config(tmp_path / "db", batch=300)) as store:
        assert store.load_sparse("hps_et.m.t", tmp_path / "0_sparse_model", 16) == 1000
        got, found = store.lookup("hps_et.m.t", keys, 16)
    assert found.all()
    np.testing.assert_array_equal(got, vectors)


def test_bad_databases_and_tables_are_named(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="no RocksDB database there"):
        RocksStore(config(tmp_path / "missing", read_only=True))
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "CURRENT").write_text("MANIFEST-000099\n")  # names a manifest that is not there
    with pytest.raises(ModelFileError, match=re.escape(str(corrupt))):
        RocksStore(config(corrupt))
    with RocksStore(config(tmp_path / "db")) as store:
        store.insert("hps_et.m.t", np.array([1], np.int64), np.ones((1, 4), np.float32))
        with pytest.raises(
            RequestError, match=re.escape("no table 'hps_et.m.other'; it has: hps_et.m.t")
        ):
            store.lookup("hps_et.m.other", np.array([1], np.int64), 4)
        with pytest.raises(ModelFileError, match="key 1 holds 16 bytes, dim 8 needs 32"):
            store.lookup("hps_et.m.t", np.array([1], np.int64), 8)
        with pytest.raises(RequestError, match=r"need vectors \[n, dim\]"):
            store.insert("hps_et.m.t", np.array([1, 2], np.int64), np.ones((1, 4), np.float32))
