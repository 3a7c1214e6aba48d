"""Products of a few rows: cuBLASLt as the GPU pipeline calls it (``linear.linear``, its
algorithm timed among cuBLASLt's candidates) against PyTorch's ``addmm``, per layer shape.

Batches of 1 to 8 samples make each fully connected layer a product of 1 to 8 rows, whose
cost is reading the weights (and, inside a CUDA graph, each kernel's launch). Each product,
with its bias and ReLU, is recorded ``--calls`` times in a CUDA graph; the graph is replayed
``--replays`` times between CUDA events and the median per call is reported, for every
``--shapes`` (in x out features: the MLPs and cross layers of the MLPerf DLRMs by default),
``--rows`` and precision (FP32, TF32). Prints a table and writes ``few_row_products.csv``
under ``--out``; the weights' bytes over the time give the rate each reads them at.

Usage:
    python benchmarks/few_row_products.py --out $OUT
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import cupy
import numpy as np
import torch
from result_table import write_results

from hps_core.cuda import linear

SHAPES = "13x512,512x256,256x128,3456x512,512x3456,3456x1024,1024x1024,1024x512,479x1024"


def per_call_us(launch, calls: int, replays: int) -> float:
    """Median GPU time per call of ``launch`` (recorded ``calls`` times in one CUDA graph)."""
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        launch()  # plans, tuning and compilation outside the capture
        stream.synchronize()
        stream.begin_capture()
        for _ in range(calls):
            launch()
        graph = stream.end_capture()
        graph.launch(stream)
        times = []
        for _ in range(replays):
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            graph.launch(stream)
            stop.record(stream)
            stop.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, stop) * 1000 / calls)
    return statistics.median(times)


def torch_call_us(x, w, b, calls: int, replays: int) -> float:
    """The same for ``torch.relu(torch.addmm(b, x, w))`` in a ``torch.cuda.CUDAGraph``."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.relu(torch.addmm(b, x, w))
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(calls):
                torch.relu(torch.addmm(b, x, w))
        times = []
        for _ in range(replays):
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            graph.replay()
            stop.record(stream)
            stop.synchronize()
            times.append(start.elapsed_time(stop) * 1000 / calls)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--rows", default="1,2,8")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    results = []
    for precision in ("fp32", "tf32"):
        tf32 = precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for shape in args.shapes.split(","):
            k, n = (int(v) for v in shape.split("x"))
            w = cupy.asarray((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32))
            b = cupy.asarray(rng.standard_normal(n, dtype=np.float32))
            for rows in (int(r) for r in args.rows.split(",")):
                x = cupy.asarray(rng.standard_normal((rows, k), dtype=np.float32))
                cublas = per_call_us(
                    lambda x=x, w=w, b=b, p=precision: linear.linear(x, w, b, True, p),
                    args.calls, args.replays,
                )  # fmt: skip
                peer = torch_call_us(
                    torch.as_tensor(x, device="cuda"), torch.as_tensor(w, device="cuda"),
                    torch.as_tensor(b, device="cuda"), args.calls, args.replays,
                )  # fmt: skip
                row = {"precision": precision, "k": k, "n": n, "rows": rows}
                row |= {"cublaslt_us": cublas, "torch_us": peer, "x_torch": peer / cublas}
                results.append(row | {"cublaslt_gb_s": k * n * 4 / cublas / 1e3})
    write_results(args.out / "few_row_products.csv", list(results[0]), results)


if __name__ == "__main__":
    main()
