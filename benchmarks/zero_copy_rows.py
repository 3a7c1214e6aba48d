"""Rate at which GPU kernels read random embedding rows from pinned host memory in place (zero
copy, as ``bank_lookup`` reads the host tier's rows on a cache miss), by access pattern,
against one DMA copy of the same number of bytes.

Each pattern gathers ``--rows`` random rows of ``--dim`` float32 from a pinned buffer of
``--buffer-gib`` into device memory: ``lanes`` threads share a row, each loading ``unroll``
16-byte words before storing them, with 2 to 32 blocks of 256 threads per SM. Then, with 8
lanes x 4 words, how the memory was pinned and where the rows lie: ``cudaHostAlloc``, or
``cudaHostRegister`` of anonymous pages with and without transparent huge pages, or of a file in
``/dev/shm`` (as the host tier is); rows random over the whole buffer, random inside 64 MiB to
1 GiB, the random rows in address order, or rows in order. The GPU translates host addresses
page by page: if random rows over gigabytes read slower than rows inside a few megabytes, its
translation of host pages, not PCIe, sets the rate.
Medians of ``--runs`` launches, CUDA events; rows are checked against their index.

Usage:
    python benchmarks/zero_copy_rows.py --out $OUT
"""

from __future__ import annotations

import argparse
import csv
import mmap
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
_REGISTER_MAPPED = 2  # cudaHostRegisterMapped
_REGISTER_READ_ONLY = 8  # cudaHostRegisterReadOnly
_HUGE = 2 << 20  # bytes of a transparent huge page (x86-64)


@contextmanager
def registered(kind: str, nbytes: int) -> Iterator[np.ndarray]:
    """``nbytes`` of host memory pinned for the GPU as ``kind`` says, as a uint8 array."""
    if kind == "cudaHostAlloc":
        memory = cupy.cuda.alloc_pinned_memory(nbytes)  # mapped: UVA, same address
        yield np.frombuffer(memory, np.uint8, nbytes)
        return
    if kind == "/dev/shm file":
        fd, name = tempfile.mkstemp(dir="/dev/shm", prefix="hps_zero_copy_")
        os.ftruncate(fd, nbytes)
        area = mmap.mmap(fd, nbytes)
        os.close(fd)
        os.unlink(name)
        host = np.frombuffer(area, np.uint8, nbytes)
    else:  # private: a shared anonymous mapping is shmem, without huge pages here
        area = mmap.mmap(-1, nbytes + _HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        advice = mmap.MADV_HUGEPAGE if kind == "anonymous, huge pages" else mmap.MADV_NOHUGEPAGE
        area.madvise(advice)
        whole = np.frombuffer(area, np.uint8)
        skip = -whole.ctypes.data % _HUGE  # start on a huge-page boundary
        host = whole[skip : skip + nbytes]
    host[:: mmap.PAGESIZE] = 0  # fault every page in before registering
    cupy.cuda.runtime.hostRegister(host.ctypes.data, nbytes, _REGISTER_MAPPED | _REGISTER_READ_ONLY)
    try:
        yield host
    finally:
        cupy.cuda.runtime.hostUnregister(host.ctypes.data)  # the pages go with the last view


def placements(total: int, rows: int, row_bytes: int) -> dict[str, Callable[[], np.ndarray]]:
    """Row indices of the gather: random over the buffer, random inside 64 MiB to 1 GiB, random
    but sorted, in order."""
    rng = np.random.default_rng(0)
    places = {"random": lambda: rng.integers(0, total, rows)}
    for mib in (64, 256, 1024):
        window = min(total, (mib << 20) // row_bytes)
        places[f"random in {mib} MiB"] = lambda w=window: rng.integers(0, w, rows)
    # The same rows as "random", read in address order: sparse, but each launch's reads in
    # flight at a time lie close together (as misses sorted by row would be read).
    places["random, sorted"] = lambda: np.sort(rng.integers(0, total, rows))
    places["in order"] = lambda: np.arange(rows) % total
    return places


def huge_pages_of(raw: np.ndarray) -> str:
    """How much of ``raw`` the kernel backs with huge pages (from /proc/self/smaps)."""
    start = raw.ctypes.data
    found = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            low, high = (int(x, 16) for x in head.split("-"))
            found = low <= start < high
        elif (
            found
            and head in ("AnonHugePages:", "ShmemPmdMapped:", "FilePmdMapped:")
            and int(line.split()[1]) > 0
        ):
            return f"{head} {line.split()[1]} kB"
    return "no huge pages"


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
    pages = {}
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
    kernel = module.get_function(names[0])
    for kind in ("cudaHostAlloc", "anonymous, 4 KiB pages", "anonymous, huge pages",
                 "/dev/shm file"):  # fmt: skip
        with registered(kind, total * row_bytes) as raw:
            rows_of = raw.view(np.float32).reshape(total, args.dim)
            rows_of[:, 0] = np.arange(total, dtype=np.float32)
            pages[kind] = huge_pages_of(raw)
            for where, draw in placements(total, args.rows, row_bytes).items():
                index = cupy.asarray(draw())
                call_args = (cupy.uint64(raw.ctypes.data), index, np.int64(args.rows),
                             np.int32(words), out)  # fmt: skip
                out.fill(cupy.nan)
                ms = median_ms(lambda a=call_args: kernel((sms * 8,), (256,), a))
                if not (out[:, 0] == index.astype(cupy.float32)).all():
                    raise SystemExit(f"{kind}, {where}: rows read wrong")
                results.append((f"{kind}, {where}", 8, 8, ms, nbytes / ms / 1e6))
    gpu = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"GPU: {gpu}; {args.rows:,} random rows of {row_bytes} bytes from "
          f"{args.buffer_gib} GiB pinned; medians of {args.runs}")  # fmt: skip
    for kind, huge in pages.items():
        print(f"{kind}: {huge}")
    print(f"{'read':48s} {'blocks/SM':>9s} {'ms':>8s} {'GB/s':>7s}")
    for label, _, per_sm, ms, rate in results:
        print(f"{label:48s} {per_sm!s:>9s} {ms:8.3f} {rate:7.1f}")
    path = args.out / "zero_copy_rows.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["read", "lanes", "blocks_per_sm", "ms", "gb_per_s"])
        writer.writerows(results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
