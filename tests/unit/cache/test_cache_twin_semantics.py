"""Deterministic cases of the dynamic cache contract, checked on the NumPy twin."""

from __future__ import annotations

import numpy as np
import pytest
from cache_twin import NumpyDynamicCache

from hps_core.cache import EMPTY_KEY, WAYS
from hps_core.cache.layout import set_of


def rows_for(keys: list[int], dim: int = 2, salt: float = 0.0) -> np.ndarray:
    """Vectors that identify their key (and a salt telling writes apart)."""
    base = np.asarray(keys, dtype=np.float64)[:, None] % 1000 + salt
    return (base + np.arange(dim) / 10).astype(np.float32)


def query_hits(cache: NumpyDynamicCache, keys: list[int]) -> list[bool]:
    return cache.query(np.array(keys, dtype=np.int64))[1].tolist()


def test_lru_eviction_order_in_one_set() -> None:
    cache = NumpyDynamicCache(1, 2)
    first = list(range(WAYS))
    cache.replace(np.array(first), rows_for(first))
    assert cache.size == WAYS
    cache.query(np.array([0, 2]))  # 0 and 2 become the most recent
    cache.replace(np.array([100, 101]), rows_for([100, 101]))
    # The two least recent keys were 1 and 3.
    assert sorted(cache.dump().tolist()) == sorted(set(first) - {1, 3} | {100, 101})
    assert query_hits(cache, [0, 1, 2, 3, 100]) == [True, False, True, False, True]
    stats = cache.stats()
    assert (stats.inserts, stats.evictions) == (WAYS + 2, 2)


def test_batch_larger_than_a_set_keeps_its_last_keys() -> None:
    cache = NumpyDynamicCache(1, 1)
    cache.replace(np.arange(WAYS), rows_for(list(range(WAYS)), 1))
    batch = list(range(1000, 1000 + WAYS + 5))
    cache.replace(np.array(batch), rows_for(batch, 1))
    # Old keys go first, then the batch's own earliest keys.
    assert sorted(cache.dump().tolist()) == batch[5:]
    assert cache.stats().evictions == WAYS + 5


def test_replace_refreshes_without_overwriting_and_first_duplicate_wins() -> None:
    cache = NumpyDynamicCache(1, 2)
    cache.replace(np.array([5, 5]), np.array([[1, 1], [2, 2]], np.float32))
    assert cache.stats().inserts == 1
    cache.replace(np.array([5]), np.array([[9, 9]], np.float32))
    values, hit = cache.query(np.array([5]))
    assert hit.tolist() == [True]
    np.testing.assert_array_equal(values, [[1, 1]])


def test_replace_of_a_stored_key_refreshes_its_lru_position() -> None:
    cache = NumpyDynamicCache(1, 1)
    keys = list(range(WAYS))
    cache.replace(np.array(keys), rows_for(keys, 1))
    cache.replace(np.array([0]), rows_for([0], 1))  # 0 becomes most recent
    cache.replace(np.array([500]), rows_for([500], 1))
    assert query_hits(cache, [0, 1]) == [True, False]


def test_update_overwrites_stored_keys_only_and_last_duplicate_wins() -> None:
    cache = NumpyDynamicCache(2, 2)
    cache.replace(np.array([1, 2]), rows_for([1, 2]))
    cache.update(np.array([2, 3, 2]), np.array([[7, 7], [8, 8], [9, 9]], np.float32))
    values, hit = cache.query(np.array([1, 2, 3]))
    assert hit.tolist() == [True, True, False]
    np.testing.assert_array_equal(values[1], [9, 9])
    np.testing.assert_array_equal(values[0], rows_for([1])[0])
    assert cache.stats().updated == 2
    assert cache.size == 2


def test_update_does_not_change_lru_order() -> None:
    cache = NumpyDynamicCache(1, 1)
    keys = list(range(WAYS))
    cache.replace(np.array(keys), rows_for(keys, 1))
    cache.update(np.array([0]), rows_for([0], 1, salt=0.5))
    cache.replace(np.array([500]), rows_for([500], 1))
    assert query_hits(cache, [0, 500]) == [False, True]


def test_query_leaves_miss_rows_untouched_and_zero_fills_a_fresh_output() -> None:
    cache = NumpyDynamicCache(1, 3)
    cache.replace(np.array([4]), rows_for([4], 3))
    out = np.full((3, 3), np.nan, np.float32)
    values, hit = cache.query(np.array([9, 4, 4]), out=out)
    assert values is out
    assert hit.tolist() == [False, True, True]
    assert np.isnan(out[0]).all()
    np.testing.assert_array_equal(out[1:], np.repeat(rows_for([4], 3), 2, axis=0))
    fresh, _ = cache.query(np.array([9]))
    np.testing.assert_array_equal(fresh, np.zeros((1, 3), np.float32))


def test_reserved_key_is_served_as_a_counted_miss_and_never_stored() -> None:
    cache = NumpyDynamicCache(1, 2)
    cache.replace(np.array([EMPTY_KEY, 1]), rows_for([EMPTY_KEY, 1]))
    cache.update(np.array([EMPTY_KEY]), rows_for([EMPTY_KEY]))
    assert cache.size == 1
    assert query_hits(cache, [EMPTY_KEY, 1, EMPTY_KEY]) == [False, True, False]
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.reserved_key_misses) == (1, 2, 2)
    assert (stats.inserts, stats.updated) == (1, 0)
    assert EMPTY_KEY not in cache.dump().tolist()


def test_negative_and_extreme_keys_are_ordinary_keys() -> None:
    keys = [-1, int(np.iinfo(np.int64).min), EMPTY_KEY - 1, 0]
    cache = NumpyDynamicCache(3, 2)
    cache.replace(np.array(keys), rows_for(keys))
    values, hit = cache.query(np.array(keys))
    assert hit.all()
    np.testing.assert_array_equal(values, rows_for(keys))


