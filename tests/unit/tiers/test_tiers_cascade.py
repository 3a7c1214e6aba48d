"""The lookup cascade (``hps_core.tiers.cascade``) and how the factory fills and opens it:
shared host tier -> Redis cluster -> RocksDB -> default vector, against a dict of the file rows,
on real RocksDB databases (and a real three-node Redis cluster where ``redis-server`` is)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from quant_reference import reference_decoded, reference_stored
from tiers_testdata import make_keys, mixed_queries, one_model_ps, random_vectors

from hps_core.config import PSConfig, parse_ps_config
from hps_core.errors import ModelFileError, TierUnavailableError
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.hashing import partition_of
from hps_core.quant import RowFormat
from hps_core.tiers.backing import table_tag
from hps_core.tiers.cascade import LowerTier, TierCounters, TieredTable
from hps_core.tiers.factory import (
    LOAD_LOCK,
    MARKER_PREFIX,
    check_tiers_available,
    has_lower_tiers,
    open_table_tiers,
    read_marker,
)
from hps_core.tiers.host_table import SharedHostTable, held_rows
from hps_core.tiers.redis_store import partition_key

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: the cluster helper
from redis_cluster import SECRET, RedisCluster, redis_cluster

DEFAULT = 0.5
TAG = table_tag("m", "t0")


def config(root: Path, dim: int, precision: str | None = None, **sections: Any) -> PSConfig:
    ps = one_model_ps(dim, DEFAULT, **sections)
    if precision is not None:
        ps["models"][0]["storage_precision"] = precision
    return parse_ps_config(ps, root)


def rocks(root: Path, **fields: Any) -> dict[str, Any]:
    return {"type": "rocks_db", "path": str(root / "db"), "num_threads": 2, **fields}


def write_table(root: Path, rng: np.random.Generator, rows: int, dim: int) -> dict[int, int]:
    """Write table ``t0`` of random wide keys; returns key -> file row."""
    keys = make_keys(rng, rows, "wide")
    vectors = random_vectors(rng, rows, dim)
    write_sparse_table(root / "t0", keys, vectors, overwrite=True)
    return {k: i for i, k in enumerate(keys.tolist())}


def reference(
    root: Path, rows_of: dict[int, int], queries: np.ndarray, dim: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Expected vectors, found mask and file row (-1 if absent) of each query."""
    vectors = np.fromfile(root / "t0" / "emb_vector", dtype="<f4").reshape(-1, dim)
    row = np.array([rows_of.get(q, -1) for q in queries.tolist()], dtype=np.int64)
    want = np.full((len(queries), dim), DEFAULT, np.float32)
    want[row >= 0] = vectors[row[row >= 0]]
    return want, row >= 0, row


def database_files(path: Path) -> list[tuple[str, int]]:
    """RocksDB's files and their mtimes (rocksdict rewrites its own config at every open)."""
    return sorted(
        (p.name, p.stat().st_mtime_ns) for p in path.iterdir() if not p.name.startswith("rocksdict")
    )


def tier_sum(c: TierCounters) -> int:
    return c.host_hits + c.redis_cluster_hits + c.rocks_db_hits + c.default_keys


class DictStore:
    """A dict-backed :class:`~hps_core.tiers.backing.BackingStore` that records what it is
    asked and can be told to fail."""

    def __init__(self, kind: str, rows: dict[int, np.ndarray] | None = None) -> None:
        self.kind = kind
        self.errors = 0
        self.rows: dict[int, np.ndarray] = dict(rows or {})
        self.asked: list[np.ndarray] = []
        self.inserted: list[np.ndarray] = []
        self.fail: str | None = None  # None, "all" (raise) or "half" (lose every odd key)

    def tables(self) -> list[str]:
        return [TAG]

    def insert(self, table: str, keys: np.ndarray, vectors: np.ndarray) -> None:
        self.inserted.append(keys.copy())
        self.rows.update(zip(keys.tolist(), vectors.copy(), strict=True))

    def insert_missing(self, table: str, keys: np.ndarray, vectors: np.ndarray) -> None:
        """What a Redis tier's HSETNX does: rows only under the keys it does not hold."""
        new = np.array([k not in self.rows for k in keys.tolist()], bool)
        self.insert(table, keys[new], vectors[new])

    def load_sparse(self, table: str, folder: Any, dim: int) -> int:
        raise NotImplementedError

    def lookup(
        self, table: str, keys: np.ndarray, dim: int, default: float = 0.0
    ) -> tuple[np.ndarray, np.ndarray]:
        self.asked.append(keys.copy())
        if self.fail == "all":
            self.errors += 1
            raise TierUnavailableError(f"{self.kind}: no node answered")
        out = np.full((len(keys), dim), default, np.float32)
        found = np.zeros(len(keys), bool)
        for i, key in enumerate(keys.tolist()):
            if self.fail == "half" and key % 2:
                continue
            if key in self.rows:
                out[i], found[i] = self.rows[key], True
        if self.fail == "half":
            self.errors += 1
        return out, found

    def close(self) -> None:
        pass


# --- the factory: which ps.json opens what -------------------------------------------------


def test_no_lower_tier_opens_the_shared_table_itself(tmp_path: Path, shm_path: Path) -> None:
    rng = np.random.default_rng(1)
    write_table(tmp_path, rng, 20, 4)
    cfg = config(tmp_path, 4, volatile_db={"type": "hash_map"})
    assert not has_lower_tiers(cfg)
    table = open_table_tiers(cfg, "m", cfg.models[0].tables[0])
    assert type(table) is SharedHostTable and not table.has_lower_tiers  # today's object
    table.close()
    assert list(shm_path.iterdir()) == []


