"""The apply callback of online updates (``hps_core.updates.apply``) against a dict reference:
rows the shared host tier holds are overwritten in place (seen by another mapping of the
segment), new keys land in the overlay and are served, repeated keys keep their last row, a
message failing half way leaves nothing applied, and cached rows (dynamic and static NumPy
caches) are overwritten. Then the whole path over a tansu broker: Kafka -> updater -> lookups,
and the replay of a restarted instance."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest
from quant_reference import reference_decoded, reference_stored
from updates_testlib import make_consumer, rows

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cache"))
from cache_twin import NumpyDynamicCache

from hps_core.cache import make_cache, num_sets_for
from hps_core.config import PSConfig, parse_ps_config
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.lookup import CachedTableLookup, ModelLookup
from hps_core.quant import RowFormat
from hps_core.tiers.backing import table_tag
from hps_core.tiers.cascade import TieredTable
from hps_core.tiers.host_table import SharedHostTable
from hps_core.updates import UpdateProducer
from hps_core.updates.apply import ModelUpdater, ModelUpdates, UpdateApplyError

pytestmark = pytest.mark.timeout(120)

ROWS, DIM, DEFAULT = 2000, 8, -0.5


def updated_config(
    root: Path, brokers: str = "127.0.0.1:9", model: str = "m", storage: str = "fp32"
) -> PSConfig:
    """A one-table ps.json (whole shared tier) with a Kafka update source."""
    keys, vectors = rows(ROWS, DIM, seed=3)
    write_sparse_table(root / "t0", keys, vectors)
    ps = {
        "supportlonglong": True,
        "update_source": {
            "type": "kafka_message_queue",
            "brokers": brokers,
            "poll_timeout_ms": 100,
            "failure_backoff_ms": 20,
        },
        "models": [
            {
                "model": model,
                "sparse_files": ["t0"],
                "embedding_table_names": ["t0"],
                "deployed_device_list": [0],
                "default_value_for_each_table": [DEFAULT],
                "maxnum_catfeature_query_per_table_per_sample": [4],
                "embedding_vecsize_per_table": [DIM],
                "storage_precision": storage,
            }
        ],
    }
    return parse_ps_config(ps, root)


def file_rows() -> dict[int, np.ndarray]:
    keys, vectors = rows(ROWS, DIM, seed=3)
    return dict(zip(keys.tolist(), vectors, strict=True))


def expected(reference: dict[int, np.ndarray], keys: np.ndarray) -> np.ndarray:
    return np.stack([reference.get(k, np.full(DIM, DEFAULT, np.float32)) for k in keys.tolist()])


def served(lookup: CachedTableLookup, keys: np.ndarray) -> np.ndarray:
    """What a GPU lookup through ``lookup``'s cache answers (the cache bank's order): a key's
    cached row where the cache holds it, else the host tier's (the tiers below included)."""
    rows, hit = lookup.cache.query(keys)
    rows = np.array(rows, dtype=np.float32)
    if not hit.all():
        rows[~hit] = lookup.host.lookup(keys[~hit])[0]
    return rows


@pytest.fixture
def model_lookup(tmp_path: Path):
    cfg = updated_config(tmp_path)
    s = ModelLookup(cfg, cfg.models[0])
    yield s
    s.close()


TAG = table_tag("m", "t0")


def test_tables_open_as_a_cascade_over_a_writable_shared_tier(model_lookup: ModelLookup) -> None:
    host = model_lookup.table(0).host
    assert isinstance(host, TieredTable) and host.has_lower_tiers
    assert host.shared.writable and host.shared.rows == ROWS
    assert [tier.store.kind for tier in host.lower] == ["overlay"]
    index = host.index_arrays()
    assert not any(part.flags.writeable for part in index)


