"""Host and cached lookups over a table with lower tiers (``hps_core.tiers.cascade``): the
shared host tier holds 30% of the rows, RocksDB all of them; answers equal the file rows and
the tier counters reach ``TableCounters`` (what the metrics endpoint publishes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cached_lookup_cases import DEFAULT, dynamic_cache, expected, query_stream
from lookup_testdata import write_models

from hps_core.config import PSConfig, parse_ps_config
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.hps import HPS
from hps_core.lookup import CachedTableLookup, HostTableLookup, ModelLookup
from hps_core.tiers.cascade import TieredTable
from hps_core.tiers.host_table import SharedHostTable

ROWS, DIM = 3000, 8


def tiered_config(root: Path, rate: float = 0.3) -> tuple[PSConfig, dict]:
    """A one-table ps.json with a partial shared tier over RocksDB, and its dict reference."""
    rng = np.random.default_rng(4)
    keys = rng.choice(np.arange(-(10**9), 10**9, 3), ROWS, replace=False).astype(np.int64)
    vectors = rng.standard_normal((ROWS, DIM)).astype(np.float32)
    write_sparse_table(root / "t0", keys, vectors)
    ps = {
        "supportlonglong": True,
        "volatile_db": {"type": "hash_map", "initial_cache_rate": rate},
        "persistent_db": {"type": "rocks_db", "path": str(root / "db"), "num_threads": 2},
        "models": [
            {
                "model": "m",
                "sparse_files": ["t0"],
                "deployed_device_list": [0],
                "default_value_for_each_table": [DEFAULT],
                "maxnum_catfeature_query_per_table_per_sample": [4],
                "embedding_vecsize_per_table": [DIM],
            }
        ],
    }
    return parse_ps_config(ps, root), dict(zip(keys.tolist(), vectors, strict=True))


def test_host_lookup_through_the_cascade_counts_every_tier(tmp_path: Path) -> None:
    cfg, reference = tiered_config(tmp_path)
    model_lookup = ModelLookup(cfg, cfg.models[0])
    table = model_lookup.table(0)
    assert isinstance(table, HostTableLookup) and isinstance(table.host, TieredTable)
    first = set(list(reference)[: round(0.3 * ROWS)])
    keys = unique = unknown = distinct_unknown = 0
    for q in query_stream(reference, 6, 500, seed=2):
        q = np.concatenate([q, [1, 1]])  # a key no tier holds, twice
        np.testing.assert_array_equal(model_lookup.lookup(0, q), expected(reference, q, DIM))
        keys += len(q)
        unique += len(np.unique(q))
        unknown += sum(k not in reference for k in q.tolist())
        distinct_unknown += len(set(q.tolist()) - reference.keys())
    c = model_lookup.counters()[0]
    # HostTableLookup deduplicates: the cascade sees each batch's distinct keys once; the
    # lookup counters count every key occurrence.
    assert c.tier_host_hits + c.tier_rocks_db_hits + c.tier_default_keys == unique
    assert c.tier_default_keys == distinct_unknown
    assert (c.keys, c.unknown_keys) == (keys, unknown)
    assert unknown > distinct_unknown > 0
    assert c.tier_host_hits > 0 and c.tier_rocks_db_hits > 0
    # Each batch with keys the shared tier lacks asked RocksDB once, and that took time.
    assert c.tier_rocks_db_lookups == 6 and c.tier_rocks_db_seconds > 0
    assert c.tier_overlay_lookups == c.tier_redis_cluster_lookups == 0
    assert c.tier_host_hits == sum(
        len(set(np.unique(q).tolist()) & first) for q in query_stream(reference, 6, 500, seed=2)
    )
    model_lookup.close()


def test_cache_warm_up_and_refresh_read_through_the_cascade(tmp_path: Path) -> None:
    """A GPU cache's warm-up and refresh read the rows the shared tier lacks from RocksDB,
    counted in the table's tier counters."""
    cfg, reference = tiered_config(tmp_path)
    model_lookup = ModelLookup(cfg, cfg.models[0])
    host = model_lookup.table(0).host
    cache = dynamic_cache(4 * ROWS, DIM, np, name="t")  # room for every row, sets to spare
    lookup = CachedTableLookup(host, cache, np, name="t")
    keys = np.fromiter(reference, np.int64, ROWS)
    in_shared = round(0.3 * ROWS)  # the shared tier holds the file's first rows
    unknown = np.array([1, 4, 7], np.int64)  # never multiples of 3
    assert lookup.warm(np.concatenate([keys, unknown])) == ROWS
    c = lookup.snapshot()
    assert (c.tier_host_hits, c.tier_rocks_db_hits) == (in_shared, ROWS - in_shared)
    assert c.tier_default_keys == len(unknown)
    assert c.lookups == c.keys == 0  # the table counts no lookups: the engine does
    rows, hits = cache.query(keys)
    assert hits[:in_shared].any() and hits[in_shared:].any()  # rows of both tiers cached
    assert int(np.count_nonzero(hits)) == cache.size == ROWS - cache.stats().evictions
    np.testing.assert_array_equal(rows[hits], expected(reference, keys[hits], DIM))
    assert not cache.query(unknown)[1].any()
    # A refresh re-reads every cached row, those only RocksDB holds from RocksDB.
    stored = cache.dump()
    cache.update(stored, np.full((len(stored), DIM), 99.0, np.float32))
    assert lookup.refresh(0, cache.num_sets) == len(stored) == cache.size
    np.testing.assert_array_equal(cache.query(stored)[0], expected(reference, stored, DIM))
    below = len(set(stored.tolist()) - set(keys[:in_shared].tolist()))
    assert lookup.snapshot().tier_rocks_db_hits - c.tier_rocks_db_hits == below > 0
    lookup.close()
    model_lookup.close()


