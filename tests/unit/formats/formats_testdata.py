"""Random tables with awkward keys shared by the sparse-table and Parquet tests."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

INT64_MIN = int(np.iinfo(np.int64).min)
INT64_MAX = int(np.iinfo(np.int64).max)
# Keys a careless implementation gets wrong: signs, zero, the int64 extremes.
EXTREME_KEYS = (INT64_MIN, INT64_MIN + 1, -1, 0, 1, INT64_MAX - 1, INT64_MAX)

RandomTable = Callable[[int, int], tuple[np.ndarray, np.ndarray]]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20240601)


@pytest.fixture
def random_table(rng: np.random.Generator) -> RandomTable:
    """Return ``make(rows, dim) -> (keys, vectors)`` with unique keys over the whole int64
    range (extremes first, as many as fit) and float32 vectors of mixed magnitudes."""

    def make(rows: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
        extremes = np.array(EXTREME_KEYS[:rows], dtype=np.int64)
        pool = rng.integers(INT64_MIN, INT64_MAX, size=2 * rows + 8, dtype=np.int64, endpoint=True)
        pool = pool[~np.isin(pool, extremes)]
        _, first = np.unique(pool, return_index=True)
        others = pool[np.sort(first)][: rows - extremes.size]
        keys = rng.permutation(np.concatenate([extremes, others]))
        vectors = rng.standard_normal((rows, dim)) * 10.0 ** rng.integers(-3, 4, (rows, 1))
        return keys, vectors.astype(np.float32)

    return make
