"""Set sizing, key-to-set mapping and the batch plans shared by the twin and the kernels."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hps_core.cache.layout import WAYS, last_of_each, num_sets_for, plan_runs, set_of

MASK = (1 << 64) - 1


def splitmix64_finaliser(key: int) -> int:
    """Pure-Python SplitMix64 finaliser on the two's-complement bits of ``key``."""
    z = key & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


@pytest.mark.parametrize("capacity", [-5, 0, 1, 63, 64, 65, 127, 128, 1000, 10**9 + 7])
def test_num_sets_holds_capacity_with_at_least_one_set(capacity: int) -> None:
    sets = num_sets_for(capacity)
    smallest = next(s for s in itertools.count(1) if s * WAYS >= capacity)
    assert sets == smallest


@pytest.mark.parametrize("num_sets", [1, 3, 64, 1000, 2**31 + 11])
def test_set_of_matches_pure_python_hash(num_sets: int) -> None:
    rng = np.random.default_rng(num_sets)
    keys = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, 500, dtype=np.int64)
    keys[:4] = [0, -1, np.iinfo(np.int64).min, np.iinfo(np.int64).max]
    sets = set_of(keys, num_sets)
    assert sets.dtype == np.int64
    assert sets.tolist() == [splitmix64_finaliser(int(k)) % num_sets for k in keys]


def test_dense_keys_spread_evenly_over_sets() -> None:
    sets = set_of(np.arange(64_000, dtype=np.int64), 16)
    counts = np.bincount(sets, minlength=16)
    assert counts.min() > 0.9 * 4000 and counts.max() < 1.1 * 4000


@pytest.mark.parametrize(("n", "num_sets"), [(0, 1), (1, 1), (10, 1), (50, 3), (2000, 40)])
def test_plan_runs_orders_by_set_then_position(n: int, num_sets: int) -> None:
    rng = np.random.default_rng(n)
    sets = rng.integers(0, num_sets, n, dtype=np.int64)
    positions = np.flatnonzero(rng.random(n) < 0.8)
    plan = plan_runs(sets, positions)
    expected = sorted(positions.tolist(), key=lambda p: (sets[p], p))
    assert plan.order.tolist() == expected
    runs = [list(group) for _, group in itertools.groupby(expected, key=lambda p: sets[p])]
    assert plan.runs == len(runs)
    got = [plan.order[a:b].tolist() for a, b in itertools.pairwise(plan.bounds.tolist())]
    assert got == runs


@pytest.mark.parametrize("m", [0, 1, 5, 300])
def test_last_of_each_picks_the_last_occurrence(m: int) -> None:
    groups = np.random.default_rng(m).integers(0, max(1, m // 3), m, dtype=np.int64)
    last: dict[int, int] = {}
    for index, group in enumerate(groups.tolist()):
        last[group] = index
    assert last_of_each(groups).tolist() == [last[g] for g in sorted(last)]
