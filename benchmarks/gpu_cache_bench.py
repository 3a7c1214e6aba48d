"""GPU embedding cache: query throughput and full-lookup throughput (needs CuPy and a GPU).

Setup (issue defaults): a table of ``--rows`` keys (10M) at ``--dim`` (128) in the shared host
tier; a dynamic cache of ``--cache-share`` (0.2) of the rows on the GPU; keys drawn from a Zipf
distribution (alpha ``--alpha``, 1.05) over the table's rows. The cache is first warmed by
``--warm-batches`` batches of 64K keys, as lookups leave it: each batch's distinct keys
queried, its misses read from the host tier and inserted. Then, per batch size:

- ``query``: ``cache.query(keys, out)`` alone (one kernel: hash, probe, copy hits), timed with
  CUDA events, once per synchronised call (latency) and over back-to-back calls
  (throughput); effective GB/s = batch x dim x 4 bytes returned / time.
- ``static``: the whole table in a static cache (hash probe + row copy, one kernel), queried
  back to back like ``query``.

Full GPU lookups (the cache bank's kernels, misses read over PCIe) are measured by
``benchmarks/large_table.py --lookups``.

Also measured in the same run: the device-to-device copy bandwidth (bytes read + written),
the ceiling the query is compared with. Prints a table; writes ``gpu_cache_bench.csv``.

Usage:
    python benchmarks/gpu_cache_bench.py --out $OUT
    python benchmarks/gpu_cache_bench.py --rows 1000000 --batches 4096,65536   # quicker
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import cupy
import numpy as np

from hps_core.cache import make_cache
from hps_core.formats.sparse_writer import SparseTableWriter
from hps_core.tiers.host_table import SharedHostTable
from hps_core.workload import zipf_keys


def copy_bandwidth(nbytes: int = 2**31, repeats: int = 20) -> float:
    """Device-to-device copy rate in GB/s, counting bytes read plus bytes written."""
    a = cupy.ones(nbytes // 4, cupy.float32)
    b = cupy.empty_like(a)
    times = []
    for _ in range(repeats + 3):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        cupy.copyto(b, a)
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return 2 * nbytes / statistics.median(times[3:]) / 1e9


def write_table(folder: Path, rows: int, dim: int, seed: int) -> None:
    """Keys 0..rows-1 with random vectors, written in chunks."""
    rng = np.random.default_rng(seed)
    chunk = 1 << 20
    with SparseTableWriter(folder) as writer:
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            keys = np.arange(start, start + n, dtype=np.int64)
            writer.append(keys, rng.random((n, dim), dtype=np.float32))


def time_query(cache, batches: list, repeats: int) -> tuple[float, float, float]:
    """Query timings: one synchronised call (median), back-to-back calls, and the hit rate.

    Back-to-back calls are what a loaded server issues: the host prepares the next launch
    while the GPU runs the current one, so the per-call host overhead is hidden.
    """
    out = cupy.empty((int(batches[0].shape[0]), cache.dim), cupy.float32)
    for keys in batches[:2]:
        cache.query(keys, out=out)  # warm-up: compile, allocate
    before = cache.stats()
    single = []
    for i in range(repeats):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        cache.query(batches[i % len(batches)], out=out)
        stop.record()
        stop.synchronize()
        single.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for i in range(repeats):
        cache.query(batches[i % len(batches)], out=out)
    stop.record()
    stop.synchronize()
    pipelined = cupy.cuda.get_elapsed_time(start, stop) / 1e3 / repeats
    after = cache.stats()
    hits = after.hits - before.hits
    return statistics.median(single), pipelined, hits / (hits + after.misses - before.misses)


def warm(cache, host: SharedHostTable, batches: list) -> None:
    """Fill ``cache`` as lookups of ``batches`` would: each batch's distinct keys queried,
    the misses read from the host tier and inserted."""
    for keys in batches:
        unique = cupy.unique(cupy.asarray(keys))
        _, hit = cache.query(unique)
        missed = cupy.asnumpy(unique[~hit])
        if len(missed):
            values, found = host.lookup(missed)
            cache.replace(missed[found], values[found])
    cupy.cuda.get_current_stream().synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--cache-share", type=float, default=0.2)
    parser.add_argument("--alpha", type=float, default=1.05)
    parser.add_argument("--batches", default="4096,16384,65536,262144,1048576")
    parser.add_argument("--warm-batches", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", default="bench_results")
    parser.add_argument("--workdir", default=None, help="where to write the table files")
    args = parser.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    gpu = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()

    copy_gbs = copy_bandwidth()
    work = Path(tempfile.mkdtemp(prefix="hps-gpu-bench-", dir=args.workdir))
    os.environ.setdefault("HPS_SHM_DIR", str(work / "shm"))
    try:
        t0 = time.perf_counter()
        write_table(work / "table", args.rows, args.dim, seed=1)
        host = SharedHostTable(work / "table", args.dim)
        build_s = time.perf_counter() - t0
        cache = make_cache("dynamic", int(args.cache_share * args.rows), args.dim, cupy)
        static = make_cache(
            "static", host.rows, args.dim, cupy, contents=tuple(map(cupy.asarray, host.contents()))
        )
        warm(cache, host, [zipf_keys(rng, 65536, args.rows, args.alpha)
                           for _ in range(args.warm_batches)])  # fmt: skip
        results = []
        for batch in (int(b) for b in args.batches.split(",")):
            keys = [cupy.asarray(zipf_keys(rng, batch, args.rows, args.alpha)) for _ in range(4)]
            q_s, q_pipe_s, q_hit = time_query(cache, keys, args.repeats)
            _, s_pipe_s, s_hit = time_query(static, keys, args.repeats)
            returned = batch * args.dim * 4
            results.append(
                {
                    "gpu": gpu,
                    "rows": args.rows,
                    "dim": args.dim,
                    "cache_rows": cache.capacity,
                    "alpha": args.alpha,
                    "batch": batch,
                    "query_us": round(q_s * 1e6, 1),
                    "query_gb_s": round(returned / q_s / 1e9, 1),
                    "query_pipelined_us": round(q_pipe_s * 1e6, 1),
                    "query_pipelined_mkeys_s": round(batch / q_pipe_s / 1e6, 1),
                    "query_pipelined_gb_s": round(returned / q_pipe_s / 1e9, 1),
                    "query_key_hit_rate": round(q_hit, 4),
                    "static_pipelined_us": round(s_pipe_s * 1e6, 1),
                    "static_pipelined_gb_s": round(returned / s_pipe_s / 1e9, 1),
                    "static_key_hit_rate": round(s_hit, 4),
                    "copy_gb_s": round(copy_gbs, 1),
                }
            )
        del static
        host.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(
        f"{gpu}; table {args.rows} x {args.dim} (host tier built in {build_s:.1f} s), cache "
        f"{cache.capacity} rows ({args.cache_share:.0%}), Zipf alpha {args.alpha}, "
        f"{args.warm_batches} warm-up batches of 64K; device copy {copy_gbs:.0f} GB/s"
    )
    head = ("batch", "query us", "GB/s", "b2b query us", "b2b GB/s", "key hit",
            "static b2b us", "static GB/s")  # fmt: skip
    print("  ".join(f"{h:>12}" for h in head))
    for r in results:
        row = (r["batch"], r["query_us"], r["query_gb_s"], r["query_pipelined_us"],
               r["query_pipelined_gb_s"], r["query_key_hit_rate"], r["static_pipelined_us"],
               r["static_pipelined_gb_s"])  # fmt: skip
        print("  ".join(f"{v:>12}" for v in row))
    with (out_dir / "gpu_cache_bench.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(results[0]))
        writer.writeheader()
        writer.writerows(results)


if __name__ == "__main__":
    main()
