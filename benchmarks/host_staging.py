"""What staging a batch's keys on the host costs, against copying them to the GPU.

A host batch reaches the GPU in two steps: the host copies its keys into pinned memory (the
GPU pipeline's staging buffer, filled by ``--threads`` threads as ``hps_core.gpu.pipeline``
does), then one DMA copy moves them. This measures both for a ``[batch, keys]`` int64 key
matrix (MLPerf DLRM-v2: 214 keys per sample), and the alternative of handing CUDA the
pageable array directly (``cudaMemcpy`` stages it through the driver's own pinned buffers).
Medians of ``--runs``; the keys are rotated among four arrays so no copy reads a cached one.

Usage:
    python benchmarks/host_staging.py --out $OUT
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import statistics
import time
from pathlib import Path

import cupy
import numpy as np

from hps_core.gpu.staging import split_copies

_H2D = 1


def _copy_all(copies) -> None:
    for target, source in copies:
        target[...] = source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1024,16384,65536")
    parser.add_argument("--keys", type=int, default=214, help="keys per sample")
    parser.add_argument("--threads", default="1,2,4,8")
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    results = []
    for batch in (int(b) for b in args.batches.split(",")):
        sources = [rng.integers(0, 1 << 40, (batch, args.keys)) for _ in range(4)]
        nbytes = sources[0].nbytes
        pinned = cupy.cuda.alloc_pinned_memory(nbytes)
        staging = np.frombuffer(pinned, np.int64, batch * args.keys).reshape(batch, args.keys)
        staging[...] = 0
        device = cupy.empty(nbytes, dtype=cupy.uint8)
        stream = cupy.cuda.Stream(non_blocking=True)

        def timed(step, rounds=args.runs) -> float:
            times = []
            for i in range(rounds + 1):
                source = sources[i % len(sources)]
                started = time.perf_counter()
                step(source)
                times.append(time.perf_counter() - started)
            return 1e3 * statistics.median(times[1:])

        def dma(_source) -> None:
            cupy.cuda.runtime.memcpyAsync(
                device.data.ptr, staging.ctypes.data, nbytes, _H2D, stream.ptr
            )
            stream.synchronize()

        def pageable(source) -> None:
            cupy.cuda.runtime.memcpyAsync(
                device.data.ptr, source.ctypes.data, nbytes, _H2D, stream.ptr
            )
            stream.synchronize()

        rows = {"pinned DMA": timed(dma), "pageable cudaMemcpy": timed(pageable)}
        for threads in (int(t) for t in args.threads.split(",")):
            with concurrent.futures.ThreadPoolExecutor(threads) as pool:

                def stage(source, pool=pool, threads=threads) -> None:
                    shares = split_copies([(staging, source)], threads)
                    list(pool.map(_copy_all, shares))

                rows[f"staging, {threads} threads"] = timed(stage)
        for name, ms in rows.items():
            results.append(
                dict(batch=batch, keys=batch * args.keys, mb=nbytes / 1e6, step=name, ms=ms,
                     gb_per_s=nbytes / ms / 1e6)
            )  # fmt: skip
    columns = ["batch", "keys", "mb", "step", "ms", "gb_per_s"]
    with open(args.out / "host_staging.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(results)
    print("| " + " | ".join(columns) + " |")
    print("|" + " --- |" * len(columns))
    for r in results:
        print("| " + " | ".join(f"{r[c]:,.3g}" if isinstance(r[c], float) else f"{r[c]:,}"
                                for c in columns) + " |")  # fmt: skip


if __name__ == "__main__":
    main()
