"""What staging a batch's keys on the host costs, against copying them to the GPU.

A host batch reaches the GPU in two steps: the host copies its keys into pinned memory (the
GPU pipeline's staging buffer, filled by ``--threads`` threads as ``hps_core.infer.gpu.uploads``
does), then one DMA copy moves them. This measures both for a ``[batch, keys]`` int64 key
matrix (MLPerf DLRM-v2: 214 keys per sample), and the alternative of handing CUDA the
pageable array directly (``cudaMemcpy`` stages it through the driver's own pinned buffers),
or pinning the caller's array in place for the copy (``cudaHostRegister``).
Medians of ``--runs``; the keys are rotated among four arrays so no copy reads a cached one.

Usage:
    python benchmarks/host_staging.py --out $OUT
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import time
from pathlib import Path

import cupy
import numpy as np
from result_table import write_results

from hps_core.infer.gpu.staging import split_copies

_H2D = 1


def _copy_all(copies) -> None:
    for target, source in copies:
        target[...] = source


def measure(
    rng: np.random.Generator, batch: int, keys: int, threads: list[int], runs: int
) -> dict[str, float]:
    """Median ms of each way of moving one ``[batch, keys]`` key matrix to the GPU."""
    sources = [rng.integers(0, 1 << 40, (batch, keys)) for _ in range(4)]
    nbytes = sources[0].nbytes
    pinned = cupy.cuda.alloc_pinned_memory(nbytes)
    staging = np.frombuffer(pinned, np.int64, batch * keys).reshape(batch, keys)
    staging[...] = 0
    device = cupy.empty(nbytes, dtype=cupy.uint8)
    stream = cupy.cuda.Stream(non_blocking=True)

    def timed(step) -> float:
        times = []
        for i in range(runs + 1):
            source = sources[i % len(sources)]
            started = time.perf_counter()
            step(source)
            times.append(time.perf_counter() - started)
        return 1e3 * statistics.median(times[1:])

    def copy_to_device(address: int) -> None:
        cupy.cuda.runtime.memcpyAsync(device.data.ptr, address, nbytes, _H2D, stream.ptr)
        stream.synchronize()

    def registered_copy(source: np.ndarray) -> None:
        cupy.cuda.runtime.hostRegister(source.ctypes.data, nbytes, 0)
        try:
            copy_to_device(source.ctypes.data)
        finally:
            cupy.cuda.runtime.hostUnregister(source.ctypes.data)

    rows = {
        "pinned DMA": timed(lambda _: copy_to_device(staging.ctypes.data)),
        "pageable cudaMemcpy": timed(lambda source: copy_to_device(source.ctypes.data)),
        "cudaHostRegister, DMA, unregister": timed(registered_copy),
    }
    for n in threads:
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            rows[f"staging, {n} threads"] = timed(
                lambda source, pool=pool, n=n: list(
                    pool.map(_copy_all, split_copies([(staging, source)], n))
                )
            )
    return rows


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
    threads = [int(t) for t in args.threads.split(",")]
    results = []
    for batch in (int(b) for b in args.batches.split(",")):
        nbytes = batch * args.keys * 8
        for name, ms in measure(rng, batch, args.keys, threads, args.runs).items():
            results.append(
                dict(batch=batch, keys=batch * args.keys, mb=nbytes / 1e6, step=name, ms=ms,
                     gb_per_s=nbytes / ms / 1e6)
            )  # fmt: skip
    columns = ["batch", "keys", "mb", "step", "ms", "gb_per_s"]
    write_results(args.out / "host_staging.csv", columns, results, ",.3g")


if __name__ == "__main__":
    main()