@pytest.mark.parametrize(
    "sections",
    [
        {"volatile_db": {"type": "redis_cluster"}},
        {"persistent_db": {"type": "rocks_db"}},
        {"volatile_db": {"type": "redis_cluster"}, "persistent_db": {"type": "rocks_db"}},
    ],
    ids=["redis", "rocksdb", "both"],
)
def test_lower_tiers_and_update_sources_are_available(tmp_path: Path, sections: dict) -> None:
    check_tiers_available(config(tmp_path, 4, **sections))
    assert has_lower_tiers(config(tmp_path, 4, **sections))
    kafka = config(tmp_path, 4, **sections, update_source={"type": "kafka_message_queue"})
    check_tiers_available(kafka)
    assert has_lower_tiers(kafka)


def test_a_rocksdb_path_that_is_a_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "db").write_text("not a database")
    with pytest.raises(ModelFileError, match=r"persistent_db.path: '.*db' is a file; RocksDB"):
        check_tiers_available(config(tmp_path, 4, persistent_db=rocks(tmp_path)))


# --- shared tier + RocksDB against the reference ---------------------------------------------


@pytest.mark.parametrize("rate", [0.0, 0.3, 1.0])
@pytest.mark.parametrize(("rows", "dim"), [(1, 1), (257, 16), (3000, 128)])
def test_partial_host_tier_and_rocksdb_equal_the_file_rows(
    tmp_path: Path, shm_path: Path, rng: np.random.Generator, rows: int, dim: int, rate: float
) -> None:
    rows_of = write_table(tmp_path, rng, rows, dim)
    cfg = config(
        tmp_path,
        dim,
        volatile_db={"type": "hash_map", "initial_cache_rate": rate},
        persistent_db=rocks(tmp_path, max_batch_size=97),
    )
    table = open_table_tiers(cfg, "m", cfg.models[0].tables[0])
    assert isinstance(table, TieredTable) and table.has_lower_tiers
    held = held_rows(rows, rate)
    assert (table.rows, table.table_rows, table.shared.rows) == (held, rows, held)
    queries = mixed_queries(rng, np.fromiter(rows_of, np.int64), 4 * rows + 40)
    out = np.empty((len(queries), dim), np.float32)
    values, found = table.lookup(queries, out=out)
    want, want_found, row = reference(tmp_path, rows_of, queries, dim)
    assert values is out
    np.testing.assert_array_equal(found, want_found)
    np.testing.assert_array_equal(values, want)
    c = table.tier_counters()
    # The first `held` rows of the file are in shared memory, the others only in RocksDB.
    assert c.host_hits == int(np.count_nonzero((row >= 0) & (row < held)))
    assert c.rocks_db_hits == int(np.count_nonzero(row >= held))
    assert c.default_keys == int(np.count_nonzero(row < 0))
    assert tier_sum(c) == len(queries) and c.rocks_db_errors == 0
    # lookup_lower (the GPU pipeline's call) skips the shared tier; RocksDB holds every row.
    lower, lower_found = table.lookup_lower(queries)
    np.testing.assert_array_equal(lower_found, want_found)
    np.testing.assert_array_equal(lower, want)
    after = table.tier_counters()
    assert after.host_hits == c.host_hits
    assert after.rocks_db_hits == c.rocks_db_hits + int(np.count_nonzero(want_found))
    table.close()
    assert list(shm_path.iterdir()) == []
    assert not (tmp_path / "db" / LOAD_LOCK).exists()


