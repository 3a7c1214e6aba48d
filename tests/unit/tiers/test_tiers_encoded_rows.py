"""Stored rows of compressed tables in Redis and RocksDB (``hps_core.tiers.encoded_rows``), on
a real RocksDB database and a real three-node Redis cluster, against the reference quantiser:
every word comes back as written (NaN bit patterns included), vectors decode as the host tier
decodes them, and the databases hold ``row_bytes`` per key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from quant_reference import reference_decoded, reference_stored
from redis_cluster import RedisCluster, redis_cluster

from hps_core.config import DatabaseType, PersistentDBConfig, VolatileDBConfig
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.quant import RowFormat, StoragePrecision
from hps_core.tiers.backing import table_tag
from hps_core.tiers.encoded_rows import EncodedRows, encoded_tag
from hps_core.tiers.redis_store import RedisClusterStore
from hps_core.tiers.rocks_store import RocksStore

PRECISIONS = [StoragePrecision.FP16, StoragePrecision.INT8, StoragePrecision.FP8]


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    yield from redis_cluster()


@pytest.fixture(params=["rocks_db", "redis_cluster"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[object]:
    if request.param == "rocks_db":
        config = PersistentDBConfig(
            type=DatabaseType.ROCKS_DB, path=tmp_path / "db", num_threads=1, max_batch_size=7
        )
        with RocksStore(config) as rocks:
            yield rocks
        return
    cluster = request.getfixturevalue("cluster")
    config = VolatileDBConfig(
        type=DatabaseType.REDIS_CLUSTER, address=cluster.address, num_partitions=3,
        max_batch_size=7,
    )  # fmt: skip
    with RedisClusterStore(config) as redis:
        yield redis


def keys_of(rng: np.random.Generator, n: int) -> np.ndarray:
    keys = rng.choice(2**62, n, replace=False).astype(np.int64) - 2**61
    keys[:2] = [np.iinfo(np.int64).min, np.iinfo(np.int64).max]
    return keys


@pytest.mark.parametrize("precision", PRECISIONS, ids=lambda p: p.value)
def test_stored_words_come_back_as_written(
    store: object, precision: StoragePrecision, rng: np.random.Generator
) -> None:
    """Random words stand for any stored row: many are NaN patterns as float32, which the
    databases must keep bit for bit (they see the words as float32 vectors)."""
    dim = 13
    fmt = RowFormat(precision, dim)
    rows = EncodedRows(store, precision)
    table = encoded_tag(table_tag("m", f"words_{precision.value}"), precision)
    keys = keys_of(rng, 200)
    words = rng.integers(0, 2**32, (200, fmt.row_words), dtype=np.uint64).astype(np.uint32)
    words[0, :4] = [0x7F800001, 0xFFC00000, 0x7FBFFFFF, 0xFF800001]  # signalling and quiet
    assert np.isnan(words.view(np.float32)).sum() >= 4
    rows.insert_stored(table, keys, words, dim)
    asked = np.concatenate([keys[::-1], [5, 6]])
    got, found = rows.lookup_stored(table, asked, dim)
    assert got.dtype == np.uint32 and found.tolist() == [True] * 200 + [False] * 2
    np.testing.assert_array_equal(got[:200], words[::-1])
    assert (got[200:] == 0).all()


@pytest.mark.parametrize("precision", PRECISIONS, ids=lambda p: p.value)
def test_vectors_are_encoded_once_and_decoded_as_the_host_tier_decodes(
    store: object, precision: StoragePrecision, rng: np.random.Generator, tmp_path: Path
) -> None:
    dim = 16
    fmt = RowFormat(precision, dim)
    rows = EncodedRows(store, precision)
    table = encoded_tag(table_tag("m", f"vectors_{precision.value}"), precision)
    keys = keys_of(rng, 150)
    vectors = (rng.standard_normal((150, dim)) * 4).astype(np.float32)
    rows.insert(table, keys[:100], vectors[:100])
    # A sparse model folder, encoded chunk by chunk on its way in.
    write_sparse_table(tmp_path / "t", keys[100:], vectors[100:])
    assert rows.load_sparse(table, tmp_path / "t", dim) == 50
    asked = np.concatenate([keys, [7]])
    values, found = rows.lookup(table, asked, dim, default=-2.0)
    assert found.tolist() == [True] * 150 + [False]
    np.testing.assert_array_equal(values[:150], reference_decoded(fmt, vectors))
    assert (values[150] == -2.0).all()
    stored, _ = rows.lookup_stored(table, keys, dim)
    np.testing.assert_array_equal(stored, reference_stored(fmt, vectors))
    # The database holds the stored rows' bytes: row_bytes per key, not 4 * dim.
    raw, _ = store.lookup(table, keys[:1], fmt.row_words)
    assert raw.nbytes == fmt.row_bytes < 4 * dim
    assert rows.kind == store.kind and rows.errors == 0
    assert table in rows.tables()


def test_an_fp32_table_is_not_wrapped() -> None:
    with pytest.raises(ValueError, match="fp32 table is stored as FP32 vectors"):
        EncodedRows(object(), StoragePrecision.FP32)  # type: ignore[arg-type]
