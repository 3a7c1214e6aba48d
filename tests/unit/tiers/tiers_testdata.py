"""Keys, queries and references shared by the tier tests (a uniquely named helper module)."""

from __future__ import annotations

from typing import Any

import numpy as np

INT64_MIN = int(np.iinfo(np.int64).min)
INT64_MAX = int(np.iinfo(np.int64).max)
# Keys a careless implementation gets wrong: signs, zero, the int64 extremes.
EXTREME_KEYS = (INT64_MIN, INT64_MIN + 1, -1, 0, 1, INT64_MAX - 1, INT64_MAX)
MASK64 = (1 << 64) - 1


def splitmix64_finalizer(key: int) -> int:
    """SplitMix64's output function on one Python int (Steele, Lea & Flood; Vigna's C code).

    Written with plain integers modulo 2**64, independent of the NumPy code under test.
    """
    z = key & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def wide_keys(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` unique int64 keys over the whole range, the extremes first (as many as fit)."""
    extremes = np.array(EXTREME_KEYS[:n], dtype=np.int64)
    pool = rng.integers(INT64_MIN, INT64_MAX, size=2 * n + 16, dtype=np.int64, endpoint=True)
    pool = pool[~np.isin(pool, extremes)]
    _, first = np.unique(pool, return_index=True)
    others = pool[np.sort(first)][: n - extremes.size]
    return rng.permutation(np.concatenate([extremes, others]))


def dense_keys(rng: np.random.Generator, n: int) -> np.ndarray:
    """The ids ``0..n-1`` in random order (the usual layout of a trained table)."""
    return rng.permutation(np.arange(n, dtype=np.int64))


def make_keys(rng: np.random.Generator, n: int, kind: str) -> np.ndarray:
    """Unique keys of ``kind`` ``"wide"`` or ``"dense"``."""
    return wide_keys(rng, n) if kind == "wide" else dense_keys(rng, n)


def mixed_queries(rng: np.random.Generator, keys: np.ndarray, n: int) -> np.ndarray:
    """About ``n`` queries: hits, misses (random, extremes, dense neighbours), duplicates."""
    parts = [np.array(EXTREME_KEYS, dtype=np.int64), np.array([len(keys), -2], np.int64)]
    if len(keys):
        parts.append(rng.choice(keys, size=n // 2))
    parts.append(rng.integers(INT64_MIN, INT64_MAX, size=n // 4, dtype=np.int64, endpoint=True))
    parts.append(rng.integers(-8, len(keys) + 8, size=n // 8, dtype=np.int64))
    queries = np.concatenate(parts)
    # Duplicates of hits and misses alike.
    queries = np.concatenate([queries, rng.choice(queries, size=len(queries) // 4)])
    return rng.permutation(queries)


def row_reference(keys: np.ndarray) -> dict[int, int]:
    """Python dict key -> file row, the reference every lookup is compared with."""
    return {k: i for i, k in enumerate(keys.tolist())}


def expected_rows(reference: dict[int, int], queries: np.ndarray) -> np.ndarray:
    """File row of each query by the dict reference, ``-1`` for absent keys."""
    return np.array([reference.get(q, -1) for q in queries.tolist()], dtype=np.int64)


def random_vectors(rng: np.random.Generator, rows: int, dim: int) -> np.ndarray:
    """float32 ``[rows, dim]`` of mixed magnitudes and signs."""
    scale = 10.0 ** rng.integers(-3, 4, (rows, 1))
    return (rng.standard_normal((rows, dim)) * scale).astype(np.float32)


def one_model_ps(dim: int = 4, default: float = 0.5, **sections: Any) -> dict[str, Any]:
    """A ps.json dict of model ``m`` with one table ``t0`` (``dim``, ``default``, sparse folder
    ``t0`` beside the ps.json) plus the given top-level sections."""
    return {
        "supportlonglong": True,
        **sections,
        "models": [
            {
                "model": "m",
                "sparse_files": ["t0"],
                "embedding_table_names": ["t0"],
                "deployed_device_list": [0],
                "default_value_for_each_table": [default],
                "maxnum_catfeature_query_per_table_per_sample": [2],
                "embedding_vecsize_per_table": [dim],
            }
        ],
    }
