"""The NumPy twin against the dict-and-list reference model on random call sequences."""

from __future__ import annotations

import numpy as np
import pytest
from cache_lru_model import LruModel
from cache_twin import NumpyDynamicCache
from hypothesis import given, settings
from hypothesis import strategies as st

from hps_core.cache import EMPTY_KEY, WAYS

INT64_MIN = int(np.iinfo(np.int64).min)
SPECIAL_KEYS = [EMPTY_KEY, INT64_MIN, -1, 0, 1]


def lru_order_of_twin(cache: NumpyDynamicCache, set_index: int) -> list[int]:
    state = cache.export_state()
    keys, stamps = state.keys[set_index], state.stamps[set_index]
    stored = keys != EMPTY_KEY
    return keys[stored][np.argsort(stamps[stored], kind="stable")].tolist()


def assert_same(cache: NumpyDynamicCache, model: LruModel) -> None:
    """Contents, LRU order, values, size and counters agree."""
    assert cache.size == model.size
    assert cache.stats() == model.stats()
    for s in range(model.num_sets):
        assert sorted(cache.dump(s, s + 1).tolist()) == model.keys_in(s, s + 1)
        assert lru_order_of_twin(cache, s) == model.lru_order(s)
    assert sorted(cache.dump().tolist()) == model.keys_in(0, model.num_sets)
    state = cache.export_state()
    flat_keys = state.keys.reshape(-1)
    for slot in np.flatnonzero(flat_keys != EMPTY_KEY):
        key = int(flat_keys[slot])
        expected = model.sets[model.set_of(key)][key]
        np.testing.assert_array_equal(state.values[slot], expected)


def apply_step(
    cache: NumpyDynamicCache, model: LruModel, op: str, keys: list[int], rng: np.random.Generator
) -> None:
    """Run one call on both and compare what it returns."""
    n = len(keys)
    if op == "query":
        out = np.full((n, cache.dim), np.nan, dtype=np.float32)
        expected = out.copy()
        _, hit = cache.query(np.array(keys, dtype=np.int64), out=out)
        expected_hit = model.query(keys, expected)
        np.testing.assert_array_equal(hit, expected_hit)
        np.testing.assert_array_equal(out, expected)  # NaN rows (misses) must stay NaN
    else:
        values = rng.standard_normal((n, cache.dim)).astype(np.float32)
        getattr(cache, op)(np.array(keys, dtype=np.int64), values)
        getattr(model, op)(keys, values)


@st.composite
def call_sequences(draw: st.DrawFn) -> tuple[int, int, list[tuple[str, list[int]]], int]:
    """Cache shape, calls and a value seed; keys mix random pool keys and edge keys."""
    num_sets = draw(st.integers(1, 3))
    dim = draw(st.integers(1, 3))
    edge = SPECIAL_KEYS + draw(st.lists(st.integers(INT64_MIN, EMPTY_KEY), max_size=4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    # Up to three times the capacity, so full sets and evictions are common.
    pool_size = draw(st.integers(1, 3 * WAYS * num_sets))
    pool = rng.integers(INT64_MIN, EMPTY_KEY, size=pool_size, dtype=np.int64).tolist()
    calls = []
    for _ in range(draw(st.integers(1, 10))):
        op = draw(st.sampled_from(["query", "replace", "update", "replace"]))
        keys = [pool[i] for i in rng.integers(0, pool_size, size=draw(st.integers(0, 160)))]
        for key in draw(st.lists(st.sampled_from(edge), max_size=4)):
            keys.insert(int(rng.integers(0, len(keys) + 1)), key)
        calls.append((op, keys))
    return num_sets, dim, calls, int(rng.integers(0, 2**32))


@settings(max_examples=120, deadline=None)
@given(call_sequences())
def test_twin_matches_model_on_random_calls(case: tuple) -> None:
    num_sets, dim, calls, seed = case
    rng = np.random.default_rng(seed)
    cache = NumpyDynamicCache(num_sets, dim)
    model = LruModel(num_sets, dim)
    for op, keys in calls:
        apply_step(cache, model, op, keys, rng)
        assert_same(cache, model)


@pytest.mark.parametrize(
    ("num_sets", "universe", "batch", "steps"),
    [(1, 100, 40, 30), (4, 600, 300, 20), (16, 3000, 2000, 12)],
)
def test_twin_matches_model_on_skewed_streams(
    num_sets: int, universe: int, batch: int, steps: int
) -> None:
    """Skewed streams (hot keys first) over a key universe larger than the cache."""
    rng = np.random.default_rng(num_sets)
    key_space = rng.integers(INT64_MIN, EMPTY_KEY, size=universe, dtype=np.int64)
    key_space[:3] = [EMPTY_KEY, -1, 0]
    cache = NumpyDynamicCache(num_sets, 4)
    model = LruModel(num_sets, 4)
    for step in range(steps):
        ranks = (rng.random(batch) ** 2 * universe).astype(np.int64)
        keys = key_space[ranks].tolist()
        op = ("query", "replace", "query", "update")[step % 4]
        apply_step(cache, model, op, keys, rng)
        assert_same(cache, model)
    assert model.counts["evictions"] > 0
    assert model.counts["hits"] > 0
