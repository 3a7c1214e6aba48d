"""Rank-to-key permutation and top-k mass (hps_core.workload)."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from hps_core.workload import permute_ranks, zipf_top_k_mass


@pytest.mark.parametrize("num_rows", [1, 2, 3, 5, 16, 17, 1000, 4099, 65_537])
@pytest.mark.parametrize("seed", [0, 1, 2**40])
def test_permutation_is_a_bijection(num_rows, seed):
    keys = permute_ranks(np.arange(num_rows), num_rows, seed)
    assert keys.dtype == np.int64
    np.testing.assert_array_equal(np.sort(keys), np.arange(num_rows))


def test_permutation_is_elementwise_and_keeps_shape():
    ranks = np.array([[5, 0, 99], [42, 5, 7]])
    keys = permute_ranks(ranks, 100, seed=3)
    assert keys.shape == ranks.shape
    singles = [permute_ranks(np.array([r]), 100, seed=3)[0] for r in ranks.ravel()]
    np.testing.assert_array_equal(keys.ravel(), singles)
    assert keys[0, 0] == keys[1, 1]


def test_permutation_spreads_hot_ranks_over_the_table():
    num_rows = 1_000_003
    hot = permute_ranks(np.arange(2000), num_rows)
    # The hottest keys are not the first rows: their positions look uniform over the table.
    assert abs(np.mean(hot < num_rows // 2) - 0.5) < 0.05
    assert np.abs(np.corrcoef(np.arange(2000), hot)[0, 1]) < 0.1
    # Different seeds give different permutations.
    other = permute_ranks(np.arange(2000), num_rows, seed=1)
    assert np.mean(hot == other) < 0.01


def test_permutation_of_a_huge_domain_is_fast_and_collision_free():
    num_rows = 10**12 + 39
    ranks = np.random.default_rng(0).choice(10**12, size=300_000, replace=False)
    start = time.perf_counter()
    keys = permute_ranks(ranks, num_rows, seed=9)
    assert time.perf_counter() - start < 2.0
    assert keys.min() >= 0 and keys.max() < num_rows
    assert np.unique(keys).size == ranks.size


@pytest.mark.parametrize(
    ("ranks", "message"),
    [
        (np.array([0, 10]), r"ranks must lie in \[0, 10\)"),
        (np.array([-1]), r"ranks must lie in \[0, 10\)"),
        (np.array([0.5]), "ranks must be integers"),
    ],
)
def test_permutation_rejects_bad_ranks(ranks, message):
    with pytest.raises(ValueError, match=message):
        permute_ranks(ranks, 10)


def test_permutation_rejects_negative_seed():
    with pytest.raises(ValueError, match="seed must be >= 0"):
        permute_ranks(np.arange(3), 3, seed=-1)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0, 1.05, 1.5, 3.0])
@pytest.mark.parametrize("num_rows", [1, 10, 1000, 1025, 5000, 300_000])
def test_top_k_mass_matches_exact_sum(alpha, num_rows):
    weights = np.arange(1, num_rows + 1, dtype=np.float64) ** -alpha
    cumulative = np.cumsum(weights)
    total = math.fsum(weights)
    rng = np.random.default_rng(num_rows)
    ks = {0, 1, num_rows - 1, num_rows, *rng.integers(0, num_rows + 1, size=8).tolist()}
    for k in sorted(ks):
        exact = 0.0 if k == 0 else cumulative[k - 1] / total
        assert zipf_top_k_mass(num_rows, alpha, k) == pytest.approx(exact, rel=1e-11, abs=1e-15)


def test_top_k_mass_clips_k_and_is_monotonic():
    assert zipf_top_k_mass(100, 1.0, 10**6) == 1.0
    masses = [zipf_top_k_mass(10**9, 1.05, k) for k in (1, 10, 10**3, 10**6, 10**9)]
    assert masses == sorted(masses) and masses[-1] == 1.0
    assert 0.0 < masses[0] < masses[1]


def test_top_k_mass_bad_arguments():
    with pytest.raises(ValueError, match="k must be >= 0"):
        zipf_top_k_mass(10, 1.0, -1)
    with pytest.raises(ValueError, match="alpha must be finite"):
        zipf_top_k_mass(10, float("inf"), 1)