def test_unsigned_keys_are_reinterpreted_as_int64() -> None:
    cache = NumpyDynamicCache(1, 1)
    cache.replace(np.array([2**64 - 1], dtype=np.uint64), np.ones((1, 1), np.float32))
    assert query_hits(cache, [-1]) == [True]
    assert cache.query(np.array([7], dtype=np.int32))[1].tolist() == [False]


def test_empty_batches_change_nothing() -> None:
    cache = NumpyDynamicCache(2, 4)
    cache.replace(np.array([3]), rows_for([3], 4))
    before = cache.export_state()
    values, hit = cache.query(np.array([], dtype=np.int64))
    assert values.shape == (0, 4) and hit.shape == (0,)
    cache.replace([], np.empty((0, 4), np.float32))
    cache.update(np.array([], dtype=np.int64), [])
    after = cache.export_state()
    assert after.clock == before.clock
    np.testing.assert_array_equal(after.keys, before.keys)
    np.testing.assert_array_equal(after.stamps, before.stamps)
    assert cache.stats().hits + cache.stats().misses == 0


def test_clock_advances_by_batch_length_and_stamps_follow_positions() -> None:
    cache = NumpyDynamicCache(1, 1)
    cache.replace(np.array([10, 11, 12]), rows_for([10, 11, 12], 1))
    cache.query(np.array([12, 99, 10, 12]))
    cache.update(np.array([11]), rows_for([11], 1))
    state = cache.export_state()
    assert state.clock == 7
    stamps = dict(zip(state.keys[0].tolist(), state.stamps[0].tolist(), strict=True))
    # replace: clock 0 + position; query: clock 3 + position, the later duplicate wins.
    assert (stamps[10], stamps[11], stamps[12]) == (3 + 2, 1, 3 + 3)


def test_dump_ranges_follow_sets_and_slot_order() -> None:
    num_sets = 4
    cache = NumpyDynamicCache(num_sets, 1)
    keys = np.arange(-200, 200, 7, dtype=np.int64)
    cache.replace(keys, rows_for(keys.tolist(), 1))
    sets = set_of(keys, num_sets)
    for start in range(num_sets + 1):
        for end in range(start, num_sets + 1):
            dumped = cache.dump(start, end)
            expected = keys[(sets >= start) & (sets < end)]
            assert sorted(dumped.tolist()) == sorted(expected.tolist())
    # Within a set, keys sit in insertion order (slots fill from 0).
    for s in range(num_sets):
        assert cache.dump(s, s + 1).tolist() == keys[sets == s].tolist()


def test_clear_empties_the_cache_but_keeps_counters() -> None:
    cache = NumpyDynamicCache(2, 1)
    cache.replace(np.array([1, 2, 3]), rows_for([1, 2, 3], 1))
    cache.query(np.array([1]))
    cache.clear()
    assert cache.size == 0 and cache.dump().size == 0
    assert query_hits(cache, [1, 2, 3]) == [False] * 3
    assert cache.stats().hits == 1
    cache.replace(np.array([2]), rows_for([2], 1))
    assert query_hits(cache, [2]) == [True]


def test_capacity_and_hit_rate() -> None:
    cache = NumpyDynamicCache(3, 1)
    assert cache.capacity == 3 * WAYS and cache.num_sets == 3 and cache.dim == 1
    assert cache.stats().hit_rate == 0.0
    cache.replace(np.array([1]), rows_for([1], 1))
    cache.query(np.array([1, 2, 1, 3]))
    assert cache.stats().hit_rate == 0.5


@pytest.mark.parametrize(
    ("call", "error", "fragment"),
    [
        (lambda c: c.query(np.zeros((2, 2), np.int64)), ValueError, "one-dimensional"),
        (lambda c: c.query(np.array([1.5])), TypeError, "integers"),
        (lambda c: c.query(np.array([True])), TypeError, "integers"),
        (lambda c: c.replace(np.array([1, 2]), np.zeros((2, 3), np.float32)), ValueError, "(2, 2)"),
        (lambda c: c.replace(np.array([1]), np.zeros((1, 2), np.int32)), TypeError, "floating"),
        (lambda c: c.update(np.array([1]), np.zeros(2, np.float32)), ValueError, "shape"),
        (lambda c: c.query(np.array([1]), out=np.zeros((1, 2), np.float64)), ValueError, "out"),
        (lambda c: c.query(np.array([1]), out=np.zeros((2, 2), np.float32)), ValueError, "out"),
        (
            lambda c: c.query(np.array([1]), out=np.zeros((1, 4), np.float32)[:, ::2]),
            ValueError,
            "out",
        ),
        (lambda c: c.query(np.array([1]), out=[[0.0, 0.0]]), ValueError, "numpy array"),
        (lambda c: c.dump(2, 1), ValueError, "set range"),
        (lambda c: c.dump(0, 5), ValueError, "set range"),
        (lambda c: c.dump(-1), ValueError, "set range"),
    ],
)
def test_bad_arguments_name_the_cache_and_the_problem(call, error, fragment) -> None:
    cache = NumpyDynamicCache(4, 2, name="dcn.t0")
    with pytest.raises(error) as info:
        call(cache)
    assert "dcn.t0" in str(info.value)
    assert fragment in str(info.value)


@pytest.mark.parametrize(("num_sets", "dim"), [(0, 1), (1, 0), (-2, 4), (1, 2.5), (True, 1)])
def test_bad_shapes_are_rejected(num_sets, dim) -> None:
    with pytest.raises(ValueError, match="must be a positive integer"):
        NumpyDynamicCache(num_sets, dim, name="m.t")
