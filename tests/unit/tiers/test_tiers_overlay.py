"""The update overlay (``hps_core.tiers.overlay``) against a dict: inserts, overwrites,
repeated keys in one insert (the last wins), removal, unknown tables and keys, wrong widths."""

from __future__ import annotations

import numpy as np
import pytest

from hps_core.errors import RequestError
from hps_core.tiers.overlay import OverlayStore


def test_overlay_matches_a_dict_over_random_inserts(rng: np.random.Generator) -> None:
    store, reference, dim = OverlayStore(), {}, 5
    for _ in range(40):
        n = int(rng.integers(0, 3000))
        keys = rng.integers(-50_000, 50_000, n).astype(np.int64)  # repeats within and across
        vectors = rng.standard_normal((n, dim)).astype(np.float32)
        store.insert("t", keys, vectors)
        reference.update(zip(keys.tolist(), vectors, strict=True))  # the last occurrence wins
        probe = rng.integers(-60_000, 60_000, 500).astype(np.int64)
        values, found = store.lookup("t", probe, dim, default=-2.0)
        for key, value, hit in zip(probe.tolist(), values, found, strict=True):
            assert hit == (key in reference)
            np.testing.assert_array_equal(value, reference.get(key, np.full(dim, -2.0)))
    assert store.rows("t") == len(reference)
    assert store.tables() == ["t"] and store.errors == 0


def test_remove_forgets_keys_and_tables_are_separate() -> None:
    store = OverlayStore()
    store.insert("a", np.array([1, 2, 3]), np.arange(6, dtype=np.float32).reshape(3, 2))
    store.insert("b", np.array([1]), np.full((1, 2), 9, np.float32))
    store.remove("a", np.array([2, 99]))
    values, found = store.lookup("a", np.array([1, 2, 3]), 2)
    assert found.tolist() == [True, False, True]
    assert values.tolist() == [[0, 1], [0, 0], [4, 5]]
    assert store.lookup("b", np.array([1]), 2)[0].tolist() == [[9, 9]]
    assert store.lookup("none", np.array([1]), 2)[1].tolist() == [False]
    store.insert("a", np.array([2]), np.full((1, 2), 7, np.float32))  # back after removal
    assert store.lookup("a", np.array([2]), 2)[0].tolist() == [[7, 7]]
    store.close()
    assert store.tables() == []


def test_bad_shapes_are_refused_and_change_nothing() -> None:
    store = OverlayStore()
    store.insert("t", np.array([1]), np.ones((1, 4), np.float32))
    with pytest.raises(RequestError, match="4"):
        store.insert("t", np.array([2]), np.ones((1, 3), np.float32))
    with pytest.raises(RequestError, match="2 keys"):
        store.insert("t", np.array([2, 3]), np.ones((1, 4), np.float32))
    assert store.rows("t") == 1
