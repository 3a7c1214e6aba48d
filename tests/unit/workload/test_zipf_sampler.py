"""Bounded Zipf sampling (hps_core.workload) against exact probabilities."""

from __future__ import annotations

import math
import time
import tracemalloc

import numpy as np
import pytest

from hps_core.workload import ZipfSampler, permute_ranks, uniform_keys, zipf_keys

ALPHAS = [0.5, 1.0, 1.05, 1.5]


def exact_zipf(num_rows: int, alpha: float) -> np.ndarray:
    weights = np.arange(1, num_rows + 1, dtype=np.float64) ** -alpha
    return weights / weights.sum()


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson statistic over bins with >= 5 expected draws (the rest pooled)."""
    expected = probs * counts.sum()
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    stat = float((((obs - exp) ** 2)[keep] / exp[keep]).sum())
    return stat, int(keep.sum()) - 1


def chi_square_limit(dof: int) -> float:
    # Mean + 6 standard deviations of a chi-square with `dof` degrees of freedom: a correct
    # sampler passes with a fixed seed, a wrong exponent or an off-by-one rank does not.
    return dof + 6 * math.sqrt(2 * dof)


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize(("num_rows", "exact_head"), [(60, 1024), (60, 4), (2000, 16)])
def test_empirical_frequencies_match_exact_probabilities(alpha, num_rows, exact_head):
    rng = np.random.default_rng(1234)
    ranks = ZipfSampler(num_rows, alpha, exact_head).sample(rng, 200_000)
    counts = np.bincount(ranks, minlength=num_rows)
    stat, dof = chi_square(counts, exact_zipf(num_rows, alpha))
    assert stat < chi_square_limit(dof), (stat, dof)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_chi_square_detects_a_different_exponent(alpha):
    # The same bound must reject draws of a neighbouring exponent, or the test above proves
    # nothing.
    rng = np.random.default_rng(99)
    ranks = ZipfSampler(60, alpha + 0.1, 4).sample(rng, 200_000)
    stat, dof = chi_square(np.bincount(ranks, minlength=60), exact_zipf(60, alpha))
    assert stat > chi_square_limit(dof)


@pytest.mark.parametrize("alpha", [0.0, *ALPHAS, 3.0])
@pytest.mark.parametrize("num_rows", [1, 2, 9, 500, 20_000])
@pytest.mark.parametrize("exact_head", [1, 3, 1024])
def test_sampler_probabilities_within_documented_bound(alpha, num_rows, exact_head):
    sampler = ZipfSampler(num_rows, alpha, exact_head)
    ranks = np.arange(num_rows)
    used = sampler.probabilities(ranks)
    exact = exact_zipf(num_rows, alpha)
    bound = sampler.relative_error_bound
    assert used.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.all(used / exact <= 1 + bound + 1e-12)
    assert np.all(used / exact >= 1 / (1 + bound) - 1e-12)
    if num_rows <= exact_head:
        np.testing.assert_allclose(used, exact, rtol=1e-12)


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0, 4.0])
@pytest.mark.parametrize("exact_head", [8, 1024])
def test_error_bound_matches_euler_maclaurin_leading_term(alpha, exact_head):
    k = exact_head + 1
    leading = alpha * (alpha + 1) / (24 * k**2)
    bound = ZipfSampler(10**6, alpha, exact_head).relative_error_bound
    assert bound == pytest.approx(leading, rel=(alpha + 2) * (alpha + 3) / (10 * k**2) + 1e-6)


def test_uniform_when_alpha_is_zero():
    rng = np.random.default_rng(5)
    ranks = ZipfSampler(40, 0.0, 4).sample(rng, 100_000)
    stat, dof = chi_square(np.bincount(ranks, minlength=40), np.full(40, 1 / 40))
    assert stat < chi_square_limit(dof)


def test_huge_table_is_fast_and_small():
    rng = np.random.default_rng(0)
    n, num_rows = 200_000, 10**9
    tracemalloc.start()
    start = time.perf_counter()
    keys = zipf_keys(rng, n, num_rows, 1.05)
    elapsed = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert keys.dtype == np.int64 and keys.shape == (n,)
    assert keys.min() >= 0 and keys.max() < num_rows
    assert elapsed < 2.0
    assert peak < 40 * n * 8  # a few arrays of n, nothing of num_rows


@pytest.mark.parametrize("alpha", [0.5, 1.05, 2.0])
def test_huge_table_rank_masses_follow_zipf(alpha):
    # Ranks far in the tail (where no exact table exists) must carry the right mass: compare
    # the share of ranks below several cut-offs with exact partial sums computed directly.
    num_rows, n = 10**9, 400_000
    ranks = ZipfSampler(num_rows, alpha).sample(np.random.default_rng(7), n)
    cuts = np.array([10, 5_000, 2_000_000])
    big = 3_000_000  # exact partial sums of the head, plus a tail integral computed separately
    head = np.arange(1, big + 1, dtype=np.float64) ** -alpha
    tail = (
        math.log((num_rows + 0.5) / (big + 0.5))
        if alpha == 1.0
        else ((num_rows + 0.5) ** (1 - alpha) - (big + 0.5) ** (1 - alpha)) / (1 - alpha)
    )
    total = head.sum() + tail
    for cut in cuts:
        p = head[:cut].sum() / total
        share = (ranks < cut).mean()
        assert abs(share - p) < 6 * math.sqrt(p * (1 - p) / n), (cut, share, p)


def test_same_seed_same_keys_and_permutation_is_stable():
    a = zipf_keys(np.random.default_rng(3), 1000, 12345, 1.2, permutation_seed=4)
    b = zipf_keys(np.random.default_rng(3), 1000, 12345, 1.2, permutation_seed=4)
    c = zipf_keys(np.random.default_rng(3), 1000, 12345, 1.2, permutation_seed=5)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_unpermuted_keys_are_ranks_plus_offset():
    plain = zipf_keys(np.random.default_rng(2), 500, 300, 1.1, key_offset=1000, permute=False)
    ranks = ZipfSampler(300, 1.1).sample(np.random.default_rng(2), 500)
    np.testing.assert_array_equal(plain, ranks + 1000)


def test_permuted_keys_follow_rank_frequencies():
    num_rows, alpha = 200, 1.05
    keys = zipf_keys(np.random.default_rng(11), 300_000, num_rows, alpha, key_offset=-50)
    key_of_rank = permute_ranks(np.arange(num_rows), num_rows) - 50
    counts_by_key = np.bincount(keys + 50, minlength=num_rows)
    counts_by_rank = counts_by_key[key_of_rank + 50]
    stat, dof = chi_square(counts_by_rank, exact_zipf(num_rows, alpha))
    assert stat < chi_square_limit(dof)


def test_uniform_keys_range_and_frequencies():
    keys = uniform_keys(np.random.default_rng(8), 100_000, 37, key_offset=2**40)
    assert keys.dtype == np.int64
    counts = np.bincount(keys - 2**40, minlength=37)
    assert counts.size == 37
    stat, dof = chi_square(counts, np.full(37, 1 / 37))
    assert stat < chi_square_limit(dof)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_rows": 0}, "num_rows must be >= 1"),
        ({"num_rows": 1e9}, "num_rows must be an integer"),
        ({"alpha": -0.5}, "alpha must be finite and >= 0"),
        ({"alpha": float("nan")}, "alpha must be finite"),
        ({"n": -1}, "n must be >= 0"),
        ({"key_offset": 2**63 - 5}, "does not fit in int64"),
        ({"exact_head": 0}, "exact_head must be >= 1"),
    ],
)
def test_bad_arguments_name_the_parameter(kwargs, message):
    args = {"n": 10, "num_rows": 100, "alpha": 1.0} | kwargs
    with pytest.raises(ValueError, match=message):
        zipf_keys(np.random.default_rng(0), **args)


def test_uniform_keys_bad_arguments():
    with pytest.raises(ValueError, match="num_rows must be >= 1"):
        uniform_keys(np.random.default_rng(0), 3, 0)
    with pytest.raises(ValueError, match="key_offset"):
        uniform_keys(np.random.default_rng(0), 3, 10, key_offset=2**63 - 2)


def test_probabilities_reject_out_of_range_ranks():
    with pytest.raises(ValueError, match=r"ranks must lie in \[0, 10\)"):
        ZipfSampler(10, 1.0).probabilities(np.array([10]))
