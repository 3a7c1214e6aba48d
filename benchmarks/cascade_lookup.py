"""Host-side lookup rate of a table through the tier cascade (``hps_core.tiers.cascade``).

For each ``--dims`` value, writes one sparse table of ``--rows`` rows and opens it as a CPU
instance does (``ModelLookup`` without a GPU, i.e. ``HostTableLookup``) under three setups:

- ``shared``: ``initial_cache_rate`` 1.0 and no persistent tier: today's path, the
  :class:`SharedHostTable` alone;
- ``cascade``: ``initial_cache_rate`` ``--rate`` (0.3) in the shared tier, every row in RocksDB;
- ``dict``: a Python dict key -> row of the same table (baseline, same batches).

Each setup looks up the same ``--runs`` batches of ``--batch`` uniformly drawn keys
(``--hit-rate`` of them in the table), after one warm-up batch, and every answer is checked
against the dict. Prints a table of median keys/s and writes
``benchmarks/results/cascade_lookup_<short commit>.csv``.

Usage:
    python benchmarks/cascade_lookup.py --rows 1000000 --dims 16 128 --runs 5
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from hps_core.config import parse_ps_config
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.lookup import ModelLookup


def dict_lookup(
    table: dict[int, int], vectors: np.ndarray, keys: np.ndarray, default: float
) -> np.ndarray:
    """The dict baseline: one Python dict probe per key, rows gathered with NumPy."""
    rows = np.fromiter((table.get(k, -1) for k in keys.tolist()), np.int64, len(keys))
    out = vectors[np.maximum(rows, 0)]
    out[rows < 0] = default
    return out


def ps_config(root: Path, dim: int, rate: float, rocks: bool) -> object:
    ps: dict = {
        "supportlonglong": True,
        "volatile_db": {"type": "hash_map", "initial_cache_rate": rate},
        "models": [
            {
                "model": "bench",
                "sparse_files": ["table"],
                "deployed_device_list": [0],
                "default_value_for_each_table": [0.0],
                "maxnum_catfeature_query_per_table_per_sample": [1],
                "embedding_vecsize_per_table": [dim],
            }
        ],
    }
    if rocks:
        ps["persistent_db"] = {"type": "rocks_db", "path": str(root / "db")}
    return parse_ps_config(ps, root)


def short_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dims", type=int, nargs="+", default=[16, 128])
    parser.add_argument("--rate", type=float, default=0.3)
    parser.add_argument("--batch", type=int, default=65536)
    parser.add_argument("--hit-rate", type=float, default=0.95)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    results = []
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("HPS_SHM_DIR", str(Path(tmp) / "shm"))
        for dim in args.dims:
            root = Path(tmp) / f"d{dim}"
            keys = rng.permutation(args.rows * 4)[: args.rows].astype(np.int64)
            vectors = rng.random((args.rows, dim), dtype=np.float32)
            write_sparse_table(root / "table", keys, vectors)
            reference = {k: i for i, k in enumerate(keys.tolist())}
            batches = []
            for _ in range(args.runs + 1):
                q = rng.choice(keys, args.batch)
                unknown = rng.random(args.batch) >= args.hit_rate
                q[unknown] = -1 - rng.integers(0, 10**9, int(unknown.sum()))
                batches.append(q)
            wants = [dict_lookup(reference, vectors, q, 0.0) for q in batches]
            setups = {
                "shared (rate 1.0)": (1.0, False),
                f"cascade (rate {args.rate} + RocksDB)": (args.rate, True),
            }
            for name, (rate, rocks) in setups.items():
                cfg = ps_config(root, dim, rate, rocks)
                started = time.perf_counter()
                lookup = ModelLookup(cfg, cfg.models[0])
                lookup.open_all()
                open_s = time.perf_counter() - started
                rates = []
                for i, (q, want) in enumerate(zip(batches, wants, strict=True)):
                    t0 = time.perf_counter()
                    got = lookup.lookup(0, q)
                    elapsed = time.perf_counter() - t0
                    np.testing.assert_array_equal(got, want)
                    if i:  # the first batch warms caches and page tables
                        rates.append(len(q) / elapsed)
                c = lookup.counters()[0]
                tiers = f"host {c.tier_host_hits} rocks {c.tier_rocks_db_hits}"
                lookup.close()
                results.append((name, dim, statistics.median(rates), open_s, tiers))
            rates = []
            for i, (q, want) in enumerate(zip(batches, wants, strict=True)):
                t0 = time.perf_counter()
                got = dict_lookup(reference, vectors, q, 0.0)
                elapsed = time.perf_counter() - t0
                np.testing.assert_array_equal(got, want)
                if i:
                    rates.append(len(q) / elapsed)
            results.append(("dict", dim, statistics.median(rates), 0.0, ""))
    commit = short_commit()
    print(
        f"cascade lookup: {args.rows} rows, batch {args.batch}, hit rate {args.hit_rate}, "
        f"median of {args.runs} runs, {machine}, commit {commit}"
    )
    print(f"{'setup':<32} {'dim':>4} {'keys/s':>12} {'open s':>8}  tier hits")
    for name, dim, rate, open_s, tiers in results:
        print(f"{name:<32} {dim:>4} {rate:>12,.0f} {open_s:>8.2f}  {tiers}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"cascade_lookup_{commit}.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            ["setup", "dim", "rows", "batch", "hit_rate", "runs", "keys_per_s", "open_s",
             "machine", "commit"]
        )  # fmt: skip
        for name, dim, rate, open_s, _ in results:
            writer.writerow(
                [name, dim, args.rows, args.batch, args.hit_rate, args.runs, f"{rate:.0f}",
                 f"{open_s:.3f}", machine, commit]
            )  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
