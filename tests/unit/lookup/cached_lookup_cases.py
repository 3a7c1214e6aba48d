"""Cases of the cached lookup pipeline, run with the NumPy twin here and CuPy in tests/gpu.

Every case builds a host table from random rows, puts a cache of the given array module in
front of it, and checks each answer against a dict built from the rows, whatever the cache
holds: the cache may change speed, never values.
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
from hps_core.lookup import CachedTableLookup
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


def run_stream(
    xp: Any,
    folder: Path,
    *,
    rows: int = 5000,
    dim: int = 8,
    cache_share: float = 0.2,
    threshold: float = 0.9,
    policy: str = "fetch",
    kind: str = "dynamic",
    batches: int = 30,
    batch: int = 700,
    seed: int = 0,
    keys_on_device: bool = True,
) -> CachedTableLookup:
    """Run a stream through a cached lookup; assert every answer; return the lookup."""
    host, reference = make_host(folder, rows, dim, seed)
    if kind == "static":
        cache = make_cache(
            "static", rows, dim, xp, contents=tuple(map(xp.asarray, host.contents()))
        )
    else:
        cache = dynamic_cache(int(cache_share * rows), dim, xp)
    lookup = CachedTableLookup(host, cache, xp, threshold, policy, name="t")
    for q in query_stream(reference, batches, batch, seed + 1):
        out = xp.full((len(q), dim), np.nan, xp.float32)  # poisoned: every row must be written
        got = lookup.lookup(xp.asarray(q) if keys_on_device else q, out=out)
        assert got is out
        got = got.get() if hasattr(got, "get") else got
        want = expected(reference, q, dim)
        if policy == "default":
            # HugeCTR's mode: a miss of an asynchronous batch may get the default vector.
            exact = (got == want).all(axis=1)
            defaulted = (got == DEFAULT).all(axis=1)
            assert (exact | defaulted).all()
        else:
            np.testing.assert_array_equal(got, want)
    lookup.flush()
    return lookup
