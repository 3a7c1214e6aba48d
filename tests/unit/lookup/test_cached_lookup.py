"""A table's GPU cache in front of its host tier (``CachedTableLookup``), with the NumPy twin
of the GPU cache (tests/gpu runs CuPy): warm-up, refresh and what its snapshot counts. GPU
lookups through these caches are the cache bank's (tests/gpu/lookup)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from cached_lookup_cases import dynamic_cache, expected, make_host

from hps_core.cache import make_cache
from hps_core.lookup import CachedTableLookup, TableCounters


def test_warm_inserts_hottest_first_and_refresh_restores_rows(tmp_path: Path) -> None:
    host, reference = make_host(tmp_path / "t", 2000, 4, seed=9)
    cache = dynamic_cache(128, 4, np)
    lookup = CachedTableLookup(host, cache, np)
    keys = np.fromiter(reference, np.int64, len(reference))
    assert lookup.warm(keys) == cache.capacity
    # The first keys of the hot list (the hottest) are in the cache, with their rows.
    rows, hits = cache.query(keys[:32])
    assert hits.all()
    np.testing.assert_array_equal(rows, expected(reference, keys[:32], 4))
    # Corrupt cached rows, then a full refresh reads them back from the host tier.
    stored = cache.dump()
    cache.update(stored, np.full((len(stored), 4), 99.0, np.float32))
    assert lookup.refresh(0, cache.num_sets) == len(stored)
    rows, hits = cache.query(stored)
    assert hits.all()
    np.testing.assert_array_equal(rows, expected(reference, stored, 4))
    lookup.close()


def test_refresh_walks_sets_in_strides(tmp_path: Path) -> None:
    """A refresh of some sets re-reads their rows only: the others stay as they were."""
    host, reference = make_host(tmp_path / "t", 2000, 4, seed=3)
    cache = dynamic_cache(256, 4, np)
    lookup = CachedTableLookup(host, cache, np)
    lookup.warm(np.fromiter(reference, np.int64, len(reference)))
    half = cache.num_sets // 2
    first, second = cache.dump(0, half), cache.dump(half, cache.num_sets)
    assert len(first) and len(second)
    stale = np.full((len(first) + len(second), 4), 99.0, np.float32)
    cache.update(np.concatenate([first, second]), stale)
    assert lookup.refresh(0, half) == len(first)
    np.testing.assert_array_equal(cache.query(first)[0], expected(reference, first, 4))
    assert (cache.query(second)[0] == 99.0).all()
    assert lookup.refresh(half, cache.num_sets) == len(second)
    np.testing.assert_array_equal(cache.query(second)[0], expected(reference, second, 4))
    assert lookup.refresh(0, 0) == 0  # no set: nothing read


def test_unknown_keys_are_never_cached(tmp_path: Path) -> None:
    host, reference = make_host(tmp_path / "t", 100, 4, seed=2)
    cache = dynamic_cache(64, 4, np)
    lookup = CachedTableLookup(host, cache, np)
    assert lookup.warm(np.empty(0, np.int64)) == 0
    assert lookup.warm(np.array([1, 4, 7], dtype=np.int64)) == 0  # never multiples of 3
    assert cache.size == 0
    known = np.fromiter(reference, np.int64, len(reference))[:10]
    mixed = np.concatenate([[1], known, [4]]).astype(np.int64)
    assert lookup.warm(mixed) == 10
    assert cache.size == 10
    assert cache.query(np.array([1, 4], dtype=np.int64))[1].tolist() == [False, False]
    lookup.close()


def test_snapshot_reports_cache_evictions_and_no_lookups(tmp_path: Path) -> None:
    """The table counts what its cache did (evictions); its lookups are the engine's."""
    host, reference = make_host(tmp_path / "t", 3000, 4, seed=4)
    lookup = CachedTableLookup(host, dynamic_cache(64, 4, np), np, name="t")
    keys = np.fromiter(reference, np.int64, len(reference))
    for start in range(0, 3000, 500):  # each warm-up fills the cache with other keys
        assert lookup.warm(keys[start : start + 500]) == lookup.cache.capacity
    evictions = lookup.cache.stats().evictions
    assert evictions > 0
    assert lookup.snapshot() == TableCounters(evictions=evictions)
    lookup.close()


def test_a_static_cache_is_neither_warmed_nor_refreshed(tmp_path: Path) -> None:
    """A static cache holds the whole table from the start: nothing to warm or re-read."""
    host, reference = make_host(tmp_path / "t", 500, 8, seed=1)
    keys_all, values_all = host.contents()
    cache = make_cache("static", len(keys_all), 8, np, contents=(keys_all, values_all))
    lookup = CachedTableLookup(host, cache, np)
    assert lookup.dim == 8
    assert lookup.warm(keys_all) == 0
    assert lookup.refresh(0, 1) == 0
    rows, hits = cache.query(keys_all[:50])
    assert hits.all()
    np.testing.assert_array_equal(rows, expected(reference, keys_all[:50], 8))
    assert lookup.snapshot() == TableCounters()
    lookup.close()
