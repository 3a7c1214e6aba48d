"""StaticTable (whole table, no eviction) against a dict on random tables and queries."""

from __future__ import annotations

import numpy as np
import pytest

from hps_core.cache import EMPTY_KEY, StaticTable

INT64_MIN = int(np.iinfo(np.int64).min)


def random_table(rows: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(-(10**6), 10**6, size=rows * 2, dtype=np.int64))[:rows]
    rng.shuffle(keys)
    return keys, rng.standard_normal((keys.shape[0], dim)).astype(np.float32)


@pytest.mark.parametrize(
    ("rows", "dim", "queries"), [(0, 2, 5), (1, 1, 4), (50, 3, 200), (5000, 8, 20000)]
)
def test_query_matches_a_dict(rows: int, dim: int, queries: int) -> None:
    keys, values = random_table(rows, dim, rows)
    reference = dict(zip(keys.tolist(), values, strict=True))
    table = StaticTable(keys, values)
    rng = np.random.default_rng(queries)
    asked = rng.integers(-(10**6), 10**6, queries, dtype=np.int64)
    if rows:
        asked[::3] = rng.choice(keys, size=asked[::3].shape[0])
    out = np.full((queries, dim), np.nan, np.float32)
    result, hit = table.query(asked, out=out)
    assert result is out
    for i, key in enumerate(asked.tolist()):
        assert hit[i] == (key in reference)
        if key in reference:
            np.testing.assert_array_equal(out[i], reference[key])
        else:
            assert np.isnan(out[i]).all()
    stats = table.stats()
    assert (stats.hits, stats.misses) == (int(hit.sum()), queries - int(hit.sum()))
    assert table.size == rows and table.dim == dim


def test_every_int64_key_can_be_stored_including_extremes() -> None:
    keys = np.array([EMPTY_KEY, INT64_MIN, -1, 0], dtype=np.int64)
    values = np.arange(8, dtype=np.float32).reshape(4, 2)
    table = StaticTable(keys, values)
    got, hit = table.query(np.array([0, EMPTY_KEY, 5, INT64_MIN]))
    assert hit.tolist() == [True, True, False, True]
    np.testing.assert_array_equal(got, [[6, 7], [0, 1], [0, 0], [2, 3]])


def test_update_overwrites_present_keys_last_duplicate_wins() -> None:
    table = StaticTable(np.array([10, 20]), np.zeros((2, 1), np.float32))
    table.update(np.array([20, 30, 20, 10]), np.array([[1], [2], [3], [4]], np.float32))
    got, hit = table.query(np.array([10, 20, 30]))
    assert hit.tolist() == [True, True, False]
    np.testing.assert_array_equal(got, [[4], [3], [0]])
    assert table.stats().updated == 3


def test_table_does_not_alias_the_callers_arrays() -> None:
    keys = np.array([1, 2])
    values = np.ones((2, 1), np.float32)
    table = StaticTable(keys, values)
    values[:] = 5
    keys[:] = 7
    got, hit = table.query(np.array([1, 2]))
    assert hit.all()
    np.testing.assert_array_equal(got, np.ones((2, 1)))


@pytest.mark.parametrize(
    ("keys", "values", "error", "fragment"),
    [
        (np.array([1, 2, 1]), np.zeros((3, 2), np.float32), ValueError, "key 1 appears more"),
        (np.array([1, 2]), np.zeros(2, np.float32), ValueError, "2-D"),
        (np.array([1, 2]), np.zeros((2, 0), np.float32), ValueError, "2-D"),
        (np.array([1, 2]), np.zeros((3, 2), np.float32), ValueError, "(2, 2)"),
        (np.array([1.0, 2.0]), np.zeros((2, 2), np.float32), TypeError, "integers"),
    ],
)
def test_bad_tables_are_rejected_with_their_name(keys, values, error, fragment) -> None:
    with pytest.raises(error) as info:
        StaticTable(keys, values, name="wdl.t1")
    assert "wdl.t1" in str(info.value) and fragment in str(info.value)
