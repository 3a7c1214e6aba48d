"""Key streams for benchmarks and perf_analyzer inputs: bounded Zipf and uniform keys.

Recommendation traffic is skewed: a few embedding rows receive most lookups, which is what
makes a GPU cache worth having. This module draws such streams reproducibly for any table
size, including tables of billions of rows, without materialising anything of the table's
size.

* :class:`ZipfSampler` draws ranks ``0..num_rows-1`` with ``P(r) ∝ 1/(r+1)**alpha`` for any
  ``alpha >= 0`` (NumPy's ``Generator.zipf`` needs ``alpha > 1`` and is unbounded). It inverts
  the CDF: an exact table for the first ``exact_head`` ranks and, for the rest, the integral
  of ``t**-alpha`` over ``[k - 1/2, k + 1/2]`` in place of ``k**-alpha`` (midpoint rule), which
  has a closed-form inverse. The error of that tail is bounded in
  :attr:`ZipfSampler.relative_error_bound`: about ``alpha*(alpha+1) / (24*(exact_head+1)**2)``,
  ``2.4e-7`` for ``alpha = 2`` and the default head of 1024.
* :func:`permute_ranks` maps ranks to keys through a fixed pseudo-random bijection of
  ``0..num_rows-1`` (a Feistel network with cycle walking), so that the hot keys are spread
  over the table instead of being its first rows. The mapping depends only on
  ``(num_rows, seed)``: every batch, process and run sees the same hot keys.
* :func:`zipf_top_k_mass` gives the share of lookups that fall on the ``k`` hottest ranks,
  i.e. the hit rate of an ideal cache of ``k`` rows.

Example:
    >>> rng = np.random.default_rng(0)
    >>> keys = zipf_keys(rng, 8, num_rows=1_000_000_000, alpha=1.05)
    >>> keys.dtype, keys.shape
    (dtype('int64'), (8,))
"""

from __future__ import annotations

import math
import operator

import numpy as np

from hps_core.hashing import mix64

#: Ranks whose probabilities the Zipf sampler tabulates exactly (see ZipfSampler).
DEFAULT_EXACT_HEAD = 1024

_INT64_MAX = 2**63 - 1
_FEISTEL_ROUNDS = 4


def _as_int(value: object, name: str, minimum: int) -> int:
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(
            f"{name} must be an integer, got {value!r} ({type(value).__name__})"
        ) from None
    if number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number}")
    return number


def _as_alpha(alpha: object) -> float:
    try:
        value = float(alpha)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"alpha must be a number, got {alpha!r}") from None
    if not math.isfinite(value) or value < 0.0:
        raise ValueError(f"alpha must be finite and >= 0, got {alpha!r}")
    return value


def _check_key_range(num_rows: int, key_offset: object) -> int:
    offset = _as_int(key_offset, "key_offset", -(2**63))
    if offset + num_rows - 1 > _INT64_MAX:
        raise ValueError(f"key_offset {offset} + num_rows {num_rows} - 1 does not fit in int64")
    return offset


def _power_integral(lo: np.ndarray | float, hi: np.ndarray | float, alpha: float) -> np.ndarray:
    """Integral of ``t**-alpha`` from ``lo`` to ``hi`` (``0 < lo <= hi``), elementwise.

    Written with ``log1p``/``expm1`` so that it stays accurate for ``alpha`` close to 1 and for
    short intervals far from the origin.
    """
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    log_ratio = np.log1p((hi - lo) / lo)
    b = 1.0 - alpha
    if b == 0.0:
        return log_ratio
    return lo**b * np.expm1(b * log_ratio) / b


def _power_integral_inverse(lo: float, mass: np.ndarray, alpha: float) -> np.ndarray:
    """The ``x >= lo`` with ``_power_integral(lo, x, alpha) == mass``, elementwise."""
    b = 1.0 - alpha
    if b == 0.0:
        return lo * np.exp(mass)
    # For alpha > 1 the integral to infinity is finite; rounding may push the argument of
    # log1p just below -1 for masses at that limit, which means "x is infinite".
    arg = np.maximum(b * mass * lo**-b, -1.0)
    with np.errstate(divide="ignore", over="ignore"):
        return lo * np.exp(np.log1p(arg) / b)


