"""Lookup rate of the tiers on the same keys: a plain Python dict, the shared host tier
(``SharedHostTable``), RocksDB (``RocksStore``) and a Redis cluster (``RedisClusterStore``).

For each ``--dims`` value: writes one sparse table (``--rows`` x dim), loads it into each tier
(the host tier's segment in a private folder under /dev/shm, RocksDB in a temporary folder,
the Redis cluster of ``--nodes`` local ``redis-server`` primaries started by
``tests/redis_cluster.py``), then looks up ``--runs`` batches of ``--batch`` keys
(``--hit-rate`` of them stored, the rest unknown) in each tier, checking that every tier
returns the dict's vectors. Prints a table of medians and writes
``benchmarks/results/tier_lookup_<commit>.csv``. Servers, temporary folders and shared-memory
segments are removed at the end, also on failure.

Usage:
    python benchmarks/redis_cluster_lookup.py --rows 200000 --dims 16 128 --runs 5
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hps_core.config import DatabaseType, PersistentDBConfig, VolatileDBConfig
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.tiers.redis_store import RedisClusterStore
from hps_core.tiers.rocks_store import RocksStore

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the cluster helper lives with the tests
from redis_cluster import RedisCluster  # noqa: E402

Lookup = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
TABLE = "hps_et.bench.t0"


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


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def bench_dim(
    args: argparse.Namespace, dim: int, cluster: RedisCluster, tmp: Path, rng: np.random.Generator
) -> list[tuple[object, ...]]:
    from hps_core.tiers.host_table import SharedHostTable  # reads HPS_SHM_DIR when used

    keys = rng.permutation(args.rows * 4)[: args.rows].astype(np.int64)
    vectors = rng.random((args.rows, dim), dtype=np.float32)
    folder = tmp / f"sparse_{dim}"
    write_sparse_table(folder, keys, vectors)
    loads: dict[str, float] = {}
    lookups: dict[str, Lookup] = {}
    closers: list[Callable[[], None]] = []
    try:
        table: dict[int, np.ndarray] = {}
        loads["dict"] = timed(lambda: table.update(zip(keys.tolist(), vectors, strict=True)))
        lookups["dict"] = lambda q: dict_lookup(table, q, dim)

        started = time.perf_counter()
        host = SharedHostTable(folder, dim)
        loads["host_tier"] = time.perf_counter() - started
        closers.append(host.close)
        lookups["host_tier"] = host.lookup

        rocks = RocksStore(
            PersistentDBConfig(
                type=DatabaseType.ROCKS_DB, path=tmp / f"rocks_{dim}",
                max_batch_size=args.max_batch_size,
            )
        )  # fmt: skip
        closers.append(rocks.close)
        loads["rocksdb"] = timed(lambda: rocks.load_sparse(TABLE, folder, dim))
        lookups["rocksdb"] = lambda q: rocks.lookup(TABLE, q, dim)

        redis = RedisClusterStore(
            VolatileDBConfig(
                type=DatabaseType.REDIS_CLUSTER, address=cluster.address,
                num_partitions=args.num_partitions, max_batch_size=args.max_batch_size,
            )
        )  # fmt: skip
        closers.append(redis.close)
        loads["redis_cluster"] = timed(lambda: redis.load_sparse(TABLE, folder, dim))
        lookups["redis_cluster"] = lambda q: redis.lookup(TABLE, q, dim)

        times: dict[str, list[float]] = {name: [] for name in lookups}
        for _ in range(args.runs + 1):  # the first round warms caches and connections
            hits = int(args.batch * args.hit_rate)
            unknown = rng.integers(-(10**12), 0, args.batch - hits)  # stored keys are >= 0
            batch = rng.permutation(np.concatenate([rng.choice(keys, hits), unknown]))
            want, want_found = lookups["dict"](batch)
            for name, lookup in lookups.items():
                started = time.perf_counter()
                got, found = lookup(batch)
                times[name].append(time.perf_counter() - started)
                if not (np.array_equal(found, want_found) and np.array_equal(got, want)):
                    raise SystemExit(f"{name} and the dict disagree at dim {dim}")
        redis.evict(TABLE)
        assert redis.errors == 0, "the Redis cluster reported errors"
    finally:
        for close in reversed(closers):
            close()
    results = []
    for name, samples in times.items():
        seconds = statistics.median(samples[1:])
        results.append((name, args.rows, dim, args.batch, args.hit_rate, args.runs,
                        round(loads[name], 3), round(1e3 * seconds, 2),
                        round(args.batch / seconds)))  # fmt: skip
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dims", type=int, nargs="+", default=[16, 128])
    parser.add_argument("--batch", type=int, default=16_384)
    parser.add_argument("--hit-rate", type=float, default=0.9)
    parser.add_argument("--max-batch-size", type=int, default=65_536, help="both databases")
    parser.add_argument("--num-partitions", type=int, default=16, help="Redis partitions")
    parser.add_argument("--nodes", type=int, default=3, help="Redis primaries")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    rng = np.random.default_rng(0)
    results = []
    tmp = Path(tempfile.mkdtemp(prefix="hps-tier-bench-"))
    shm = Path(tempfile.mkdtemp(prefix="hps-tier-bench-", dir="/dev/shm"))
    os.environ["HPS_SHM_DIR"] = str(shm)  # every segment in one folder, removed at the end
    cluster = RedisCluster(nodes=args.nodes).start()
    try:
        for dim in args.dims:
            results += bench_dim(args, dim, cluster, tmp, rng)
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    print(
        f"{args.rows:,} rows; batches of {args.batch:,} keys, hit rate {args.hit_rate}; medians "
        f"of {args.runs} runs; Redis: {args.nodes} local primaries, {args.num_partitions} "
        f"partitions; {os.cpu_count()} CPU cores; commit {commit}"
    )
    print(f"{'tier':14s} {'dim':>4s} {'load s':>8s} {'lookup ms':>10s} {'keys/s':>12s}")
    for name, _, dim, _, _, _, load, ms, rate in results:
        print(f"{name:14s} {dim:4d} {load:8.2f} {ms:10.2f} {rate:12,.0f}")
    path = args.out / f"tier_lookup_{commit}.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["tier", "rows", "dim", "batch", "hit_rate", "runs", "load_s",
                         "lookup_ms", "keys_per_s"])  # fmt: skip
        writer.writerows(results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
