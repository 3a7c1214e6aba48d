"""FP32 fully connected layers on the GPU: SGEMM against 3xTF32, with TF32 beside them.

For each layer shape of the MLPerf DLRM (bottom 13-512-256-128, top 479-1024-1024-512-256-1)
and each batch size, :func:`hps_core.cuda.linear.linear` with its bias and ReLU epilogue runs in
three modes: ``sgemm`` (``HPS_FP32_GEMM=sgemm``: float32 CUDA cores), ``3xtf32`` (three TF32
tensor-core products of split operands, forced whatever the size) and ``tf32`` (one TF32
product, the TF32 precision mode). Per case: the median GPU time of ``--runs`` calls (CUDA
events around each call, after two warm-up calls) and the relative L2 error against a float64
product computed on the GPU. The split passes are part of the 3xTF32 time.

Prints a table and writes ``fp32_gemm_modes.csv`` under ``--out``; the crossover it shows is
where :data:`hps_core.cuda.linear.THREE_TF32_MIN_MACS` should sit.

Usage:
    python benchmarks/fp32_gemm_modes.py --out $OUT
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
from pathlib import Path

import cupy
import numpy as np

from hps_core.cuda import linear

LAYERS = [(13, 512), (512, 256), (256, 128), (479, 1024), (1024, 1024), (1024, 512), (512, 256)]


def timed(fn, runs: int) -> float:
    """Median milliseconds of ``fn()`` on the current stream (CUDA events)."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(runs):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1024,4096,16384,65536")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = []
    print(f"GPU {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
    for batch in (int(b) for b in args.batches.split(",")):
        for k, n in LAYERS:
            # A ReLU layer's input: non-negative, so the products do not cancel.
            x = cupy.asarray(np.abs(rng.standard_normal((batch, k))).astype(np.float32))
            w = cupy.asarray((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32))
            b = cupy.asarray(rng.standard_normal(n).astype(np.float32))
            want = x.astype(cupy.float64) @ w.astype(cupy.float64) + b.astype(cupy.float64)
            want = cupy.maximum(want, 0)
            row = {"batch": batch, "in": k, "out": n, "macs": batch * k * n}
            for mode in ("sgemm", "3xtf32", "tf32"):
                os.environ["HPS_FP32_GEMM"] = "sgemm" if mode == "sgemm" else "3xtf32"
                saved = linear.THREE_TF32_MIN_MACS, linear.THREE_TF32_MIN_FEATURES
                linear.THREE_TF32_MIN_MACS, linear.THREE_TF32_MIN_FEATURES = 0, 1
                precision = "tf32" if mode == "tf32" else "fp32"
                try:
                    ms = timed(lambda: linear.linear(x, w, b, True, precision), args.runs)  # noqa: B023
                    got = linear.linear(x, w, b, True, precision)
                finally:
                    linear.THREE_TF32_MIN_MACS, linear.THREE_TF32_MIN_FEATURES = saved
                error = float(cupy.linalg.norm(got - want) / cupy.linalg.norm(want))
                row[f"{mode}_ms"] = ms
                row[f"{mode}_rel_l2"] = error
            row["speedup_3xtf32"] = row["sgemm_ms"] / row["3xtf32_ms"]
            os.environ.pop("HPS_FP32_GEMM")
            row["default_is_3xtf32"] = linear.three_tf32_pays(batch, n, k)
            rows.append(row)
            print(
                f"batch {batch:6d} {k:5d}->{n:5d}: sgemm {row['sgemm_ms']:.3f} ms "
                f"({row['sgemm_rel_l2']:.1e}), 3xtf32 {row['3xtf32_ms']:.3f} ms "
                f"({row['3xtf32_rel_l2']:.1e}), tf32 {row['tf32_ms']:.3f} ms "
                f"({row['tf32_rel_l2']:.1e}), x{row['speedup_3xtf32']:.2f}, default "
                f"{'3xtf32' if row['default_is_3xtf32'] else 'sgemm'}",
                flush=True,
            )
    with open(args.out / "fp32_gemm_modes.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
