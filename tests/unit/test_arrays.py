"""``hps_core.arrays.distinct_keys`` against Python sets, on random keys with repeats, the
int64 extremes and empty input."""

from __future__ import annotations

import numpy as np
import pytest

from hps_core.arrays import HASHED_KEYS, distinct_keys

INT64 = np.iinfo(np.int64)


@pytest.mark.parametrize("n", [0, 1, 1000, HASHED_KEYS, 300_000])
def test_distinct_keys_index_back_to_every_key(n):
    rng = np.random.default_rng(n)
    keys = rng.integers(INT64.min, INT64.max, max(n // 3, 1), dtype=np.int64, endpoint=True)
    keys = rng.choice(np.concatenate([keys, [INT64.min, INT64.max, 0, -1]]), n)
    unique, index = distinct_keys(keys)
    assert unique.dtype == np.int64 and index.shape == keys.shape
    assert len(unique) == len(set(keys.tolist())) == len(np.unique(unique))
    np.testing.assert_array_equal(unique[index], keys)


@pytest.mark.parametrize("n", [12, HASHED_KEYS + 2])
def test_distinct_keys_take_a_strided_view(n):
    keys = (np.arange(2 * n, dtype=np.int64) % 3)[::2]
    unique, index = distinct_keys(keys)
    assert sorted(unique.tolist()) == [0, 1, 2] and unique[index].tolist() == keys.tolist()
