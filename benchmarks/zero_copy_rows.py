"""Rate at which GPU kernels read random embedding rows from pinned host memory in place (zero
copy, as ``bank_lookup`` reads the host tier's rows on a cache miss), by access pattern,
against one DMA copy of the same number of bytes.

Each pattern gathers ``--rows`` random rows of ``--dim`` float32 from a pinned buffer of
``--buffer-gib`` into device memory: ``lanes`` threads share a row, each loading ``unroll``
16-byte words before storing them, with 2 to 32 blocks of 256 threads per SM. Medians of
``--runs`` launches, CUDA events; rows are checked against their index.

Usage:
    python benchmarks/zero_copy_rows.py --out $OUT
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import cupy
import numpy as np

SOURCE = r"""
template <int LANES, int UNROLL>
__global__ void gather(const float4* __restrict__ rows, const long long* __restrict__ index,
                       const long long n, const int words, float4* __restrict__ out) {
  const long long groups = (long long)gridDim.x * blockDim.x / LANES;
  const int lane = threadIdx.x % LANES;
  for (long long g = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / LANES; g < n;
       g += groups) {
    const float4* row = rows + index[g] * words;
    float4* o = out + g * words;
    for (int base = lane; base < words; base += LANES * UNROLL) {
      float4 v[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int d = base + u * LANES;
        if (d < words) v[u] = row[d];
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int d = base + u * LANES;
        if (d < words) o[d] = v[u];
      }
    }
  }
}
"""
PATTERNS = ((8, 4), (8, 1), (16, 2), (32, 1), (4, 8))  # (lanes per row, words in flight)
BLOCKS_PER_SM = (2, 8, 32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--buffer-gib", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    row_bytes = args.dim * 4
    words = row_bytes // 16
    names = [f"gather<{lanes},{unroll}>" for lanes, unroll in PATTERNS]
    module = cupy.RawModule(code=SOURCE, options=("--std=c++17",), name_expressions=names)
    total = int(args.buffer_gib * (1 << 30)) // row_bytes
    memory = cupy.cuda.alloc_pinned_memory(total * row_bytes)  # mapped: UVA, same address
    host = np.frombuffer(memory, np.float32, total * args.dim).reshape(total, args.dim)
    host[:, 0] = np.arange(total, dtype=np.float32)  # each row names itself
    index = cupy.asarray(np.random.default_rng(0).integers(0, total, args.rows))
    out = cupy.empty((args.rows, args.dim), cupy.float32)
    nbytes = args.rows * row_bytes
    staging = cupy.empty(nbytes, cupy.uint8)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()

    def median_ms(launch) -> float:
        launch()
        cupy.cuda.Device().synchronize()
        times = []
        for _ in range(args.runs):
            start.record()
            launch()
            stop.record()
            stop.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, stop))
        return float(np.median(times))

    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    kernel_args = (cupy.uint64(host.ctypes.data), index, np.int64(args.rows), np.int32(words), out)
    results = []
    ms = median_ms(
        lambda: cupy.cuda.runtime.memcpyAsync(staging.data.ptr, host.ctypes.data, nbytes, 1, 0)
    )
    results.append(("DMA copy, contiguous", "", "", ms, nbytes / ms / 1e6))
    for (lanes, unroll), name in zip(PATTERNS, names, strict=True):
        kernel = module.get_function(name)
        for per_sm in BLOCKS_PER_SM:
            out.fill(cupy.nan)  # rows a pattern fails to read cannot pass for the last one's
            ms = median_ms(
                lambda kernel=kernel, blocks=sms * per_sm: kernel((blocks,), (256,), kernel_args)
            )
            label = f"kernel, {lanes} lanes x {unroll} words"
            results.append((label, lanes, per_sm, ms, nbytes / ms / 1e6))
            if not (out[:, 0] == index.astype(cupy.float32)).all():
                raise SystemExit(f"{name}: rows read wrong")
    gpu = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"GPU: {gpu}; {args.rows:,} random rows of {row_bytes} bytes from "
          f"{args.buffer_gib} GiB pinned; medians of {args.runs}")  # fmt: skip
    print(f"{'read':34s} {'blocks/SM':>9s} {'ms':>8s} {'GB/s':>7s}")
    for label, _, per_sm, ms, rate in results:
        print(f"{label:34s} {per_sm!s:>9s} {ms:8.3f} {rate:7.1f}")
    path = args.out / "zero_copy_rows.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["read", "lanes", "blocks_per_sm", "ms", "gb_per_s"])
        writer.writerows(results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
