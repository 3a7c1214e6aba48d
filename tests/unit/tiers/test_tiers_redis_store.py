"""The Redis cluster tier (``hps_core.tiers.redis_store``) against a plain dict of the same
rows, on a real three-node Redis cluster on loopback (``tests/redis_cluster.py``)."""

from __future__ import annotations

import logging
import re
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from redis_cluster import SECRET, RedisCluster, redis_cluster
from tiers_testdata import EXTREME_KEYS, MASK64

from hps_core.config import DatabaseType, OverflowPolicy, VolatileDBConfig
from hps_core.errors import ConfigError, ModelFileError, RequestError, TierUnavailableError
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.hashing import partition_of
from hps_core.tiers.backing import table_tag
from hps_core.tiers.redis_store import CLIENT_NAME, RedisClusterStore, partition_key


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    """A cluster without a password, shared by the tests of this module."""
    yield from redis_cluster()


@pytest.fixture(scope="module")
def auth_cluster() -> Iterator[RedisCluster]:
    """A cluster with ``requirepass SECRET``; the node-failure test kills and restarts one."""
    yield from redis_cluster(password=SECRET)


def config(address: str, **fields: object) -> VolatileDBConfig:
    values: dict[str, object] = {"num_partitions": 5, "max_batch_size": 64}
    values.update(fields)
    return VolatileDBConfig(type=DatabaseType.REDIS_CLUSTER, address=address, **values)  # type: ignore[arg-type]