def test_only_missed_keys_go_below_once_each_and_the_highest_tier_answers(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    dim = 3
    rows_of = write_table(tmp_path, rng, 100, dim)
    keys = np.fromiter(rows_of, np.int64)
    shared = SharedHostTable(tmp_path / "t0", dim, DEFAULT, fraction=0.5)
    upper = DictStore("redis_cluster", {int(k): np.full(dim, 1.0, np.float32) for k in keys[40:]})
    lower = DictStore("rocks_db", {int(k): np.full(dim, 2.0, np.float32) for k in keys})
    table = TieredTable(shared, [LowerTier(upper, TAG), LowerTier(lower, TAG)])
    queries = np.concatenate([keys, keys[::-1], [7, 7, 7]]).astype(np.int64)
    if 7 in rows_of:
        pytest.skip("7 happens to be a key")
    values, found = table.lookup(queries)
    # shared: rows 0-49; Redis: 50-99 (it also holds 40-49, never asked); RocksDB: nothing.
    assert len(upper.asked) == 1
    assert sorted(upper.asked[0].tolist()) == sorted({*keys[50:].tolist(), 7})
    assert lower.asked[0].tolist() == [7]  # deduplicated, only what Redis missed
    np.testing.assert_array_equal(values[:50], shared.lookup(keys[:50])[0])
    assert (values[50:100] == 1.0).all() and (values[-3:] == DEFAULT).all()
    assert found.tolist() == [True] * 200 + [False] * 3
    c = table.tier_counters()
    assert (c.host_hits, c.redis_cluster_hits, c.rocks_db_hits, c.default_keys) == (100, 100, 0, 3)
    table.close()


@pytest.mark.parametrize("precision", ["fp16", "int8", "fp8"])
def test_a_compressed_table_answers_lower_tier_rows_quantised(
    tmp_path: Path, rng: np.random.Generator, precision: str
) -> None:
    """Redis and RocksDB hold FP32 rows; a table stored compressed answers them as its own
    tiers store them (quantised once, by the reference quantiser's rule), whether asked
    through lookup, lookup_lower or their stored forms, so that a key's answer never depends
    on the tier that held it."""
    dim = 8
    fmt = RowFormat(precision, dim)
    keys = make_keys(rng, 100, "wide")
    from_files = random_vectors(rng, 100, dim)
    write_sparse_table(tmp_path / "t0", keys, from_files, overwrite=True)
    shared = SharedHostTable(tmp_path / "t0", dim, DEFAULT, fraction=0.5, precision=precision)
    below = {int(k): (rng.standard_normal(dim) * 3).astype(np.float32) for k in keys}
    table = TieredTable(shared, [LowerTier(DictStore("rocks_db", below), TAG)])
    queries = np.concatenate([keys, [10**13]]).astype(np.int64)
    in_shared = shared.find(keys) >= 0
    want = np.full((len(queries), dim), DEFAULT, np.float32)
    want[:-1][in_shared] = reference_decoded(fmt, from_files[in_shared])
    rocks = np.stack([below[int(k)] for k in keys[~in_shared]])
    want[:-1][~in_shared] = reference_decoded(fmt, rocks)
    values, found = table.lookup(queries)
    np.testing.assert_array_equal(values, want)
    assert found.tolist() == [True] * 100 + [False]
    stored, found = table.lookup_stored(queries)
    np.testing.assert_array_equal(stored[:-1][~in_shared], reference_stored(fmt, rocks))
    np.testing.assert_array_equal(fmt.decode_stored(stored[:-1]), want[:-1])
    lower, _ = table.lookup_lower(keys[~in_shared])
    np.testing.assert_array_equal(lower, reference_decoded(fmt, rocks))
    lower_stored, _ = table.lookup_lower_stored(keys[~in_shared])
    np.testing.assert_array_equal(lower_stored, reference_stored(fmt, rocks))
    table.close()


def test_lower_tiers_may_answer_with_a_store_or_an_overlay_holding_rows(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    """What lets the GPU pipeline skip its host round trip: an empty update overlay alone
    holds nothing; a store (RocksDB, Redis) or an overlay with rows may answer."""
    from hps_core.tiers.overlay import OverlayStore

    dim = 3
    write_table(tmp_path, rng, 20, dim)
    shared = SharedHostTable(tmp_path / "t0", dim, DEFAULT)
    overlay = OverlayStore()
    table = TieredTable(shared, [LowerTier(overlay, TAG)])
    assert table.has_lower_tiers and not table.lower_may_answer()
    overlay.insert(TAG, np.array([10**12], np.int64), np.ones((1, dim), np.float32))
    assert table.lower_may_answer()
    overlay.remove(TAG, np.array([10**12], np.int64))
    assert not table.lower_may_answer()
    with_store = TieredTable(
        shared, [LowerTier(overlay, TAG), LowerTier(DictStore("rocks_db"), TAG)]
    )
    assert with_store.lower_may_answer()
    table.close()
    with_store.close()


def test_cache_missed_embeddings_writes_rocksdb_rows_to_redis(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    dim = 2
    rows_of = write_table(tmp_path, rng, 30, dim)
    keys = np.fromiter(rows_of, np.int64)
    redis = DictStore("redis_cluster", {})
    rocks_store = DictStore("rocks_db", {int(k): np.full(dim, k % 5, np.float32) for k in keys})
    shared = SharedHostTable(tmp_path / "t0", dim, DEFAULT, fraction=0.0)
    table = TieredTable(
        shared, [LowerTier(redis, TAG), LowerTier(rocks_store, TAG)], cache_missed_embeddings=True
    )
    unknown = np.array([k for k in range(3) if k not in rows_of][:1], np.int64)
    table.lookup(np.concatenate([keys[:10], unknown]))
    table.flush()
    # Only rows found below are elevated: never the default vector of an unknown key.
    assert sorted(redis.rows) == sorted(keys[:10].tolist())
    values, _ = table.lookup(keys[:10])
    c = table.tier_counters()
    assert (c.rocks_db_hits, c.redis_cluster_hits, c.elevated_keys) == (10, 10, 10)
    np.testing.assert_array_equal(
        values, np.stack([rocks_store.rows[k] for k in keys[:10].tolist()])
    )
    table.close()


def test_a_row_written_up_never_replaces_one_an_update_wrote_meanwhile(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    """cache_missed_embeddings copies RocksDB's rows up to Redis in the background; an update
    of the same key may reach Redis between the read below and that copy, and must win."""
    dim = 2
    rows_of = write_table(tmp_path, rng, 8, dim)
    keys = np.fromiter(rows_of, np.int64)
    redis = DictStore("redis_cluster", {})
    old = {int(k): np.full(dim, 1.0, np.float32) for k in keys}
    updated = np.full(dim, 7.0, np.float32)

    class UpdatedWhileRead(DictStore):
        def lookup(self, table, keys, dim, default=0.0):
            found = super().lookup(table, keys, dim, default)
            redis.insert(TAG, keys, np.tile(updated, (len(keys), 1)))  # the update lands
            return found

    rocks_store = UpdatedWhileRead("rocks_db", old)
    shared = SharedHostTable(tmp_path / "t0", dim, DEFAULT, fraction=0.0)
    table = TieredTable(
        shared, [LowerTier(redis, TAG), LowerTier(rocks_store, TAG)], cache_missed_embeddings=True
    )
    table.lookup(keys)
    table.flush()
    assert sorted(redis.rows) == sorted(keys.tolist())
    for key in keys.tolist():
        np.testing.assert_array_equal(redis.rows[key], updated)
    table.close()


@pytest.mark.parametrize("failure", ["all", "half"])
def test_a_failing_tier_above_a_complete_one_is_counted_and_every_answer_right(
    tmp_path: Path, rng: np.random.Generator, failure: str, caplog: pytest.LogCaptureFixture
) -> None:
    dim = 4
    rows_of = write_table(tmp_path, rng, 64, dim)
    keys = np.fromiter(rows_of, np.int64)
    vectors = np.fromfile(tmp_path / "t0" / "emb_vector", "<f4").reshape(-1, dim)
    redis = DictStore("redis_cluster", dict(zip(keys.tolist(), vectors, strict=True)))
    redis.fail = failure
    shared = SharedHostTable(tmp_path / "t0", dim, DEFAULT, fraction=0.25)
    # RocksDB holds every row: what Redis loses it answers, and what it lacks is unknown.
    rocks_store = DictStore("rocks_db", dict(zip(keys.tolist(), vectors, strict=True)))
    table = TieredTable(shared, [LowerTier(redis, TAG), LowerTier(rocks_store, TAG, complete=True)])
    unknown = np.array([7, 11], np.int64)  # odd: a "half" failure loses them too
    with caplog.at_level(logging.ERROR, logger="hps_core"):
        values, found = table.lookup(np.concatenate([keys, unknown]))
    np.testing.assert_array_equal(found, np.r_[np.ones(64, bool), False, False])
    np.testing.assert_array_equal(values[:64], vectors)
    assert (values[64:] == DEFAULT).all()
    c = table.tier_counters()
    assert c.redis_cluster_errors == 1 and c.rocks_db_errors == 0 and c.unanswered_keys == 0
    assert tier_sum(c) == 66 and c.default_keys == 2
    assert ("redis_cluster lookup failed" in caplog.text) == (failure == "all")
    table.close()


@pytest.mark.parametrize("failure", ["all", "half"])
def test_keys_a_failed_tier_may_hold_that_nothing_below_vouches_for_fail_the_lookup(
    tmp_path: Path, rng: np.random.Generator, failure: str
) -> None:
    """Below the failed tier only a store that does not hold every row (complete=False, as
    RocksDB with online updates): the keys it lacks may be rows the lost node held, so the
    lookup fails naming the tier instead of answering their default vector."""
    dim = 4
    rows_of = write_table(tmp_path, rng, 64, dim)
    keys = np.fromiter(rows_of, np.int64)
    vectors = np.fromfile(tmp_path / "t0" / "emb_vector", "<f4").reshape(-1, dim)
    redis = DictStore("redis_cluster", dict(zip(keys.tolist(), vectors, strict=True)))
    shared = SharedHostTable(tmp_path / "t0", dim, DEFAULT, fraction=0.25)
    even = dict(zip(keys[::2].tolist(), vectors[::2], strict=True))
    table = TieredTable(
        shared, [LowerTier(redis, TAG), LowerTier(DictStore("rocks_db", even), TAG)]
    )
    redis.fail = failure
    # Keys the shared tier and RocksDB hold are still answered, right.
    held = np.r_[keys[:16], keys[16::2]]
    values, found = table.lookup(held)
    assert found.all()
    np.testing.assert_array_equal(values, np.r_[vectors[:16], vectors[16::2]])
    # A key only Redis holds, whose part did not answer: the lookup fails.
    lost = next(k for k in keys[17::2].tolist() if failure == "all" or k % 2)
    with pytest.raises(
        TierUnavailableError, match=r"redis_cluster .*: 1 keys it may hold cannot be"
    ):
        table.lookup(np.array([lost, keys[0]], np.int64))
    assert table.tier_counters().unanswered_keys == 1
    redis.fail = None  # back: answered again
    values, found = table.lookup(np.array([lost], np.int64))
    assert found.all() and (values[0] == vectors[rows_of[lost]]).all()
    table.close()


# --- RocksDB databases: read_only, missing, corrupt, reloaded ---------------------------------


def test_read_only_database_is_served_and_must_hold_the_table(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    dim = 8
    rows_of = write_table(tmp_path, rng, 200, dim)
    volatile = {"type": "hash_map", "initial_cache_rate": 0.3}
    table_cfg = config(tmp_path, dim).models[0].tables[0]
    missing = config(
        tmp_path, dim, volatile_db=volatile, persistent_db=rocks(tmp_path, read_only=True)
    )
    with pytest.raises(ModelFileError, match=f"persistent_db.path '{tmp_path / 'db'}': no RocksDB"):
        open_table_tiers(missing, "m", table_cfg)
    # Filled by a writable open, then served read-only: same answers, nothing written.
    open_table_tiers(config(tmp_path, dim, persistent_db=rocks(tmp_path)), "m", table_cfg).close()
    before = database_files(tmp_path / "db")
    table = open_table_tiers(missing, "m", table_cfg)
    queries = mixed_queries(rng, np.fromiter(rows_of, np.int64), 300)
    values, found = table.lookup(queries)
    want, want_found, _ = reference(tmp_path, rows_of, queries, dim)
    np.testing.assert_array_equal(values, want)
    np.testing.assert_array_equal(found, want_found)
    table.close()
    assert database_files(tmp_path / "db") == before
    # A read-only database without the table: the error names the path and the table.
    other = config(
        tmp_path, dim, volatile_db=volatile, persistent_db=rocks(tmp_path, read_only=True)
    )
    with pytest.raises(ModelFileError) as info:
        open_table_tiers(other, "other", table_cfg)
    assert f"'{tmp_path / 'db'}'" in str(info.value)
    assert "no table 'hps_et.other.t0' (read_only" in str(info.value)
    assert TAG in str(info.value)  # what it has
    # The database holds the FP32 table; store_compressed asks for the fp16 one: say so.
    compressed = config(
        tmp_path, dim, "fp16", volatile_db=volatile,
        persistent_db=rocks(tmp_path, read_only=True, store_compressed=True),
    )  # fmt: skip
    with pytest.raises(ModelFileError) as info:
        open_table_tiers(compressed, "m", compressed.models[0].tables[0])
    assert f"no table '{TAG}@fp16' (read_only" in str(info.value)
    assert f"it holds '{TAG}' in HugeCTR's FP32 layout, which store_compressed=false reads" in (
        str(info.value)
    )


def test_corrupt_database_directory_is_a_clear_load_error(
    tmp_path: Path, rng: np.random.Generator, shm_path: Path
) -> None:
    write_table(tmp_path, rng, 10, 4)
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "CURRENT").write_text("MANIFEST-000042\n")  # a manifest that is not there
    cfg = config(tmp_path, 4, persistent_db=rocks(tmp_path))
    with pytest.raises(ModelFileError, match=f"^persistent_db.path '{tmp_path / 'db'}': "):
        open_table_tiers(cfg, "m", cfg.models[0].tables[0])
    assert list(shm_path.iterdir()) == []  # nothing left attached


def test_a_restart_skips_the_load_and_rewritten_files_are_reloaded(
    tmp_path: Path, rng: np.random.Generator, caplog: pytest.LogCaptureFixture
) -> None:
    dim = 4
    rows_of = write_table(tmp_path, rng, 50, dim)
    cfg = config(
        tmp_path,
        dim,
        volatile_db={"type": "hash_map", "initial_cache_rate": 0.2},
        persistent_db=rocks(tmp_path),
    )
    table_cfg = cfg.models[0].tables[0]
    with caplog.at_level(logging.INFO, logger="hps_core"):
        open_table_tiers(cfg, "m", table_cfg).close()
        assert caplog.text.count("persistent tier: loaded") == 1
        open_table_tiers(cfg, "m", table_cfg).close()  # a restart: the marker matches
        assert caplog.text.count("persistent tier: loaded") == 1
        old_keys = np.fromiter(rows_of, np.int64)
        time.sleep(0.01)  # a new mtime even on coarse clocks
        rows_of = write_table(tmp_path, np.random.default_rng(99), 40, dim)
        table = open_table_tiers(cfg, "m", table_cfg)
        assert caplog.text.count("persistent tier: loaded") == 2
    values, found = table.lookup(old_keys)
    stale = np.isin(old_keys, np.fromiter(rows_of, np.int64))
    assert not found[~stale].any()  # rows of the old files did not outlive them
    assert (values[~stale] == DEFAULT).all()
    table.close()


# --- two processes open the same model --------------------------------------------------------

WORKER = """
import json, logging, sys
import numpy as np
from hps_core.config import parse_ps_config
from hps_core.tiers.factory import open_table_tiers

records = []
handler = logging.Handler()
handler.emit = lambda r: records.append(r.getMessage())
logging.getLogger("hps_core").addHandler(handler)
logging.getLogger("hps_core").setLevel(logging.INFO)
root, go = sys.argv[1], float(sys.argv[2])
cfg = parse_ps_config(json.load(open(root + "/ps.json")), root)
import time
time.sleep(max(0.0, go - time.time()))  # start together
table = open_table_tiers(cfg, "m", cfg.models[0].tables[0])
keys = np.load(root + "/queries.npy")
values, found = table.lookup(keys)
np.save(root + f"/answer-{sys.argv[3]}.npy", values)
print(json.dumps({"loaded": sum("persistent tier: loaded" in m for m in records),
                  "built": bool(table.shared.built_here), "found": int(found.sum())}))
table.close()
"""


def test_two_processes_load_the_database_and_segment_once(
    tmp_path: Path, rng: np.random.Generator, shm_path: Path
) -> None:
    dim = 16
    rows_of = write_table(tmp_path, rng, 20_000, dim)
    ps = one_model_ps(
        dim,
        DEFAULT,
        volatile_db={"type": "hash_map", "initial_cache_rate": 0.3},
        persistent_db=rocks(tmp_path),
    )
    (tmp_path / "ps.json").write_text(json.dumps(ps))
    queries = mixed_queries(rng, np.fromiter(rows_of, np.int64), 5000)
    np.save(tmp_path / "queries.npy", queries)
    go = time.time() + 1.5
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(tmp_path), str(go), str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    want, want_found, _ = reference(tmp_path, rows_of, queries, dim)
    for i in range(2):
        np.testing.assert_array_equal(np.load(tmp_path / f"answer-{i}.npy"), want)
    assert sorted(r["loaded"] for r in reports) == [0, 1]  # RocksDB filled once
    assert {r["found"] for r in reports} == {int(want_found.sum())}
    assert list(shm_path.iterdir()) == []
    assert not (tmp_path / "db" / LOAD_LOCK).exists()


# --- store_compressed: the databases hold the table's stored rows -----------------------------


def file_rows(root: Path, rows_of: dict[int, int], keys: np.ndarray, dim: int) -> np.ndarray:
    vectors = np.fromfile(root / "t0" / "emb_vector", dtype="<f4").reshape(-1, dim)
    return vectors[[rows_of[k] for k in keys.tolist()]]


@pytest.mark.parametrize("precision", ["fp16", "int8", "fp8", "fp32"])
def test_rocksdb_with_store_compressed_holds_the_tables_stored_rows(
    tmp_path: Path, shm_path: Path, rng: np.random.Generator, precision: str
) -> None:
    """A compressed table's rows are written to RocksDB as the host tier stores them, once,
    under the tag with its precision (an fp32 table stays as HugeCTR stores it); every key
    answers what it answers without store_compressed, from any tier, in any form."""
    dim, rows = 24, 500
    rows_of = write_table(tmp_path, rng, rows, dim)
    keys = np.fromiter(rows_of, np.int64)
    fmt = RowFormat(precision, dim)
    cfg = config(
        tmp_path, dim, precision,
        volatile_db={"type": "hash_map", "initial_cache_rate": 0.3},
        persistent_db=rocks(tmp_path, max_batch_size=64, store_compressed=True),
    )  # fmt: skip
    table = open_table_tiers(cfg, "m", cfg.models[0].tables[0])
    name = TAG if precision == "fp32" else f"{TAG}@{precision}"
    assert table.lower[0].table == name
    queries = mixed_queries(rng, keys, 3 * rows)
    known = np.array([q in rows_of for q in queries.tolist()])
    want = np.full((len(queries), dim), DEFAULT, np.float32)
    want[known] = reference_decoded(fmt, file_rows(tmp_path, rows_of, queries[known], dim))
    values, found = table.lookup(queries)
    np.testing.assert_array_equal(found, known)
    np.testing.assert_array_equal(values, want)
    below = keys[held_rows(rows, 0.3) :]  # the rows only RocksDB holds
    stored, _ = table.lookup_lower_stored(below)
    np.testing.assert_array_equal(
        stored, reference_stored(fmt, file_rows(tmp_path, rows_of, below, dim))
    )
    c = table.tier_counters()
    assert c.rocks_db_hits == int(np.count_nonzero(known)) - c.host_hits + len(below)
    table.close()
    written = database_files(tmp_path / "db")
    # A restart finds the table loaded; the database holds row_bytes per key.
    again = open_table_tiers(cfg, "m", cfg.models[0].tables[0])
    np.testing.assert_array_equal(again.lookup(queries)[0], want)
    again.close()
    assert database_files(tmp_path / "db") == written
    from rocksdict import AccessType, Options, Rdict

    db = Rdict(str(tmp_path / "db"), Options(raw_mode=True), access_type=AccessType.read_only(),
               column_families={n: Options(raw_mode=True) for n in Rdict.list_cf(
                   str(tmp_path / "db"), Options(raw_mode=True))})  # fmt: skip
    value = db.get_column_family(name).get(int(keys[-1]).to_bytes(8, "little", signed=True))
    db.close()
    assert len(value) == fmt.row_bytes
    assert list(shm_path.iterdir()) == []


# --- a real Redis cluster between the shared tier and RocksDB ---------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    """A password-protected three-node cluster shared by the Redis tests of this module."""
    yield from redis_cluster(password=SECRET)


def redis_section(cluster: RedisCluster, **fields: Any) -> dict[str, Any]:
    return {
        "type": "redis_cluster", "address": cluster.address, "password": SECRET,
        "num_partitions": 3, "max_batch_size": 50, **fields,
    }  # fmt: skip


@pytest.mark.parametrize(("rows", "dim"), [(120, 4), (2000, 32)])
def test_redis_holds_the_initial_cache_rate_and_rocksdb_the_rest(
    tmp_path: Path, rng: np.random.Generator, cluster: RedisCluster, shm_path: Path,
    rows: int, dim: int,
) -> None:  # fmt: skip
    rows_of = write_table(tmp_path, rng, rows, dim)
    model = f"m{rows}"
    cfg = config(
        tmp_path, dim, volatile_db=redis_section(cluster, initial_cache_rate=0.3),
        persistent_db=rocks(tmp_path),
    )  # fmt: skip
    table = open_table_tiers(cfg, model, cfg.models[0].tables[0])
    assert table.shared.rows == 0 and table.table_rows == rows  # Redis is the volatile level
    redis = table.lower[0].store
    assert redis.kind == "redis_cluster" and read_marker(redis, table_tag(model, "t0"))
    held = held_rows(rows, 0.3)
    assert redis.count(table_tag(model, "t0")) == held
    queries = mixed_queries(rng, np.fromiter(rows_of, np.int64), 3 * rows)
    values, found = table.lookup(queries)
    want, want_found, row = reference(tmp_path, rows_of, queries, dim)
    np.testing.assert_array_equal(values, want)
    np.testing.assert_array_equal(found, want_found)
    c = table.tier_counters()
    assert c.host_hits == 0
    assert c.redis_cluster_hits == int(np.count_nonzero((row >= 0) & (row < held)))
    assert c.rocks_db_hits == int(np.count_nonzero(row >= held))
    assert c.default_keys == int(np.count_nonzero(row < 0))
    table.close()
    # A second open (another instance, a restart) finds Redis filled: nothing rewritten.
    again = open_table_tiers(cfg, model, cfg.models[0].tables[0])
    assert again.lower[0].store.count(table_tag(model, "t0")) == held
    again.close()
    assert list(shm_path.iterdir()) == []


def test_redis_cache_missed_embeddings_and_a_lost_node(
    tmp_path: Path, rng: np.random.Generator, cluster: RedisCluster
) -> None:
    dim = 8
    rows_of = write_table(tmp_path, rng, 300, dim)
    keys = np.fromiter(rows_of, np.int64)
    cfg = config(
        tmp_path, dim,
        volatile_db=redis_section(cluster, initial_cache_rate=0.0, cache_missed_embeddings=True),
        persistent_db=rocks(tmp_path),
    )  # fmt: skip
    table = open_table_tiers(cfg, "missed", cfg.models[0].tables[0])
    table.lookup(keys[:100])
    table.flush()
    c = table.tier_counters()
    assert (c.rocks_db_hits, c.elevated_keys) == (100, 100)
    table.lookup(keys[:100])
    assert table.tier_counters().redis_cluster_hits == 100  # now answered by Redis
    # A node dies: its keys fall through to RocksDB, counted; every answer stays right.
    port = sorted(cluster.processes)[0]
    cluster.kill(port)
    try:
        values, found = table.lookup(keys)
        want, _, _ = reference(tmp_path, rows_of, keys, dim)
        np.testing.assert_array_equal(values, want)
        assert found.all()
        assert table.tier_counters().redis_cluster_errors >= 1
    finally:
        table.close()
        cluster.restart(port)
        cluster.wait_ok()


def test_a_redis_table_that_lost_rows_is_filled_again_at_the_next_open(
    tmp_path: Path, rng: np.random.Generator, cluster: RedisCluster
) -> None:
    """A node restarted empty loses its partitions of the table but not the marker, which
    another node may hold: the next open sees the rows missing and fills them again."""
    write_table(tmp_path, rng, 300, 4)
    cfg = config(tmp_path, 4, volatile_db=redis_section(cluster, initial_cache_rate=1.0))
    tag = table_tag("refill", "t0")
    table = open_table_tiers(cfg, "refill", cfg.models[0].tables[0])
    redis = table.lower[0].store
    assert redis.count(tag) == 300
    redis._rc.delete(partition_key(tag, 0))  # that node's part of the table, gone
    assert redis.count(tag) < 300 and read_marker(redis, tag)
    table.close()
    again = open_table_tiers(cfg, "refill", cfg.models[0].tables[0])
    assert again.lower[0].store.count(tag) == 300
    again.close()


def test_the_redis_node_holding_the_marker_down_at_open_costs_a_warning_not_the_model(
    tmp_path: Path, rng: np.random.Generator, cluster: RedisCluster,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    dim = 4
    rows_of = write_table(tmp_path, rng, 200, dim)
    keys = np.fromiter(rows_of, np.int64)
    cfg = config(
        tmp_path, dim, volatile_db=redis_section(cluster, initial_cache_rate=0.5),
        persistent_db=rocks(tmp_path),
    )  # fmt: skip
    tag = table_tag("marked", "t0")
    first = open_table_tiers(cfg, "marked", cfg.models[0].tables[0])
    redis = first.lower[0].store
    part = int(partition_of(np.zeros(1, np.int64), redis.num_partitions)[0])
    port = redis._rc.get_node_from_key(partition_key(MARKER_PREFIX + tag, part)).port
    first.close()
    cluster.kill(port)
    try:
        with caplog.at_level(logging.WARNING, logger="hps_core"):
            table = open_table_tiers(cfg, "marked", cfg.models[0].tables[0])
        assert any("is not cached whole in the Redis cluster" in r.getMessage()
                   for r in caplog.records), caplog.text  # fmt: skip
        values, found = table.lookup(keys)
        want, _, _ = reference(tmp_path, rows_of, keys, dim)
        np.testing.assert_array_equal(values, want)
        assert found.all()
        table.close()
    finally:
        cluster.restart(port)
        cluster.wait_ok()


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_store_compressed_redis_takes_rocksdb_rows_as_they_are_stored(
    tmp_path: Path, rng: np.random.Generator, cluster: RedisCluster, precision: str
) -> None:
    """Both databases hold the table's stored rows; rows found in RocksDB are written up to
    Redis byte for byte (never encoded again from decoded values), and Redis then answers
    the same stored rows."""
    dim = 12
    rows_of = write_table(tmp_path, rng, 400, dim)
    keys = np.fromiter(rows_of, np.int64)
    fmt = RowFormat(precision, dim)
    model = f"packed_{precision}"
    cfg = config(
        tmp_path, dim, precision,
        volatile_db=redis_section(
            cluster, initial_cache_rate=0.25, cache_missed_embeddings=True, store_compressed=True
        ),
        persistent_db=rocks(tmp_path, store_compressed=True),
    )  # fmt: skip
    table = open_table_tiers(cfg, model, cfg.models[0].tables[0])
    name = f"{table_tag(model, 't0')}@{precision}"
    assert [t.table for t in table.lower] == [name, name]
    redis = table.lower[0].store.store
    assert redis.count(name) == held_rows(400, 0.25)
    want = reference_stored(fmt, file_rows(tmp_path, rows_of, keys, dim))
    first, found = table.lookup_stored(keys)
    assert found.all()
    np.testing.assert_array_equal(first, want)
    table.flush()
    c = table.tier_counters()
    assert c.elevated_keys == c.rocks_db_hits == 400 - held_rows(400, 0.25)
    assert redis.count(name) == 400
    again, _ = table.lookup_stored(keys)
    np.testing.assert_array_equal(again, want)
    assert table.tier_counters().redis_cluster_hits == c.redis_cluster_hits + 400
    raw, _ = redis.lookup(name, keys[-1:], fmt.row_words)
    assert raw.nbytes == fmt.row_bytes
    values, _ = table.lookup(keys)
    np.testing.assert_array_equal(values, fmt.decode_stored(want))
    table.close()


# --- a Redis cluster without RocksDB: the model files answer what a lost node held -----------


def node_of(redis: Any, tag: str, key: int) -> int:
    """The port of the node holding ``key`` of table ``tag``."""
    part = int(partition_of(np.array([key], np.int64), redis.num_partitions)[0])
    return redis._rc.get_node_from_key(partition_key(tag, part)).port


def test_a_lost_redis_node_is_answered_from_the_model_files_and_refilled_when_back(
    tmp_path: Path, rng: np.random.Generator, cluster: RedisCluster, shm_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """No RocksDB: while a node is down its keys are answered from the sparse files (never the
    default vector), unknown keys still get the default; the node comes back empty and the
    rows it lost are answered from the files, written back, and the cluster refilled whole
    without a reload."""
    dim, rows = 8, 600
    rows_of = write_table(tmp_path, rng, rows, dim)
    keys = np.fromiter(rows_of, np.int64)
    cfg = config(tmp_path, dim, volatile_db=redis_section(cluster))
    model = "lost"
    tag = table_tag(model, "t0")
    table = open_table_tiers(cfg, model, cfg.models[0].tables[0])
    assert [t.store.kind for t in table.lower] == ["redis_cluster", "model_files"]
    redis = table.lower[0].store
    assert redis.count(tag) == rows
    queries = mixed_queries(rng, keys, 4 * rows)
    want, want_found, _ = reference(tmp_path, rows_of, queries, dim)
    port = node_of(redis, tag, int(keys[0]))
    on_node = np.array([node_of(redis, tag, k) == port for k in keys.tolist()])
    cluster.kill(port)
    try:
        for _ in range(2):  # the first finds the node down, the second skips it
            values, found = table.lookup(queries)
            np.testing.assert_array_equal(values, want)
            np.testing.assert_array_equal(found, want_found)
        c = table.tier_counters()
        assert c.model_files_hits >= 2 * int(on_node.sum()) // 2 > 0
        assert c.unanswered_keys == 0 and c.redis_cluster_errors >= 1
    finally:
        cluster.restart(port)
        cluster.wait_ok()
    time.sleep(1.1)  # the store's retry_after: the node is tried again
    with caplog.at_level(logging.WARNING, logger="hps_core"):
        values, found = table.lookup(queries)
        table.flush()
    np.testing.assert_array_equal(values, want)
    np.testing.assert_array_equal(found, want_found)
    assert "the Redis cluster lacks" in caplog.text, caplog.text
    assert "refilled 1 partitions" in caplog.text or "refilled" in caplog.text
    assert redis.count(tag) == rows  # refilled whole, not only the keys asked
    before = table.tier_counters()
    values, _ = table.lookup(keys)
    np.testing.assert_array_equal(values, np.fromfile(tmp_path / "t0" / "emb_vector", "<f4")
                                  .reshape(-1, dim))  # fmt: skip
    after = table.tier_counters()
    assert after.model_files_hits == before.model_files_hits  # the cluster answers again
    assert after.refilled_keys > 0
    table.close()
    assert list(shm_path.iterdir()) == []


def test_with_online_updates_a_lost_nodes_unknown_keys_fail_the_lookup(
    tmp_path: Path, rng: np.random.Generator, cluster: RedisCluster
) -> None:
    """With an update source the cluster may hold keys the files lack (updates wrote them):
    a key of a node that does not answer that the files and the overlay lack cannot be said
    unknown, and the lookup fails naming the node; keys the files hold are still answered."""
    dim, rows = 4, 300
    rows_of = write_table(tmp_path, rng, rows, dim)
    keys = np.fromiter(rows_of, np.int64)
    updates = {"type": "kafka_message_queue", "brokers": "127.0.0.1:1"}
    cfg = config(tmp_path, dim, volatile_db=redis_section(cluster), update_source=updates)
    model = "updated"
    tag = table_tag(model, "t0")
    table = open_table_tiers(cfg, model, cfg.models[0].tables[0])
    kinds = [t.store.kind for t in table.lower]
    assert kinds == ["overlay", "redis_cluster", "model_files"]
    assert not any(t.complete for t in table.lower)
    redis = table.lower[1].store
    port = node_of(redis, tag, int(keys[0]))
    unknown = next(k for k in range(10**15, 10**15 + 1000) if node_of(redis, tag, k) == port)
    elsewhere = next(k for k in range(10**15, 10**15 + 1000) if node_of(redis, tag, k) != port)
    cluster.kill(port)
    try:
        values, found = table.lookup(np.r_[keys, elsewhere].astype(np.int64))
        want, _, _ = reference(tmp_path, rows_of, keys, dim)
        np.testing.assert_array_equal(values[:rows], want)
        assert found[:rows].all() and not found[rows] and (values[rows] == DEFAULT).all()
        with pytest.raises(
            TierUnavailableError, match=rf"redis_cluster node 127.0.0.1:{port} down: 1 keys"
        ):
            table.lookup(np.array([keys[0], unknown], np.int64))
    finally:
        cluster.restart(port)
        cluster.wait_ok()
        table.close()
