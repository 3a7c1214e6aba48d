"""DLRM's dot interaction on the GPU: hps-triton's kernel against PyTorch's batched GEMM.

For each shape (samples, vectors n, width dim) and precision: the median time of
:func:`hps_core.cuda.dense_ops.interaction` (one kernel: stage, Gram matrix in 4 x 4 register
tiles, lower triangle, padding), of the PyTorch peer as ``benchmarks/torch_dlrm.py`` writes it
(``cat`` of the MLP output and the embeddings, ``bmm``, gather of the triangle, ``cat``), and of
a device-to-device copy of the kernel's input and output bytes (the memory floor); the kernel's
effective bandwidth; and the largest difference between the two results.

Usage:
    python benchmarks/interaction_kernel.py --out $OUT
"""

from __future__ import annotations

import argparse
import csv
import statistics
from collections.abc import Callable
from pathlib import Path

import cupy
import numpy as np
import torch

from hps_core.cuda import dense_ops

SHAPES = ((1, 27, 128), (1024, 27, 128), (16384, 27, 128), (65536, 27, 128), (65536, 27, 16),
          (16384, 40, 64))  # fmt: skip


def median_ms(fn: Callable[[], object], runs: int) -> float:
    """Median of ``runs`` calls, each timed with CUDA events on the current stream."""
    fn()
    cupy.cuda.Device().synchronize()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(runs):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def torch_interaction(x: torch.Tensor, emb: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    stacked = torch.cat([x[:, None, :], emb], dim=1)
    gram = torch.bmm(stacked, stacked.transpose(1, 2)).flatten(1)
    return torch.cat([x, gram[:, pairs], x.new_zeros(x.shape[0], 1)], dim=1)


def measure(rng: np.random.Generator, samples: int, n: int, dim: int, tf32: bool,
            runs: int) -> dict:  # fmt: skip
    """One row of the table: times in ms, bandwidth, difference (see the module docstring)."""
    torch.backends.cuda.matmul.allow_tf32 = tf32
    mlp = cupy.asarray(rng.standard_normal((samples, dim), dtype=np.float32))
    emb = cupy.asarray(rng.standard_normal((samples, n - 1, dim), dtype=np.float32))
    x, e = torch.from_dlpack(mlp), torch.from_dlpack(emb)
    i, j = np.tril_indices(n, k=-1)
    pairs = torch.from_numpy(i * n + j).cuda()
    ours = median_ms(lambda: dense_ops.interaction(mlp, emb, tf32), runs)
    peer = median_ms(lambda: torch_interaction(x, e, pairs), runs)
    nbytes = mlp.nbytes + emb.nbytes + samples * (dim + n * (n - 1) // 2 + 1) * 4
    # A copy reads and writes: half the bytes each way moves what the kernel moves.
    source = cupy.empty(nbytes // 8, np.float32)
    target = cupy.empty_like(source)
    copy = median_ms(lambda: target.__setitem__(Ellipsis, source), runs)
    got = cupy.asnumpy(dense_ops.interaction(mlp, emb, tf32))
    want = torch_interaction(x, e, pairs).cpu().numpy()
    return dict(samples=samples, n=n, dim=dim, precision="tf32" if tf32 else "fp32",
                hps_ms=ours, torch_ms=peer, copy_ms=copy, x_torch=peer / ours,
                hps_gb_per_s=nbytes / ours / 1e6,
                # TF32: the kernel rounds operands to nearest, cuBLAS may truncate.
                max_abs_diff=float(np.max(np.abs(got - want))))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    print(f"GPU: {torch.cuda.get_device_name(0)}; medians of {args.runs} runs")
    print(f"{'samples':>7} {'n':>3} {'dim':>4} {'precision':>9} {'hps ms':>8} {'torch ms':>9} "
          f"{'copy ms':>8} {'x torch':>7} {'GB/s':>6} {'max |diff|':>10}")  # fmt: skip
    rows = []
    # PyTorch and CuPy on one stream, so that the events time both alike.
    with cupy.cuda.Stream.from_external(torch.cuda.current_stream()):
        for samples, n, dim in SHAPES:
            for tf32 in (False, True):
                r = measure(rng, samples, n, dim, tf32, args.runs)
                rows.append(r)
                print(f"{samples:>7} {n:>3} {dim:>4} {r['precision']:>9} {r['hps_ms']:8.3f} "
                      f"{r['torch_ms']:9.3f} {r['copy_ms']:8.3f} {r['x_torch']:7.2f} "
                      f"{r['hps_gb_per_s']:6.0f} {r['max_abs_diff']:10.2e}")  # fmt: skip
    path = args.out / "interaction_kernel.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