def rows(rng: np.random.Generator, n: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    # Distinct multiples of 7919 in [-1e12, 1e12), drawn without building the population.
    keys = rng.choice(2 * 10**12 // 7919, n, replace=False).astype(np.int64) * 7919 - 10**12
    keys[: min(n, 3)] = [EXTREME_KEYS[0], EXTREME_KEYS[-1], 0][: min(n, 3)]
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


def hugectr_partition(key: int, num_partitions: int) -> int:
    """HugeCTR's ``rrxmrrxmsx_0(key) % num_partitions`` on plain Python integers."""

    def rotr(x: int, n: int) -> int:
        return ((x >> n) | (x << (64 - n))) & MASK64

    x = key & MASK64
    x ^= rotr(x, 25) ^ rotr(x, 50)
    x = (x * 0xA24BAED4963EE407) & MASK64
    x ^= rotr(x, 24) ^ rotr(x, 49)
    x = (x * 0x9FB21C651E98DF25) & MASK64
    return (x ^ (x >> 28)) % num_partitions


def test_partitions_are_hugectrs(rng: np.random.Generator) -> None:
    keys = np.concatenate(
        [np.array(EXTREME_KEYS, np.int64), rng.integers(-(2**63), 2**63 - 1, 500)]
    )
    for parts in (1, 7, 16):
        want = [hugectr_partition(k, parts) for k in keys.tolist()]
        assert partition_of(keys, parts).tolist() == want
    assert partition_key("hps_et.dlrm.t0", 3) == "hps_et{hps_et.dlrm.t0/p3}v"
    assert partition_key("hps_et.dlrm.t0", 3, "t") == "hps_et{hps_et.dlrm.t0/p3}t"


@pytest.mark.parametrize(("n", "dim", "batch"), [(1, 1, 1), (3000, 16, 100), (1500, 128, 64)])
def test_lookups_equal_a_dict_of_the_rows(
    cluster: RedisCluster, rng: np.random.Generator, n: int, dim: int, batch: int
) -> None:
    keys, vectors = rows(rng, n, dim)
    stored = dict(zip(keys.tolist(), vectors, strict=True))
    table = table_tag("m", f"lookup{n}")
    with RedisClusterStore(config(cluster.address, max_batch_size=batch)) as store:
        half = n // 2
        store.insert(table, keys[:half], vectors[:half])
        store.insert(table, keys[half:], vectors[half:])
        # Known keys, repeated, shuffled, with unknown ones; batches above max_batch_size.
        unknown = np.array([-1, 1, 12345, EXTREME_KEYS[1]], np.int64)
        unknown = unknown[~np.isin(unknown, keys)]
        queries = rng.permutation(np.concatenate([keys, keys[: n // 3], unknown]))
        got, found = store.lookup(table, queries, dim, default=-2.5)
        want, want_found = reference(stored, queries, dim, -2.5)
        np.testing.assert_array_equal(found, want_found)
        np.testing.assert_array_equal(got, want)
        assert table in store.tables()
        assert store.count(table) == n
        got, found = store.lookup(table_tag("m", "absent"), keys, dim)
        assert not found.any() and not got.any()
        assert store.errors == 0
        assert store.evict(table) == n
        assert table not in store.tables()


def test_insert_missing_keeps_the_rows_already_stored(
    cluster: RedisCluster, rng: np.random.Generator
) -> None:
    """What cache_missed_embeddings writes up: rows under new keys only (HSETNX), so a row an
    update wrote meanwhile stays."""
    keys, vectors = rows(rng, 40, 4)
    table = table_tag("m", "missing_only")
    with RedisClusterStore(config(cluster.address, max_batch_size=16)) as store:
        store.insert(table, keys[:25], vectors[:25])
        store.insert_missing(table, keys, -vectors)  # 25 held, 15 new
        got, found = store.lookup(table, keys, 4)
        assert found.all()
        np.testing.assert_array_equal(got[:25], vectors[:25])
        np.testing.assert_array_equal(got[25:], -vectors[25:])
        assert store.count(table) == 40 and store.errors == 0
        store.evict(table)


def test_stored_bytes_are_hugectrs_layout(cluster: RedisCluster) -> None:
    """Field: the int64's 8 little-endian bytes; value: dim little-endian float32; the
    partition hash by HugeCTR's hash; evict_oldest keeps the insert time as 8-byte time_t."""
    table = "hps_et.m.layout"
    key = -258
    cfg = config(cluster.address, overflow_policy=OverflowPolicy.EVICT_OLDEST)
    with RedisClusterStore(cfg) as store:
        store._clock = lambda: 1_700_000_000.7
        store.insert(table, np.array([key], np.int64), np.array([[1.5, -2.0]], np.float32))
        part = hugectr_partition(key, 5)
        client = store._rc
        hv = f"hps_et{{{table}/p{part}}}v"
        assert client.hget(hv, struct.pack("<q", key)) == struct.pack("<2f", 1.5, -2.0)
        meta = client.hget(f"hps_et{{{table}/p{part}}}t", struct.pack("<q", key))
        assert meta == struct.pack("<q", 1_700_000_000)
        store.evict(table)


def test_load_sparse_copies_a_model_folder(
    cluster: RedisCluster, rng: np.random.Generator, tmp_path: Path
) -> None:
    keys, vectors = rows(rng, 2000, 16)
    write_sparse_table(tmp_path / "0_sparse_model", keys, vectors)
    with RedisClusterStore(config(cluster.address, max_batch_size=300)) as store:
        assert store.load_sparse("hps_et.m.sparse", tmp_path / "0_sparse_model", 16) == 2000
        got, found = store.lookup("hps_et.m.sparse", keys, 16)
        assert found.all()
        np.testing.assert_array_equal(got, vectors)
        with pytest.raises(ModelFileError, match=r"holds 64 bytes, dim 8 needs 32"):
            store.lookup("hps_et.m.sparse", keys[:3], 8)
        with pytest.raises(RequestError, match=r"need vectors \[n, dim\]"):
            store.insert("hps_et.m.sparse", keys[:2], vectors[:1])
        store.evict("hps_et.m.sparse")


def per_partition(rng: np.random.Generator, parts: int, sizes: list[int]) -> list[np.ndarray]:
    """Disjoint key sets, set ``i`` with exactly ``sizes[i]`` keys in every partition."""
    pool = rng.choice(10**12, 40 * parts * sum(sizes), replace=False).astype(np.int64)
    of = partition_of(pool, parts)
    sets: list[list[np.ndarray]] = [[] for _ in sizes]
    for p in range(parts):
        mine = pool[of == p]
        start = 0
        for i, size in enumerate(sizes):
            sets[i].append(mine[start : start + size])
            start += size
    return [np.concatenate(s) for s in sets]


def test_overflow_evict_random_keeps_partitions_bounded(
    cluster: RedisCluster, rng: np.random.Generator
) -> None:
    table = "hps_et.m.random"
    cfg = config(cluster.address, num_partitions=3, max_batch_size=16, overflow_margin=40)
    with RedisClusterStore(cfg) as store:
        keys, vectors = rows(rng, 600, 4)
        for start in range(0, 600, 100):
            store.insert(table, keys[start : start + 100], vectors[start : start + 100])
            assert max(store.partition_sizes(table)) <= 40
        # An overflowing partition goes down to exactly 32 (40 * 0.8); the survivors are
        # intact rows of several inserts.
        got, found = store.lookup(table, keys, 4)
        assert 3 * 32 <= found.sum() <= 3 * 40
        assert found[:300].any() and found[300:].any()
        np.testing.assert_array_equal(got[found], vectors[found])
        store.evict(table)


@pytest.mark.parametrize("touch", [False, True])
def test_overflow_evict_oldest_evicts_by_insert_or_hit_time(
    cluster: RedisCluster, rng: np.random.Generator, touch: bool
) -> None:
    table = f"hps_et.m.oldest{int(touch)}"
    cfg = config(
        cluster.address,
        num_partitions=2,
        max_batch_size=1000,
        overflow_margin=50,
        overflow_policy=OverflowPolicy.EVICT_OLDEST,
        overflow_resolution_target=0.5,
    )
    a, b, c = per_partition(rng, 2, [20, 20, 15])  # 55 > 50 per partition once c is in
    with RedisClusterStore(cfg) as store:
        for stamp, keys in ((100, a), (200, b)):
            store._clock = lambda stamp=stamp: float(stamp)
            store.insert(table, keys, np.ones((len(keys), 2), np.float32))
        if touch:  # a hit renews a's time: b becomes the oldest
            store._clock = lambda: 250.0
            assert store.lookup(table, a, 2)[1].all()
            store.synchronize()
        store._clock = lambda: 300.0
        store.insert(table, c, np.ones((len(c), 2), np.float32))
        assert store.partition_sizes(table) == [25, 25]  # round(50 * 0.5)
        oldest, newer = (b, a) if touch else (a, b)
        assert not store.lookup(table, oldest, 2)[1].any()
        assert store.lookup(table, c, 2)[1].all()
        assert store.lookup(table, newer, 2)[1].sum() == 2 * 10
        store.evict(table)


def test_overflow_evict_least_used_keeps_the_hits(
    cluster: RedisCluster, rng: np.random.Generator
) -> None:
    table = "hps_et.m.lfu"
    cfg = config(
        cluster.address,
        num_partitions=2,
        max_batch_size=1000,
        overflow_margin=50,
        overflow_policy=OverflowPolicy.EVICT_LEAST_USED,
        overflow_resolution_target=0.5,
    )
    a, b, c = per_partition(rng, 2, [20, 20, 15])
    with RedisClusterStore(cfg) as store:
        store.insert(table, a, np.ones((len(a), 2), np.float32))
        store.insert(table, b, np.ones((len(b), 2), np.float32))
        for _ in range(3):
            store.lookup(table, a, 2)
        store.synchronize()
        store.insert(table, c, np.ones((len(c), 2), np.float32))
        assert store.partition_sizes(table) == [25, 25]
        assert store.lookup(table, a, 2)[1].all()  # used 4 times, the others once
        store.evict(table)


def test_auth_works_and_wrong_passwords_fail_clearly(
    auth_cluster: RedisCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    messages = []
    with RedisClusterStore(config(auth_cluster.address, password=SECRET)) as store:
        store.insert("hps_et.m.auth", np.array([7], np.int64), np.ones((1, 3), np.float32))
        assert store.lookup("hps_et.m.auth", np.array([7], np.int64), 3)[1].all()
        messages.append(repr(store))
        store.evict("hps_et.m.auth")
    for password in ("not-" + SECRET, ""):
        with pytest.raises(ConfigError, match=r"volatile_db\.password: .* refused user 'default'"):
            RedisClusterStore(config(auth_cluster.address, password=password))
    with pytest.raises(ConfigError) as info:
        RedisClusterStore(config(auth_cluster.address, password=SECRET + "x"))
    messages.append(str(info.value))
    dead = "127.0.0.1:1"
    with pytest.raises(TierUnavailableError, match=re.escape(f"'{dead}': cannot open")) as down:
        RedisClusterStore(config(dead, password=SECRET))
    messages.append(str(down.value))
    assert SECRET not in "\n".join(messages) + caplog.text


def test_a_killed_node_costs_its_keys_only_and_comes_back(
    auth_cluster: RedisCluster, rng: np.random.Generator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    table = "hps_et.m.failover"
    keys, vectors = rows(rng, 3000, 8)
    cfg = config(auth_cluster.address, password=SECRET, num_partitions=12, max_batch_size=100)
    with RedisClusterStore(cfg, connect_timeout=0.5, socket_timeout=0.5, retry_after=0.2) as store:
        store.insert(table, keys, vectors)
        node_of = np.array(
            [
                store._rc.get_node_from_key(partition_key(table, p)).port
                for p in partition_of(keys, 12).tolist()
            ]
        )
        victim = auth_cluster.ports[1]
        lost = node_of == victim
        assert 0 < lost.sum() < len(keys)
        auth_cluster.kill(victim)
        try:
            started = time.monotonic()
            got, found = store.lookup(table, keys, 8)
            assert time.monotonic() - started < 2.0
            np.testing.assert_array_equal(found, ~lost)
            np.testing.assert_array_equal(got[~lost], vectors[~lost])
            assert not got[lost].any()
            assert store.errors >= 1
            with pytest.raises(TierUnavailableError, match="no node answered"):
                store.lookup(table, keys[lost][:50], 8)
            errors = store.errors
        finally:
            auth_cluster.restart(victim)
        # The node came back empty (no persistence); within a few retries it answers again.
        deadline = time.monotonic() + 15
        while True:
            before = store.errors
            got, found = store.lookup(table, keys, 8)
            if store.errors == before or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert store.errors == before > errors - 1
        np.testing.assert_array_equal(found, ~lost)
        store.insert(table, keys[lost], vectors[lost])
        got, found = store.lookup(table, keys, 8)
        assert found.all()
        np.testing.assert_array_equal(got, vectors)
        store.evict(table)
        messages = repr(store)
    assert SECRET not in messages + caplog.text + auth_cluster.logs()


def our_connections(cluster: RedisCluster) -> dict[int, int]:
    """Connections named by this tier, per node port (``CLIENT LIST``)."""
    return {
        port: sum(
            f" name={CLIENT_NAME} " in line
            for line in cluster.cli(port, "CLIENT", "LIST").splitlines()
        )
        for port in cluster.ports
    }


@pytest.mark.parametrize("connections", [1, 2])
def test_num_node_connections_bounds_the_connections_per_node(
    cluster: RedisCluster, rng: np.random.Generator, connections: int
) -> None:
    """Eight threads looking up at once share ``num_node_connections`` per node: they wait
    for a free connection, every answer is right, no error is counted. (A thread waits for a
    connection as long as for an answer, ``socket_timeout``: long here, since on a loaded
    machine eight threads queued on one connection per node waited past the default 2 s.)"""
    table = table_tag("m", f"pool{connections}")
    keys, vectors = rows(rng, 4000, 16)
    cfg = config(cluster.address, num_partitions=8, num_node_connections=connections)
    peak = dict.fromkeys(cluster.ports, 0)
    wrong: list[int] = []
    with RedisClusterStore(cfg, socket_timeout=30.0) as store:
        store.insert(table, keys, vectors)

        def lookups() -> None:
            for _ in range(15):
                got, found = store.lookup(table, keys, 16)
                if not found.all() or not np.array_equal(got, vectors):
                    wrong.append(1)

        threads = [threading.Thread(target=lookups) for _ in range(8)]
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            for port, n in our_connections(cluster).items():
                peak[port] = max(peak[port], n)
            time.sleep(0.02)
        for thread in threads:
            thread.join()
        assert not wrong and store.errors == 0
        store.evict(table)
    assert 1 <= max(peak.values()) <= connections, peak
    assert our_connections(cluster) == dict.fromkeys(cluster.ports, 0)  # closed with the store


def test_num_node_connections_below_one_is_refused(cluster: RedisCluster) -> None:
    with pytest.raises(ConfigError, match="num_node_connections"):
        RedisClusterStore(config(cluster.address, num_node_connections=0))
