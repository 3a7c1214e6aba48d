"""Bytes and lookup rate of Redis and RocksDB holding a table in HugeCTR's FP32 layout and,
with ``store_compressed``, in each storage precision (:mod:`hps_core.tiers.encoded_rows`).

For each ``--dims`` value and precision: one sparse table of ``--rows`` rows is loaded into a
Redis cluster of ``--nodes`` local ``redis-server`` primaries (``tests/redis_cluster.py``) and
into a RocksDB database in a temporary folder, the way serving loads them (fp32: FP32
vectors; the others: their stored rows). Measured: the cluster's ``used_memory`` growth (all
nodes, ``INFO memory``), RocksDB's folder once closed (flushed), the load time,
and the median time of ``--runs`` lookups of ``--batch`` keys (all stored) answering the
stored rows, as the GPU pipeline asks for them. Every answer is checked against the
quantiser. Prints a table, writes ``lower_tier_storage.csv`` to ``--out``. Servers and folders
are removed at the end, also on failure.

Usage:
    python benchmarks/lower_tier_storage.py --rows 200000 --dims 16,128 --out /tmp/lts
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from result_table import write_results

from hps_core.config import DatabaseType, PersistentDBConfig, VolatileDBConfig
from hps_core.footprint import payload_bytes
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.quant import RowFormat, StoragePrecision
from hps_core.tiers.encoded_rows import EncodedRows, encoded_tag
from hps_core.tiers.redis_store import RedisClusterStore
from hps_core.tiers.rocks_store import RocksStore

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the cluster helper lives with the tests
from redis_cluster import RedisCluster  # noqa: E402

PRECISIONS = ("fp32", "fp16", "int8", "fp8")


def used_memory(cluster: RedisCluster) -> int:
    """Bytes the cluster's primaries use (``INFO memory`` ``used_memory``, summed)."""
    total = 0
    for port in cluster.processes:
        info = cluster.cli(port, "INFO", "memory")
        line = next(line for line in info.splitlines() if line.startswith("used_memory:"))
        total += int(line.split(":")[1])
    return total


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def rows_store(store: object, precision: StoragePrecision, tag: str) -> tuple[object, str]:
    """What serving reads and writes the table through, and its name (see factory)."""
    if precision is StoragePrecision.FP32:
        return store, tag
    return EncodedRows(store, precision), encoded_tag(tag, precision)


def lookup_stored(rows: object, name: str, keys: np.ndarray, fmt: RowFormat) -> np.ndarray:
    if fmt.is_identity:
        values, found = rows.lookup(name, keys, fmt.dim)
    else:
        values, found = rows.lookup_stored(name, keys, fmt.dim)
    assert found.all()
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dims", default="16,128")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    tmp = Path(tempfile.mkdtemp(prefix="hps-lts-"))
    cluster = RedisCluster(nodes=args.nodes).start()
    results = []
    try:
        for dim in (int(d) for d in args.dims.split(",")):
            keys = rng.choice(2**62, args.rows, replace=False).astype(np.int64)
            vectors = rng.standard_normal((args.rows, dim)).astype(np.float32)
            folder = tmp / f"t{dim}"
            write_sparse_table(folder, keys, vectors)
            for name in PRECISIONS:
                precision = StoragePrecision.parse(name)
                fmt = RowFormat(precision, dim)
                want = fmt.encode_stored(vectors) if not fmt.is_identity else vectors
                tag = f"hps_et.bench{dim}.t0"
                row: dict[str, object] = {"dim": dim, "precision": name, "rows": args.rows}
                before = used_memory(cluster)
                redis_config = VolatileDBConfig(
                    type=DatabaseType.REDIS_CLUSTER, address=cluster.address, num_partitions=8
                )
                redis = RedisClusterStore(redis_config)
                rocks_path = tmp / f"rocks_{dim}_{name}"
                rocks = RocksStore(
                    PersistentDBConfig(type=DatabaseType.ROCKS_DB, path=rocks_path, num_threads=2)
                )
                try:
                    for label, store in (("redis", redis), ("rocksdb", rocks)):
                        target, table = rows_store(store, precision, tag)
                        start = time.perf_counter()
                        target.load_sparse(table, folder, dim)
                        row[f"{label}_load_s"] = time.perf_counter() - start
                        times = []
                        for _ in range(args.runs):
                            pick = rng.integers(0, args.rows, args.batch)
                            start = time.perf_counter()
                            got = lookup_stored(target, table, keys[pick], fmt)
                            times.append(time.perf_counter() - start)
                            np.testing.assert_array_equal(got, want[pick])
                        row[f"{label}_keys_per_s"] = args.batch / statistics.median(times)
                    row["redis_bytes"] = used_memory(cluster) - before
                    row["payload_bytes"] = payload_bytes(args.rows, dim, precision)
                    redis.evict(table)  # the name both stores hold the table under
                finally:
                    redis.close()
                    rocks.close()  # flushes: the folder then holds the table's files
                row["rocksdb_bytes"] = folder_bytes(rocks_path)
                results.append(row)
        fp32 = {r["dim"]: r for r in results if r["precision"] == "fp32"}
        for r in results:
            base = fp32[r["dim"]]
            r["redis_x_fp32"] = r["redis_bytes"] / base["redis_bytes"]
            r["rocksdb_x_fp32"] = r["rocksdb_bytes"] / base["rocksdb_bytes"]
        columns = ["dim", "precision", "rows", "payload_bytes", "redis_bytes", "redis_x_fp32",
                   "rocksdb_bytes", "rocksdb_x_fp32", "redis_load_s", "rocksdb_load_s",
                   "redis_keys_per_s", "rocksdb_keys_per_s"]  # fmt: skip
        print(f"{args.rows:,} rows per table, {args.nodes}-node Redis cluster, lookups of "
              f"{args.batch:,} stored keys, medians of {args.runs}")  # fmt: skip
        write_results(args.out / "lower_tier_storage.csv", columns, results)
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
