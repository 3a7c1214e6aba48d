"""A table bigger than the cache, at NV Embedding Cache's shape: how fast it loads, how much
memory it takes, and (on a GPU) how many keys a second its lookups answer.

NV Embedding Cache (``NVIDIA/nv-embedding-cache``, ``docs/benchmarks.md``) measures one table
of dim 128 FP32 with Zipf(1.05) keys. This script writes such a table as HugeCTR sparse files
(``--gb`` of FP32 rows), then, in the same run:

Load (any machine):
- ``cat`` of the two files to ``/dev/null``: what the disk and page cache give;
- a plain sequential ``readinto`` of the same files into a fresh ``/dev/shm`` file mapped into
  memory: the rate a copy into shared memory can reach on one thread;
- a restart: a fresh process opening the host tier a stopped server kept (files unchanged);
- the host tier's build (:class:`~hps_core.tiers.host_table.SharedHostTable`, in a fresh
  process, as a Triton stub builds it), in FP32 and in the other ``--precisions``: seconds,
  GB/s of the files read, the segment's bytes against the stored rows', and the building
  process's peak anonymous memory above what it held before the build (``RssAnon``, sampled
  every 20 ms: neither the shared segment nor the page cache) beside them.
Each is measured cold (the page cache dropped first, where ``/proc/sys/vm/drop_caches`` can be
written) and warm (right after a read of the files).

Lookups (``--lookups``, a GPU with CuPy and PyTorch), NV Embedding Cache's step: 256 samples x
1,024 keys (262,144 keys) drawn Zipf(``--alpha``) over the table's rows, in each storage
precision, with a dynamic GPU cache of each ``--cache-shares`` of the table and with the whole
table static on the GPU:
- unpooled (``HPS.lookup_fromdlpack``: a row per key) and pooled (hotness 1,024, sum): M keys/s
  (CUDA events around ``--steps`` steps after ``--warm`` steps), the hit rate of the measured
  steps, the bytes read from the host tier over PCIe per step (rows the caches missed) and the
  floor: missed bytes / the host-to-device copy rate + the other rows' bytes / the GPU's
  device-to-device copy rate, both measured in the same run (a row read from GPU memory costs
  its bytes once; the floor counts neither the keys nor the answer's writes);
- through the cache bank's kernels, the GPU lookup engine of every GPU lookup (the per-table
  engine that ``--engines tables`` compared with it was retired);
- PyTorch on the same keys (``F.embedding``, ``F.embedding_bag`` of a GPU copy of the FP32
  table, row indices in place of keys), where the GPU holds a copy beside everything else.

Prints a table; writes ``large_table.csv`` under ``--out``.

Usage:
    python benchmarks/large_table.py --gb 8 --dir /tmp/large_table --out bench_results/large
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import mmap
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from hps_core.formats.sparse import KEY_FILE, VECTOR_FILE
from hps_core.tiers.shm_segment import KEEP_ENV, remove_stale_segments

DIM = 128


_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15 | 1)


def table_key(index: np.ndarray, seed: int = 0) -> np.ndarray:
    """The key :func:`write_table` wrote at each row ``index`` (an odd multiplier is a
    bijection modulo 2**63, so keys are unique)."""
    offset = np.uint64(np.random.default_rng(seed).integers(1 << 62))
    index = np.asarray(index).astype(np.uint64)
    return ((index * _MULTIPLIER + offset) & np.uint64((1 << 63) - 1)).astype("<i8")


def write_table(folder: Path, rows: int, seed: int = 0) -> float:
    """Write ``rows`` unique keys and random FP32 rows of dim 128, a chunk at a time.

    Returns:
        Seconds taken.
    """
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    rng.integers(1 << 62)  # table_key's offset
    started = time.perf_counter()
    chunk = 1 << 20
    with open(folder / KEY_FILE, "wb") as keys_out, open(folder / VECTOR_FILE, "wb") as rows_out:
        for first in range(0, rows, chunk):
            n = min(chunk, rows - first)
            table_key(np.arange(first, first + n), seed).tofile(keys_out)
            rng.standard_normal((n, DIM), dtype=np.float32).tofile(rows_out)
        keys_out.flush()
        rows_out.flush()
        os.fsync(keys_out.fileno())
        os.fsync(rows_out.fileno())
    return time.perf_counter() - started


def drop_page_cache() -> bool:
    """Drop the page cache (root only); whether it could be."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def timed_cat(folder: Path) -> float:
    started = time.perf_counter()
    subprocess.run(
        ["cat", str(folder / KEY_FILE), str(folder / VECTOR_FILE)],
        stdout=subprocess.DEVNULL,
        check=True,
    )
    return time.perf_counter() - started


def timed_plain_read(folder: Path) -> float:
    """One thread reading both files in order into a fresh shared-memory file."""
    files = [folder / KEY_FILE, folder / VECTOR_FILE]
    size = sum(f.stat().st_size for f in files)
    started = time.perf_counter()
    with tempfile.NamedTemporaryFile(dir="/dev/shm", prefix="large-table-read-") as shm:
        os.ftruncate(shm.fileno(), size)
        mapped = mmap.mmap(shm.fileno(), size)
        view, at = memoryview(mapped), 0
        for path in files:
            with open(path, "rb", buffering=0) as stream:
                while True:
                    n = stream.readinto(view[at : at + (64 << 20)])
                    if not n:
                        break
                    at += n
        elapsed = time.perf_counter() - started
        view.release()
        mapped.close()
    return elapsed


