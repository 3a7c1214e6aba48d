"""The RocksDB tier (``hps_core.tiers.rocks_store``) against a plain Python dict of the same
rows: load time of a sparse table and lookup rate of batches of random keys.

Writes one sparse table (``--rows`` x ``--dim``), loads it into a fresh RocksDB database in a
temporary folder (``RocksStore.load_sparse``) and into a dict (key -> vector row), then looks
up ``--runs`` batches of ``--batch`` keys (``--hit-rate`` of them stored, the rest unknown) in
each, checking that both return the same vectors. Prints a table of medians and writes
``rocks_store_lookup.csv``.

Usage:
    python benchmarks/rocks_store_lookup.py --rows 1000000 --dim 32 --out $OUT
"""

from __future__ import annotations

import argparse
import csv
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from hps_core.config import DatabaseType, PersistentDBConfig
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.tiers.rocks_store import RocksStore


def dict_lookup(
    table: dict[int, np.ndarray], keys: np.ndarray, dim: int
) -> tuple[np.ndarray, np.ndarray]:
    out = np.zeros((len(keys), dim), np.float32)
    found = np.zeros(len(keys), bool)
    for i, key in enumerate(keys.tolist()):
        row = table.get(key)
        if row is not None:
            out[i], found[i] = row, True
    return out, found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--batch", type=int, default=65536)
    parser.add_argument("--hit-rate", type=float, default=0.9)
    parser.add_argument("--max-batch-size", type=int, default=65536)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    keys = rng.permutation(args.rows * 4)[: args.rows].astype(np.int64)
    vectors = rng.random((args.rows, args.dim), dtype=np.float32)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        write_sparse_table(Path(tmp) / "table", keys, vectors)
        config = PersistentDBConfig(
            type=DatabaseType.ROCKS_DB, path=Path(tmp) / "db", max_batch_size=args.max_batch_size
        )
        with RocksStore(config) as store:
            started = time.perf_counter()
            store.load_sparse("hps_et.bench.t", Path(tmp) / "table", args.dim)
            rocks_load = time.perf_counter() - started
            started = time.perf_counter()
            table = dict(zip(keys.tolist(), vectors, strict=True))
            dict_load = time.perf_counter() - started
            times: dict[str, list[float]] = {"rocksdb": [], "dict": []}
            for _ in range(args.runs):
                hits = int(args.batch * args.hit_rate)
                unknown = rng.integers(-(10**12), 0, args.batch - hits)  # keys are >= 0
                batch = rng.permutation(np.concatenate([rng.choice(keys, hits), unknown]))
                started = time.perf_counter()
                got, found = store.lookup("hps_et.bench.t", batch, args.dim)
                times["rocksdb"].append(time.perf_counter() - started)
                started = time.perf_counter()
                want, want_found = dict_lookup(table, batch, args.dim)
                times["dict"].append(time.perf_counter() - started)
                if not (np.array_equal(found, want_found) and np.array_equal(got, want)):
                    raise SystemExit("RocksDB and the dict disagree")
    for name, load in (("rocksdb", rocks_load), ("dict", dict_load)):
        seconds = statistics.median(times[name])
        results.append((name, args.rows, args.dim, args.batch, args.hit_rate, load,
                        1e3 * seconds, args.batch / seconds))  # fmt: skip
    print(f"{args.rows:,} rows x dim {args.dim}; batches of {args.batch:,} keys, hit rate "
          f"{args.hit_rate}; medians of {args.runs}")  # fmt: skip
    print(f"{'tier':8s} {'load s':>8s} {'lookup ms':>10s} {'keys/s':>12s}")
    for name, *_, load, ms, rate in results:
        print(f"{name:8s} {load:8.2f} {ms:10.1f} {rate:12,.0f}")
    path = args.out / "rocks_store_lookup.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["tier", "rows", "dim", "batch", "hit_rate", "load_s", "lookup_ms",
                         "keys_per_s"])  # fmt: skip
        writer.writerows(results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
