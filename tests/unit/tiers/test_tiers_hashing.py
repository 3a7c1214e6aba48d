"""mix64 / unmix64 against a pure-Python SplitMix64 reference and published outputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiers_testdata import EXTREME_KEYS, INT64_MAX, INT64_MIN, MASK64, splitmix64_finalizer

from hps_core.hashing import mix64, unmix64

int64s = st.integers(INT64_MIN, INT64_MAX)

# The first outputs of Vigna's splitmix64.c seeded with 0: next() adds the golden gamma to the
# state and returns the finaliser of the new state, so these are mix64(k * gamma).
GAMMA = 0x9E3779B97F4A7C15
SPLITMIX64_SEED0 = (0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F)


def _as_int64(value: int) -> int:
    value &= MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def test_mix64_reproduces_published_splitmix64_outputs() -> None:
    states = np.array([_as_int64(GAMMA * (i + 1)) for i in range(3)], dtype=np.int64)
    assert mix64(states).tolist() == list(SPLITMIX64_SEED0)


@pytest.mark.parametrize("size", [0, 1, 7, 1000, 100_003])
def test_mix64_matches_python_reference_and_round_trips(size: int) -> None:
    rng = np.random.default_rng(size)
    keys = rng.integers(INT64_MIN, INT64_MAX, size=size, dtype=np.int64, endpoint=True)
    keys[: min(size, len(EXTREME_KEYS))] = EXTREME_KEYS[: min(size, len(EXTREME_KEYS))]
    hashes = mix64(keys)
    assert hashes.dtype == np.uint64 and hashes.shape == keys.shape
    sample = slice(0, 2000)  # the Python reference is slow; the extremes are in front
    assert hashes[sample].tolist() == [splitmix64_finalizer(k) for k in keys[sample].tolist()]
    back = unmix64(hashes)
    assert back.dtype == np.int64
    np.testing.assert_array_equal(back, keys)


def test_extremes_round_trip_and_keep_their_shape() -> None:
    keys = np.array(EXTREME_KEYS, dtype=np.int64).reshape(7, 1)
    hashes = mix64(keys)
    assert hashes.shape == (7, 1)
    np.testing.assert_array_equal(unmix64(hashes), keys)
    assert mix64(np.array([0, -1], np.int64)).tolist() == [
        splitmix64_finalizer(0),
        splitmix64_finalizer(-1),
    ]


def test_uint64_input_hashes_like_the_same_bits_as_int64() -> None:
    keys = np.array(EXTREME_KEYS, dtype=np.int64)
    np.testing.assert_array_equal(mix64(keys.view(np.uint64)), mix64(keys))


def test_mix64_does_not_modify_its_input() -> None:
    keys = np.array(EXTREME_KEYS, dtype=np.int64)
    before = keys.copy()
    mix64(keys)
    np.testing.assert_array_equal(keys, before)


def test_unmix64_inverts_mix64_on_arbitrary_hashes() -> None:
    hashes = np.random.default_rng(3).integers(0, 2**64 - 1, 10_000, np.uint64, endpoint=True)
    hashes[:2] = [0, 2**64 - 1]
    np.testing.assert_array_equal(mix64(unmix64(hashes)), hashes)


@settings(max_examples=300, deadline=None)
@given(st.lists(int64s, max_size=64))
def test_round_trip_any_keys(keys: list[int]) -> None:
    array = np.array(keys, dtype=np.int64)
    hashes = mix64(array)
    assert hashes.tolist() == [splitmix64_finalizer(k) for k in keys]
    np.testing.assert_array_equal(unmix64(hashes), array)


@settings(max_examples=300, deadline=None)
@given(st.lists(int64s, unique=True, max_size=64))
def test_distinct_keys_give_distinct_hashes(keys: list[int]) -> None:
    hashes = mix64(np.array(keys, dtype=np.int64))
    assert len(set(hashes.tolist())) == len(keys)
