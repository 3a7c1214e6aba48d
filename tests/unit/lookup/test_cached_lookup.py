"""The cached lookup pipeline with the NumPy twin of the GPU cache (tests/gpu runs CuPy)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cached_lookup_cases import DEFAULT, dynamic_cache, expected, make_host, run_stream

from hps_core.cache import make_cache
from hps_core.lookup import CachedTableLookup


@pytest.mark.parametrize("threshold", [0.0, 0.5, 1.1])
def test_every_answer_is_the_true_vector(tmp_path: Path, threshold: float) -> None:
    lookup = run_stream(np, tmp_path / "t", threshold=threshold)
    c = lookup.counters
    assert c.cache_hits + c.cache_misses == c.unique_keys
    assert c.unknown_keys > 0 and c.default_answers == 0
    if threshold > 1:  # every batch below the threshold: inserts inline
        assert c.async_inserts == 0 and c.sync_inserts > 0
    if threshold == 0.0:  # every batch at or above it: inserts in the background
        assert c.sync_inserts == 0 and c.async_inserts > 0
    assert lookup.cache.size > 0
    lookup.close()


def test_hit_rate_grows_on_a_skewed_stream(tmp_path: Path) -> None:
    lookup = run_stream(np, tmp_path / "t", batches=40)
    # Zipf 1.05 over 5000 keys with a cache of 1000 rows: most unique keys hit once warm.
    assert lookup.counters.hit_rate > 0.4
    lookup.close()


def test_hugectr_default_policy_counts_default_answers(tmp_path: Path) -> None:
    lookup = run_stream(np, tmp_path / "t", threshold=0.0, policy="default")
    c = lookup.counters
    assert c.default_answers > 0  # known keys answered with the default vector, counted
    lookup.close()


def test_static_cache_answers_from_the_whole_table(tmp_path: Path) -> None:
    lookup = run_stream(np, tmp_path / "t", kind="static")
    c = lookup.counters
    assert c.cache_misses == c.unknown_keys  # a static table only misses keys it lacks
    assert c.sync_inserts == c.async_inserts == 0
    lookup.close()


def test_duplicates_and_empty_batches(tmp_path: Path) -> None:
    host, reference = make_host(tmp_path / "t", 300, 4, seed=5)
    lookup = CachedTableLookup(host, dynamic_cache(64, 4, np), np, 0.9)
    assert lookup.lookup(np.empty(0, np.int64)).shape == (0, 4)
    key = next(iter(reference))
    q = np.array([key, key, 7, key, 7], dtype=np.int64)
    np.testing.assert_array_equal(lookup.lookup(q), expected(reference, q, 4))
    assert lookup.counters.unique_keys == 2 and lookup.counters.keys == 5
    lookup.close()


def test_warm_inserts_hottest_first_and_refresh_restores_rows(tmp_path: Path) -> None:
    host, reference = make_host(tmp_path / "t", 2000, 4, seed=9)
    cache = dynamic_cache(128, 4, np)
    lookup = CachedTableLookup(host, cache, np, 0.9)
    keys = np.fromiter(reference, np.int64, len(reference))
    assert lookup.warm(keys) == cache.capacity
    # The first keys of the hot list (the hottest) are in the cache.
    hits = cache.query(keys[:32])[1]
    assert hits.all()
    # Corrupt cached rows, then a full refresh reads them back from the host tier.
    stored = cache.dump()
    cache.update(stored, np.full((len(stored), 4), 99.0, np.float32))
    assert lookup.refresh(0, cache.num_sets) == len(stored)
    np.testing.assert_array_equal(lookup.lookup(stored), expected(reference, stored, 4))
    lookup.close()


def test_unknown_keys_are_never_cached(tmp_path: Path) -> None:
    host, _ = make_host(tmp_path / "t", 100, 4, seed=2)
    cache = dynamic_cache(64, 4, np)
    lookup = CachedTableLookup(host, cache, np, 2.0)
    got = lookup.lookup(np.array([1, 4, 7], dtype=np.int64))  # never multiples of 3
    assert (got == DEFAULT).all()
    assert cache.size == 0 and lookup.counters.unknown_keys == 3
    lookup.close()


def test_snapshot_reports_cache_evictions(tmp_path: Path) -> None:
    host, reference = make_host(tmp_path / "t", 3000, 4, seed=4)
    lookup = CachedTableLookup(host, dynamic_cache(64, 4, np), np, 2.0)
    keys = np.fromiter(reference, np.int64, len(reference))
    for start in range(0, 3000, 500):
        lookup.lookup(keys[start : start + 500])
    assert lookup.snapshot().evictions == lookup.cache.stats().evictions > 0
    lookup.close()


@pytest.mark.parametrize("threshold", [0.0, 0.9, 1.1])
def test_several_tables_at_once_equal_the_truth(tmp_path: Path, threshold: float) -> None:
    from cached_lookup_cases import query_stream

    from hps_core.lookup.table_lookup import lookup_cached_tables

    shapes = [(3000, 4, "dynamic"), (500, 16, "static"), (2000, 1, "dynamic"), (800, 8, "dynamic")]
    tables, references = [], []
    for t, (rows, dim, kind) in enumerate(shapes):
        host, reference = make_host(tmp_path / f"t{t}", rows, dim, seed=t)
        if kind == "static":
            cache = make_cache("static", rows, dim, np, contents=host.contents())
        else:
            cache = dynamic_cache(rows // 5, dim, np)
        tables.append(CachedTableLookup(host, cache, np, threshold, name=f"t{t}"))
        references.append(reference)
    streams = [query_stream(ref, 12, 300 + 50 * t, seed=t) for t, ref in enumerate(references)]
    for step in range(12):
        keys = [stream[step] for stream in streams]
        keys[2] = keys[2][: step % 3 * 40]  # sometimes empty
        got = lookup_cached_tables(tables, keys, np)
        for t, (k, (_, dim, _)) in enumerate(zip(keys, shapes, strict=True)):
            np.testing.assert_array_equal(got[t], expected(references[t], k, dim))
    for t, table in enumerate(tables):
        table.flush()
        counters = table.snapshot()
        assert counters.lookups == (8 if t == 2 else 12)  # empty lookups are not counted
        assert counters.cache_hits > 0 and counters.cache_misses > 0