def test_existing_new_and_repeated_keys_match_a_dict(model_lookup: ModelLookup) -> None:
    reference = file_rows()
    known = np.array(list(reference), np.int64)
    updater = ModelUpdater(model_lookup, settle_s=0)
    rng = np.random.default_rng(11)
    for _ in range(25):
        n = int(rng.integers(1, 400))
        # Existing keys, new keys, and repeats within the message.
        keys = np.concatenate([rng.choice(known, n), rng.integers(1, 5000, n // 2) * 2 + 1]).astype(
            np.int64
        )
        keys = keys[rng.permutation(len(keys))]
        vectors = rng.standard_normal((len(keys), DIM)).astype(np.float32)
        updater.apply(TAG, keys, vectors)
        reference.update(zip(keys.tolist(), vectors, strict=True))  # last row of a key wins
        probe = np.concatenate([keys[:50], rng.choice(known, 50), [2, 4, 6]]).astype(np.int64)
        np.testing.assert_array_equal(model_lookup.lookup(0, probe), expected(reference, probe))
    everything = np.array(list(reference), np.int64)
    np.testing.assert_array_equal(
        model_lookup.lookup(0, everything), expected(reference, everything)
    )
    stats = updater.stats
    assert stats.messages == 25 and stats.failed == 0
    assert stats.host_rows > 0 and stats.overlay_rows > 0
    counters = model_lookup.counters()[0]
    assert counters.tier_overlay_hits > 0 and counters.tier_host_hits > 0


def test_in_place_writes_reach_every_mapping_of_the_segment(model_lookup: ModelLookup) -> None:
    reference = file_rows()
    key = np.array([next(iter(reference))], np.int64)
    other = SharedHostTable(model_lookup.model.tables[0].sparse_file, DIM)  # read-only, like a peer
    try:
        assert not other.writable
        ModelUpdater(model_lookup, settle_s=0).apply(TAG, key, np.full((1, DIM), 3.5, np.float32))
        assert other.lookup(key)[0].tolist() == [[3.5] * DIM]
        with pytest.raises(PermissionError):
            other.write_rows(np.array([0]), np.zeros((1, DIM), np.float32))
    finally:
        other.close()


def test_a_message_failing_half_way_leaves_nothing_applied(
    model_lookup: ModelLookup, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = file_rows()
    known = np.array(list(reference)[:10], np.int64)
    updater = ModelUpdater(model_lookup, settle_s=0)
    # A first message puts keys 1, 3 in the overlay.
    updater.apply(TAG, np.array([1, 3]), np.ones((2, DIM), np.float32))
    reference.update({1: np.ones(DIM, np.float32), 3: np.ones(DIM, np.float32)})
    overlay = model_lookup.table(0).host.lower_store("overlay").store
    probe = np.concatenate([known, [1, 3, 5, 7]]).astype(np.int64)
    before = model_lookup.lookup(0, probe)
    np.testing.assert_array_equal(before, expected(reference, probe))

    real_insert = overlay.insert

    def insert_then_fail(table, keys, vectors):
        real_insert(table, keys, vectors)  # the rows are written, then the tier fails
        raise OSError("overlay failed after writing (test)")

    monkeypatch.setattr(overlay, "insert", insert_then_fail)
    keys = np.concatenate([known, [3, 5, 7]]).astype(np.int64)  # shared, overlay and new keys
    with pytest.raises(UpdateApplyError, match="undone"):
        updater.apply(TAG, keys, np.full((len(keys), DIM), 9.0, np.float32))
    monkeypatch.setattr(overlay, "insert", real_insert)
    np.testing.assert_array_equal(model_lookup.lookup(0, probe), before)
    assert overlay.rows(TAG) == 2
    assert updater.stats.failed == 1 and updater.stats.messages == 1
    # The retry of the same message then applies it whole.
    updater.apply(TAG, keys, np.full((len(keys), DIM), 9.0, np.float32))
    reference.update({k: np.full(DIM, 9.0, np.float32) for k in keys.tolist()})
    np.testing.assert_array_equal(model_lookup.lookup(0, probe), expected(reference, probe))


def test_cached_rows_are_overwritten_and_uncached_keys_not_inserted(
    model_lookup: ModelLookup, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = file_rows()
    known = np.array(list(reference), np.int64)
    host = model_lookup.table(0).host
    cache = NumpyDynamicCache(num_sets_for(512), DIM, name="t0")  # the CUDA cache's twin
    lookup = CachedTableLookup(host, cache, np, name="t0")
    monkeypatch.setattr(model_lookup, "_tables", [lookup])
    lookup.warm(known[:100])
    updater = ModelUpdater(model_lookup, settle_s=0.05)
    keys = np.concatenate([known[:10], known[500:510], [1, 3]]).astype(np.int64)
    vectors = np.arange(len(keys) * DIM, dtype=np.float32).reshape(len(keys), DIM)
    updater.apply(TAG, keys, vectors)
    reference.update(zip(keys.tolist(), vectors, strict=True))
    cached, hit = cache.query(keys)
    assert hit.tolist() == [True] * 10 + [False] * 12  # updated in place, nothing inserted
    np.testing.assert_array_equal(cached[:10], vectors[:10])
    np.testing.assert_array_equal(served(lookup, keys), expected(reference, keys))
    # A stale insert after the update (a batch that read the old rows) is settled.
    stale = np.array([known[0]], np.int64)
    cache.update(stale, np.zeros((1, DIM), np.float32))
    time.sleep(0.3)
    np.testing.assert_array_equal(cache.query(stale)[0], vectors[:1])
    updater.close()

    # A failing cache update undoes the tiers and puts the cached rows back.
    def broken(*args):
        raise RuntimeError("cache failed (test)")

    monkeypatch.setattr(model_lookup, "update_cached_rows", broken)
    with pytest.raises(UpdateApplyError):
        ModelUpdater(model_lookup, settle_s=0).apply(TAG, keys, vectors + 100)
    np.testing.assert_array_equal(served(lookup, keys), expected(reference, keys))


def test_static_cache_rows_are_updated_and_new_keys_served(
    model_lookup: ModelLookup, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = file_rows()
    host = model_lookup.table(0).host
    keys_all, values_all = host.contents()
    cache = make_cache("static", len(keys_all), DIM, np, contents=(keys_all, values_all.copy()))
    lookup = CachedTableLookup(host, cache, np, name="t0")
    monkeypatch.setattr(model_lookup, "_tables", [lookup])
    keys = np.array([keys_all[0], keys_all[7], 11, 13], np.int64)
    vectors = np.full((4, DIM), 4.25, np.float32)
    ModelUpdater(model_lookup, settle_s=0).apply(TAG, keys, vectors)
    reference.update(zip(keys.tolist(), vectors, strict=True))
    assert cache.query(keys)[1].tolist() == [True, True, False, False]
    probe = np.concatenate([keys, [15]]).astype(np.int64)
    np.testing.assert_array_equal(served(lookup, probe), expected(reference, probe))


def test_a_table_opened_without_updates_is_refused(tmp_path: Path) -> None:
    cfg = updated_config(tmp_path)
    import dataclasses

    from hps_core.config.enums import UpdateSourceType

    plain = dataclasses.replace(
        cfg, update_source=dataclasses.replace(cfg.update_source, type=UpdateSourceType.NULL)
    )
    model_lookup = ModelLookup(plain, plain.models[0])
    try:
        with pytest.raises(UpdateApplyError, match="kafka_message_queue"):
            ModelUpdater(model_lookup)
        assert ModelUpdates.start(model_lookup, "g") is None
    finally:
        model_lookup.close()


def _wait(done, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < end, "updates did not arrive in time"
        time.sleep(0.05)


def test_kafka_updates_reach_the_lookups_and_replay_after_a_restart(
    broker: str, model: str, tmp_path: Path
) -> None:
    from kafka_broker import FAST_GROUP_OPTIONS

    cfg = updated_config(tmp_path, broker, model)
    reference = file_rows()
    known = np.array(list(reference), np.int64)
    tag = table_tag(model, "t0")
    first = ModelUpdates.start(
        model_lookup := ModelLookup(cfg, cfg.models[0]),
        f"{model}.instance",
        kafka_options=FAST_GROUP_OPTIONS,
        settle_s=0,
    )
    assert first is not None
    a_keys = np.concatenate([known[:300], np.arange(1, 200, 2)]).astype(np.int64)
    a_vectors = np.random.default_rng(1).standard_normal((len(a_keys), DIM)).astype(np.float32)
    with UpdateProducer(broker, linger_ms=5) as producer:
        producer.publish(model, "t0", a_keys, a_vectors)
    reference.update(zip(a_keys.tolist(), a_vectors, strict=True))
    try:
        _wait(lambda: first.stats.keys_applied >= len(a_keys))
        np.testing.assert_array_equal(model_lookup.lookup(0, a_keys), expected(reference, a_keys))
    finally:
        first.stop()
        model_lookup.close()
    assert first.stats.errors == 0 and first.stats.commits >= 1

    # Published while the instance is down; the restarted instance has an empty overlay
    # (and here a rebuilt shared tier): it replays everything retained, its group unchanged.
    b_keys = np.concatenate([known[200:400], np.arange(101, 400, 2)]).astype(np.int64)
    b_vectors = np.random.default_rng(2).standard_normal((len(b_keys), DIM)).astype(np.float32)
    with UpdateProducer(broker, linger_ms=5) as producer:
        producer.publish(model, "t0", b_keys, b_vectors)
    reference.update(zip(b_keys.tolist(), b_vectors, strict=True))
    model_lookup = ModelLookup(cfg, cfg.models[0])
    second = ModelUpdates.start(
        model_lookup, f"{model}.instance", kafka_options=FAST_GROUP_OPTIONS, settle_s=0
    )
    try:
        _wait(lambda: second.stats.keys_applied >= len(a_keys) + len(b_keys))
        everything = np.array([*reference, 2, 4], np.int64)
        np.testing.assert_array_equal(
            model_lookup.lookup(0, everything), expected(reference, everything)
        )
        assert second.updater.stats.messages >= 2
        assert tag in second.updater.tags
    finally:
        second.stop()
        model_lookup.close()


def test_without_replay_a_restart_resumes_from_the_committed_offsets(
    broker: str, model: str, tmp_path: Path
) -> None:
    from kafka_broker import FAST_GROUP_OPTIONS

    cfg = updated_config(tmp_path, broker, model)
    group = f"{model}.resume"
    seen: list[int] = []
    consumer = make_consumer(
        broker, [(model, "t0")], lambda t, k, v: seen.extend(k.tolist()), group_id=group
    )
    keys = np.arange(1, 101, 2, dtype=np.int64)
    with UpdateProducer(broker, linger_ms=5) as producer:
        producer.publish(model, "t0", keys, np.ones((len(keys), DIM), np.float32))
    consumer.start()
    _wait(lambda: len(seen) >= len(keys))
    consumer.stop()
    model_lookup = ModelLookup(cfg, cfg.models[0])
    updates = ModelUpdates.start(
        model_lookup, group, replay=False, kafka_options=FAST_GROUP_OPTIONS, settle_s=0
    )
    try:
        more = np.arange(1001, 1011, 2, dtype=np.int64)
        with UpdateProducer(broker, linger_ms=5) as producer:
            producer.publish(model, "t0", more, np.full((len(more), DIM), 2.0, np.float32))
        _wait(lambda: updates.stats.keys_applied >= len(more))
        time.sleep(0.5)
        assert updates.stats.keys_applied == len(more)  # nothing before the commit again
        assert model_lookup.lookup(0, more).tolist() == [[2.0] * DIM] * len(more)
    finally:
        updates.stop()
        model_lookup.close()


@pytest.mark.parametrize("storage", ["fp16", "int8", "fp8"])
def test_a_compressed_table_answers_its_updates_quantised_and_undoes_them_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, storage: str
) -> None:
    """Updates of a table stored compressed are quantised once, by the reference quantiser's
    rule, in the shared tier (existing keys) and the overlay (new keys), which stores them
    compressed; a failed message is undone byte for byte."""
    cfg = updated_config(tmp_path, storage=storage)
    model_lookup = ModelLookup(cfg, cfg.models[0])
    fmt = RowFormat(storage, DIM)
    try:
        reference = file_rows()
        known = np.array(list(reference), np.int64)
        updater = ModelUpdater(model_lookup, settle_s=0)
        rng = np.random.default_rng(12)
        for _ in range(5):
            keys = np.concatenate([rng.choice(known, 50), rng.integers(1, 5000, 25) * 2 + 1])
            keys = np.unique(keys.astype(np.int64))  # one row per key: no repeat to resolve
            vectors = (rng.standard_normal((len(keys), DIM)) * 4).astype(np.float32)
            updater.apply(TAG, keys, vectors)
            reference.update(zip(keys.tolist(), vectors, strict=True))
        everything = np.array(list(reference), np.int64)
        want = reference_decoded(fmt, np.stack([reference[k] for k in everything.tolist()]))
        np.testing.assert_array_equal(model_lookup.lookup(0, everything), want)
        host = model_lookup.table(0).host
        overlay = host.lower_store("overlay").store
        new = everything[host.shared.find(everything) < 0]
        stored, found = overlay.lookup_stored(TAG, new, DIM)
        assert found.all() and stored.dtype == fmt.stored_dtype
        np.testing.assert_array_equal(
            stored, reference_stored(fmt, np.stack([reference[k] for k in new.tolist()]))
        )
        np.testing.assert_array_equal(
            host.lookup_stored(everything)[0],
            reference_stored(fmt, np.stack([reference[k] for k in everything.tolist()])),
        )
        # A message failing after the overlay wrote its rows is undone byte for byte.
        before = host.lookup_stored(everything)[0]
        real_insert = overlay.insert

        def insert_then_fail(table, keys, vectors):
            real_insert(table, keys, vectors)
            raise OSError("overlay failed after writing (test)")

        monkeypatch.setattr(overlay, "insert", insert_then_fail)
        message = np.concatenate([everything[:20], [10**9 + 1]]).astype(np.int64)
        with pytest.raises(UpdateApplyError, match="undone"):
            updater.apply(TAG, message, np.full((len(message), DIM), 9.0, np.float32))
        np.testing.assert_array_equal(host.lookup_stored(everything)[0], before)
    finally:
        model_lookup.close()


@pytest.fixture(scope="module")
def cluster():
    from redis_cluster import redis_cluster

    yield from redis_cluster()


def test_new_keys_reach_a_store_compressed_redis_as_stored_rows(tmp_path: Path, cluster) -> None:
    """With a Redis cluster as the volatile tier, an update's new keys are written there too:
    with ``store_compressed``, as the table's stored rows, quantised once (the overlay holds
    the same bytes)."""
    cfg = updated_config(tmp_path, storage="int8")
    ps = cfg.to_dict(tmp_path)
    ps["volatile_db"] = {"type": "redis_cluster", "address": cluster.address,
                         "num_partitions": 3, "store_compressed": True}  # fmt: skip
    cfg = parse_ps_config(ps, tmp_path)
    model_lookup = ModelLookup(cfg, cfg.models[0])
    fmt = RowFormat("int8", DIM)
    try:
        updater = ModelUpdater(model_lookup, settle_s=0)
        keys = np.arange(1, 41, dtype=np.int64) * 7919 + 10**12  # keys the files lack
        vectors = (np.random.default_rng(13).standard_normal((40, DIM)) * 3).astype(np.float32)
        updater.apply(TAG, keys, vectors)
        host = model_lookup.table(0).host
        redis = host.lower_store("redis_cluster")
        assert redis.table == f"{TAG}@int8"
        stored, found = redis.store.lookup_stored(redis.table, keys, DIM)
        assert found.all()
        np.testing.assert_array_equal(stored, reference_stored(fmt, vectors))
        overlay = host.lower_store("overlay")
        np.testing.assert_array_equal(overlay.store.lookup_stored(overlay.table, keys, DIM)[0],
                                      stored)  # fmt: skip
        np.testing.assert_array_equal(model_lookup.lookup(0, keys), reference_decoded(fmt, vectors))
    finally:
        model_lookup.close()