_BUILD = r"""
import json, sys, threading, time
from hps_core.tiers.host_table import SharedHostTable
folder, dim, precision = sys.argv[1], int(sys.argv[2]), sys.argv[3]
peak = [0]
done = threading.Event()
def anon():  # the process's own memory: not the shared segment, not the page cache
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], anon())
        time.sleep(0.02)
base = anon()
threading.Thread(target=sample, daemon=True).start()
started = time.perf_counter()
table = SharedHostTable(folder, dim, precision=precision, progress=False)
seconds = time.perf_counter() - started
done.set()
print(json.dumps({"seconds": seconds, "segment": table.nbytes, "peak_anon": peak[0] - base,
                  "stored_rows": table.rows * table.row_format.row_bytes}))
table.close()
"""


def timed_build(folder: Path, precision: str, keep: Path | None = None) -> dict:
    """The host tier's build in a fresh process; the segment is removed when it exits, unless
    ``keep`` (a marker file that exists) keeps it as a stopping server's launcher does."""
    env = dict(os.environ)
    if keep is not None:
        env[KEEP_ENV] = str(keep)
    out = subprocess.run(
        [sys.executable, "-c", _BUILD, str(folder), str(DIM), precision],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def timed_restart(folder: Path, precision: str) -> float:
    """Seconds a fresh process takes to open the host tier a stopped server kept."""
    with tempfile.TemporaryDirectory() as scratch:
        marker = Path(scratch) / "keep"
        marker.touch()
        timed_build(folder, precision, keep=marker)  # the last run, stopping
        marker.unlink()
        seconds = timed_build(folder, precision)["seconds"]  # the restart: attaches
    remove_stale_segments(keep=())
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=8.0, help="GB of FP32 rows to write")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/large_table"))
    parser.add_argument("--out", type=Path, default=Path("bench_results/large_table"))
    parser.add_argument("--precisions", default="fp32,fp16")
    parser.add_argument("--keep", action="store_true", help="keep the files for a later run")
    parser.add_argument("--lookups", action="store_true", help="measure GPU lookups too")
    parser.add_argument("--load", action=argparse.BooleanOptionalAction, default=True,
                        help="measure the load (--no-load: lookups only)")  # fmt: skip
    parser.add_argument("--cache-shares", default="0.1,0.01", help="dynamic cache sizes")
    parser.add_argument("--alpha", type=float, default=1.05)
    parser.add_argument("--warm", type=int, default=30, help="steps before measuring")
    parser.add_argument("--steps", type=int, default=20, help="steps measured")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = int(args.gb * 1e9 / (4 * DIM))
    folder = args.dir / "t0"
    file_bytes = rows * (8 + 4 * DIM)
    have = folder / VECTOR_FILE
    if have.exists() and have.stat().st_size == rows * 4 * DIM:
        write_s = float("nan")
    else:
        write_s = write_table(folder, rows)
    gb = file_bytes / 1e9
    results: list[dict] = [
        {"what": "write the sparse files", "cache": "-", "seconds": write_s,
         "gb_per_s": gb / write_s if write_s == write_s else float("nan")},
    ]  # fmt: skip
    cold = drop_page_cache()
    for cache in (("cold", "warm") if cold else ("warm",)) if args.load else ():
        if cache == "warm":
            timed_cat(folder)  # the files in the page cache
        measures = [("cat to /dev/null", lambda: timed_cat(folder))]
        measures.append(("plain read into /dev/shm", lambda: timed_plain_read(folder)))
        for name, run in measures:
            if cache == "cold":
                drop_page_cache()
            seconds = run()
            results.append({"what": name, "cache": cache, "seconds": seconds,
                            "gb_per_s": gb / seconds})  # fmt: skip
        for precision in args.precisions.split(","):
            if cache == "cold":
                drop_page_cache()
            built = timed_build(folder, precision)
            stored = built["stored_rows"]
            results.append({
                "what": f"host tier build ({precision})", "cache": cache,
                "seconds": built["seconds"], "gb_per_s": gb / built["seconds"],
                "segment_x_rows": built["segment"] / stored,
                "peak_anon_x_rows": built["peak_anon"] / stored,
            })  # fmt: skip
            if cache == "warm":
                seconds = timed_restart(folder, precision)
                results.append({"what": f"restart, files unchanged ({precision})",
                                 "cache": "kept", "seconds": seconds,
                                 "gb_per_s": gb / seconds})  # fmt: skip
    fields = ["what", "cache", "seconds", "gb_per_s", "segment_x_rows", "peak_anon_x_rows"]
    with open(args.out / "large_table.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(results)
    print(f"table: {rows:,} rows x {DIM} FP32 ({gb:.2f} GB of files), {os.cpu_count()} cores")
    print(f"{'':34} {'cache':>5} {'seconds':>8} {'GB/s':>6} {'seg/rows':>8} {'anon/rows':>9}")
    for r in results:
        extra = ""
        if "segment_x_rows" in r:
            extra = f" {r['segment_x_rows']:8.3f} {r['peak_anon_x_rows']:9.3f}"
        print(f"{r['what']:34} {r['cache']:>5} {r['seconds']:8.2f} {r['gb_per_s']:6.2f}{extra}")
    if args.lookups:
        from large_table_lookups import measure_lookups

        measure_lookups(args, folder, rows, table_key)
    if not args.keep:
        with contextlib.suppress(FileNotFoundError):
            (folder / KEY_FILE).unlink()
            (folder / VECTOR_FILE).unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
