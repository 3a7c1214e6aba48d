"""Helpers of the tests of tables with a cache in front of their host tier, run with the
NumPy twin of the GPU cache here and CuPy in tests/gpu: a host table of random rows, its dict
reference, the answers a lookup must give, and Zipf-skewed query batches. Answers are checked
against the dict, whatever a cache holds: a cache may change speed, never values.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cache"))
from cache_twin import NumpyDynamicCache

from hps_core.cache import make_cache, num_sets_for
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.tiers.host_table import SharedHostTable
from hps_core.workload import zipf_keys

DEFAULT = -0.5


def dynamic_cache(rows: int, dim: int, xp: Any, name: str = "cache") -> Any:
    """A dynamic cache of ``rows`` rows: the CUDA cache for CuPy, its NumPy twin for NumPy."""
    if xp is np:
        return NumpyDynamicCache(num_sets_for(rows), dim, name=name)
    return make_cache("dynamic", rows, dim, xp, name=name)


def make_host(folder: Path, rows: int, dim: int, seed: int) -> tuple[SharedHostTable, dict]:
    """A host table of random keys (negatives included) and its dict reference."""
    rng = np.random.default_rng(seed)
    keys = rng.choice(np.arange(-(10**9), 10**9, 3), rows, replace=False).astype(np.int64)
    vectors = rng.standard_normal((rows, dim)).astype(np.float32)
    write_sparse_table(folder, keys, vectors)
    return SharedHostTable(folder, dim, DEFAULT), dict(zip(keys.tolist(), vectors, strict=True))


def expected(reference: dict, queries: np.ndarray, dim: int) -> np.ndarray:
    """What a lookup of ``queries`` must return."""
    out = np.full((len(queries), dim), DEFAULT, np.float32)
    for i, key in enumerate(queries.tolist()):
        if key in reference:
            out[i] = reference[key]
    return out


def query_stream(
    reference: dict, batches: int, batch: int, seed: int, unknown_share: float = 0.05
) -> list[np.ndarray]:
    """Zipf-skewed batches over the table's keys, with a few keys the table lacks."""
    rng = np.random.default_rng(seed)
    keys = np.fromiter(reference, np.int64, len(reference))
    stream = []
    for _ in range(batches):
        ranks = zipf_keys(rng, batch, len(keys), alpha=1.05)
        q = keys[ranks]
        lacking = rng.random(batch) < unknown_share
        q[lacking] = 1 + 3 * rng.integers(0, 10**6, int(lacking.sum()))  # never a multiple of 3
        stream.append(q)
    return stream
