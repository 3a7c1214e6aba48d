"""Pooling of variable-hotness bags on the CPU: ``pool_embeddings`` (NumPy) against the one
scatter per key (``np.add.at``) it used before, on the same random CSR batches, checked equal.

Prints a table of medians and writes ``cpu_pooling.csv`` to ``--out``.

Usage:
    python benchmarks/cpu_pooling.py --out /tmp/pool
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from pathlib import Path

import numpy as np
from result_table import write_results

from hps_core.nn import Combiner, pool_embeddings

CASES = ((26 * 1024, 16, 4), (26 * 4096, 128, 4), (26 * 4096, 128, 39))
"""(bags, dim, most keys per bag): bags hold 0 to that many keys, uniformly."""


def scatter(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    pooled = np.zeros((len(offsets) - 1, values.shape[1]), np.float32)
    segment = np.searchsorted(offsets[1:], np.arange(len(values)), side="right")
    np.add.at(pooled, segment, values)
    return pooled


def median_s(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = []
    for bags, dim, most in CASES:
        counts = rng.integers(0, most + 1, bags)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        values = rng.standard_normal((int(offsets[-1]), dim)).astype(np.float32)
        ours = pool_embeddings(np, values, offsets, 26, Combiner.SUM).reshape(bags, dim)
        np.testing.assert_array_equal(ours, scatter(values, offsets))
        before = median_s(functools.partial(scatter, values, offsets), args.runs)
        ours_fn = functools.partial(pool_embeddings, np, values, offsets, 26, Combiner.SUM)
        now = median_s(ours_fn, args.runs)
        rows.append({"bags": bags, "dim": dim, "keys": int(offsets[-1]), "most_keys": most,
                     "scatter_ms": 1e3 * before, "pool_embeddings_ms": 1e3 * now,
                     "speedup": before / now})  # fmt: skip
    print(f"medians of {args.runs}, one thread")
    write_results(args.out / "cpu_pooling.csv", list(rows[0]), rows)


if __name__ == "__main__":
    main()