class ZipfSampler:
    """Inverse-CDF sampler of bounded Zipf ranks, for any exponent ``alpha >= 0``.

    Rank ``r`` (0-based, ``r < num_rows``) has weight ``w(r) = (r + 1)**-alpha``. The first
    ``exact_head`` ranks are drawn from an exact cumulative table. A rank ``k - 1`` past the
    head gets the weight ``∫_{k-1/2}^{k+1/2} t**-alpha dt`` instead of ``k**-alpha``; the
    tail's CDF then has a closed-form inverse, so nothing of the table's size is stored.

    Error: ``t**-alpha`` is convex, so the midpoint weight is never below the exact one and
    its relative excess, ``alpha*(alpha+1)/(24*k**2) + O(k**-4)``, shrinks with ``k``. Hence
    every probability the sampler uses is within a factor ``1 + e`` of the exact bounded-Zipf
    probability, with ``e`` = :attr:`relative_error_bound` (the excess at the first tail
    rank). ``alpha = 0`` gives the uniform distribution exactly. Tail ranks are computed in
    float64, so they are exact integers for any table of up to ``2**53`` rows.

    Args:
        num_rows: number of ranks (rows of the table), >= 1.
        alpha: Zipf exponent, finite and >= 0.
        exact_head: number of leading ranks tabulated exactly, >= 1.

    Example:
        >>> sampler = ZipfSampler(10**9, 0.8)
        >>> sampler.sample(np.random.default_rng(1), 3).max() < 10**9
        np.True_
    """

    def __init__(self, num_rows: int, alpha: float, exact_head: int = DEFAULT_EXACT_HEAD) -> None:
        self.num_rows = _as_int(num_rows, "num_rows", 1)
        self.alpha = _as_alpha(alpha)
        head = min(self.num_rows, _as_int(exact_head, "exact_head", 1))
        self._head_cdf = np.cumsum(np.arange(1, head + 1, dtype=np.float64) ** -self.alpha)
        self._head_mass = float(self._head_cdf[-1])
        # The tail covers 1-based ranks head+1 .. num_rows, i.e. t in [head+1/2, num_rows+1/2].
        self._tail_lo = head + 0.5
        self._tail_mass = float(_power_integral(self._tail_lo, self.num_rows + 0.5, self.alpha))
        self._total = self._head_mass + self._tail_mass

    @property
    def exact_head(self) -> int:
        """Number of leading ranks whose probabilities are exact."""
        return len(self._head_cdf)

    @property
    def relative_error_bound(self) -> float:
        """``e`` such that every rank's probability is within a factor ``1 + e`` of exact."""
        if self.num_rows == self.exact_head:
            return 0.0
        k = self.exact_head + 1
        midpoint_weight = _power_integral(k - 0.5, k + 0.5, self.alpha)
        return max(float(midpoint_weight) * k**self.alpha - 1.0, 0.0)

    def probabilities(self, ranks: np.ndarray) -> np.ndarray:
        """Probabilities with which :meth:`sample` draws the given ranks.

        Args:
            ranks: integer array of ranks in ``[0, num_rows)``.

        Returns:
            float64 array of the same shape.
        """
        ranks = np.asarray(ranks)
        if ranks.size and (ranks.min() < 0 or ranks.max() >= self.num_rows):
            raise ValueError(f"ranks must lie in [0, {self.num_rows})")
        k = ranks.astype(np.float64) + 1.0
        weights = np.empty(k.shape, dtype=np.float64)
        in_head = ranks < self.exact_head
        weights[in_head] = k[in_head] ** -self.alpha
        k_tail = k[~in_head]
        weights[~in_head] = _power_integral(k_tail - 0.5, k_tail + 0.5, self.alpha)
        return weights / self._total

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Draw ``n`` ranks.

        Args:
            rng: the random generator to draw from.
            n: number of ranks, >= 0.

        Returns:
            int64 array of ``n`` ranks in ``[0, num_rows)``; rank 0 is the most frequent.
        """
        n = _as_int(n, "n", 0)
        u = rng.random(n) * self._total
        ranks = np.empty(n, dtype=np.int64)
        in_head = u < self._head_mass
        head_ranks = np.searchsorted(self._head_cdf, u[in_head], side="right")
        ranks[in_head] = np.minimum(head_ranks, self.exact_head - 1)
        in_tail = ~in_head
        if in_tail.any():
            x = _power_integral_inverse(self._tail_lo, u[in_tail] - self._head_mass, self.alpha)
            # x in [k - 1/2, k + 1/2) selects the 1-based rank k.
            k = np.clip(np.floor(x + 0.5), self.exact_head + 1, self.num_rows)
            ranks[in_tail] = k.astype(np.int64) - 1
        return ranks


def _zipf_weight_sum(count: int, alpha: float) -> float:
    """``sum(j**-alpha for j in 1..count)``: exact head, Euler-Maclaurin for the rest."""
    head = min(count, DEFAULT_EXACT_HEAD)
    total = math.fsum(np.arange(1, head + 1, dtype=np.float64) ** -alpha)
    if count > head:
        lo, hi = head + 0.5, count + 0.5
        # Midpoint rule plus its first correction, -(f'(hi) - f'(lo)) / 24 with
        # f(t) = t**-alpha; the next term, 7/5760 * alpha(alpha+1)(alpha+2) * lo**(-alpha-3),
        # is below 1e-13 of the sum for any alpha and the 1024-rank exact head.
        total += float(_power_integral(lo, hi, alpha))
        total += alpha / 24.0 * (hi ** (-alpha - 1.0) - lo ** (-alpha - 1.0))
    return total


def zipf_top_k_mass(num_rows: int, alpha: float, k: int) -> float:
    """Share of bounded-Zipf draws that fall on the ``k`` most frequent ranks.

    This is the hit rate of a cache that holds exactly the ``k`` hottest rows (an upper
    bound for any real cache of ``k`` rows under this traffic).

    Args:
        num_rows: number of ranks, >= 1.
        alpha: Zipf exponent, finite and >= 0.
        k: cache size in rows; values above ``num_rows`` count as ``num_rows``.

    Returns:
        The probability mass of ranks ``0..k-1``, in ``[0, 1]``; relative error below 1e-12.

    Example:
        >>> round(zipf_top_k_mass(100, 0.0, 25), 6)
        0.25
    """
    num_rows = _as_int(num_rows, "num_rows", 1)
    alpha = _as_alpha(alpha)
    k = min(_as_int(k, "k", 0), num_rows)
    if k == 0:
        return 0.0
    if k == num_rows:
        return 1.0
    return _zipf_weight_sum(k, alpha) / _zipf_weight_sum(num_rows, alpha)


def _feistel_round_keys(seed: int) -> np.ndarray:
    base = mix64(np.array([seed], dtype=np.uint64))
    return mix64(base + np.arange(1, _FEISTEL_ROUNDS + 1, dtype=np.uint64))


def _feistel(values: np.ndarray, half_bits: int, round_keys: np.ndarray) -> np.ndarray:
    """One pass of a balanced Feistel network on ``2 * half_bits``-bit integers (bijective)."""
    half = np.uint64(half_bits)
    mask = np.uint64((1 << half_bits) - 1)
    drop = np.uint64(64 - half_bits)
    left = values >> half
    right = values & mask
    for key in round_keys:
        left, right = right, left ^ (mix64(right ^ key) >> drop)
    return (left << half) | right


def permute_ranks(ranks: np.ndarray, num_rows: int, seed: int = 0) -> np.ndarray:
    """Map ranks to keys through a fixed pseudo-random bijection of ``0..num_rows-1``.

    A 4-round Feistel network permutes the smallest even-width bit domain that holds
    ``num_rows`` values (at most ``4 * num_rows`` of them); values that land outside
    ``[0, num_rows)`` are passed through again (cycle walking) until they land inside, which
    restricts the permutation to ``[0, num_rows)`` and keeps it bijective. Expected passes
    per value: below 4. Memory: a few arrays of ``len(ranks)``.

    Args:
        ranks: integer array of ranks in ``[0, num_rows)``.
        num_rows: size of the domain, >= 1.
        seed: selects the permutation, >= 0; the same ``(num_rows, seed)`` always gives the
            same mapping.

    Returns:
        int64 array of keys, same shape as ``ranks``.

    Example:
        >>> sorted(permute_ranks(np.arange(5), 5).tolist())
        [0, 1, 2, 3, 4]
    """
    num_rows = _as_int(num_rows, "num_rows", 1)
    seed = _as_int(seed, "seed", 0)
    ranks = np.asarray(ranks)
    if not np.issubdtype(ranks.dtype, np.integer):
        raise ValueError(f"ranks must be integers, got dtype {ranks.dtype}")
    if ranks.size and (ranks.min() < 0 or ranks.max() >= num_rows):
        raise ValueError(f"ranks must lie in [0, {num_rows})")
    half_bits = max(1, ((num_rows - 1).bit_length() + 1) // 2)
    round_keys = _feistel_round_keys(seed)
    limit = np.uint64(num_rows)
    out = _feistel(ranks.astype(np.uint64).ravel(), half_bits, round_keys)
    pending = np.flatnonzero(out >= limit)
    while pending.size:
        out[pending] = _feistel(out[pending], half_bits, round_keys)
        pending = pending[out[pending] >= limit]
    return out.astype(np.int64).reshape(ranks.shape)


def zipf_keys(
    rng: np.random.Generator,
    n: int,
    num_rows: int,
    alpha: float,
    key_offset: int = 0,
    permute: bool = True,
    *,
    permutation_seed: int = 0,
    exact_head: int = DEFAULT_EXACT_HEAD,
) -> np.ndarray:
    """Draw ``n`` keys of a table of ``num_rows`` rows with bounded-Zipf popularity.

    Args:
        rng: the random generator to draw from.
        n: number of keys, >= 0.
        num_rows: rows of the table, >= 1; keys lie in
            ``[key_offset, key_offset + num_rows)``.
        alpha: Zipf exponent, finite and >= 0 (0 is uniform); see :class:`ZipfSampler`.
        key_offset: added to every key (e.g. a table's first key in a shared key space).
        permute: map ranks to keys through :func:`permute_ranks`; when False the hottest
            key is ``key_offset``, the next ``key_offset + 1``, and so on.
        permutation_seed: selects the rank-to-key bijection (use one per table).
        exact_head: see :class:`ZipfSampler`.

    Returns:
        int64 array of ``n`` keys.
    """
    sampler = ZipfSampler(num_rows, alpha, exact_head)
    offset = _check_key_range(sampler.num_rows, key_offset)
    ranks = sampler.sample(rng, n)
    keys = permute_ranks(ranks, sampler.num_rows, permutation_seed) if permute else ranks
    return keys + np.int64(offset)


def uniform_keys(
    rng: np.random.Generator, n: int, num_rows: int, key_offset: int = 0
) -> np.ndarray:
    """Draw ``n`` keys uniformly from ``[key_offset, key_offset + num_rows)``.

    Args:
        rng: the random generator to draw from.
        n: number of keys, >= 0.
        num_rows: rows of the table, >= 1.
        key_offset: added to every key.

    Returns:
        int64 array of ``n`` keys.
    """
    n = _as_int(n, "n", 0)
    num_rows = _as_int(num_rows, "num_rows", 1)
    offset = _check_key_range(num_rows, key_offset)
    return rng.integers(0, num_rows, size=n, dtype=np.int64) + np.int64(offset)