@pytest.mark.parametrize("rate", [0.3, 1.0])
def test_shared_tier_holds_the_rate_and_table_rows_the_whole_table(
    tmp_path: Path, rate: float
) -> None:
    cfg, _ = tiered_config(tmp_path, rate)
    model_lookup = ModelLookup(cfg, cfg.models[0])
    host = model_lookup.table(0).host
    assert (host.rows, host.table_rows) == (round(rate * ROWS), ROWS)
    model_lookup.close()


def test_without_lower_tiers_the_host_tier_is_counted_inline(tmp_path: Path) -> None:
    ps, data = write_models(tmp_path)
    hps = HPS(ps)
    name = hps.config.model_names[0]
    model_lookup = hps.model(name)
    table = model_lookup.table(0)
    assert type(table.host) is SharedHostTable  # today's object path, no cascade
    keys = data[name][0].keys
    assert not {1, 2} & set(keys.tolist())
    model_lookup.lookup(0, np.concatenate([keys[:10], keys[:3], [1, 2, 2]]).astype(np.int64))
    c = model_lookup.counters()[0]
    # The tier counters count the call's distinct keys, the lookup counters every key.
    assert (c.tier_host_hits, c.tier_default_keys) == (10, 2)
    assert (c.keys, c.unknown_keys) == (16, 3)
    assert c.tier_rocks_db_hits == c.tier_redis_cluster_hits == 0
    hps.close()


@pytest.mark.parametrize("rate", [0.0, 0.3, 1.0])
def test_rows_in_place_through_the_cascade_answer_and_count_as_lookups(
    tmp_path: Path, rate: float
) -> None:
    """``HostTableLookup.rows_in_place`` (what ``hps_torch`` pools from in one pass): every
    key's vector, read from the shared tier's own array where it holds the key and from the
    tiers' answers below it otherwise, equals the file's row (the default for unknown keys),
    and the tables' counters equal those of the same queries looked up row by row. With a
    rate of 0 the shared tier holds nothing, as when Redis is the volatile level."""
    cfg, reference = tiered_config(tmp_path, rate)
    in_place, by_rows = ModelLookup(cfg, cfg.models[0]), ModelLookup(cfg, cfg.models[0])
    keys = unknown = 0
    for q in query_stream(reference, 6, 1500, seed=5):
        q = np.concatenate([q, [1, 1, 4]])  # keys no tier holds, one twice
        keys += len(q)
        unknown += sum(k not in reference for k in q.tolist())
        placed = in_place.table(0).rows_in_place(q)
        got = np.full((len(q), DIM), np.nan, np.float32)
        shared = placed.rows >= 0
        got[shared] = placed.values[placed.rows[shared]]
        got[~shared] = placed.below[placed.below_index[~shared]]
        assert ((placed.rows >= 0) != (placed.below_index >= 0)).all()  # one source a key
        np.testing.assert_array_equal(got, expected(reference, q, DIM))
        by_rows.lookup(0, q)
    fused, rowwise = in_place.counters()[0], by_rows.counters()[0]
    assert (fused.lookups, fused.keys, fused.unknown_keys) == (6, keys, unknown)
    for name in ("lookups", "keys", "unknown_keys", "tier_host_hits",
                 "tier_rocks_db_hits", "tier_default_keys"):  # fmt: skip
        assert getattr(fused, name) == getattr(rowwise, name), name
    assert fused.tier_rocks_db_hits > 0 if rate < 1 else fused.tier_rocks_db_hits == 0
    in_place.close()
    by_rows.close()
