"""Dense-network forward pass per precision: time, per-layer time, FLOP rate, accuracy.

Network: the MLPerf DLRM dense part (13 dense features, 26 tables of dim 128, bottom MLP
13-512-256-128, HugeCTR dot Interaction (27 vectors, 480 wide), top MLP 1024-1024-512-256-1,
Sigmoid), built in memory with :func:`hps_core.export.dlrm_network_json`, parameters from
:func:`hps_core.nn.random_dense_params` (seed ``--seed``), inputs random normal (dense features
with std 1, pooled embeddings with std 128**-0.25 so that dot products are of order one and
the Sigmoid is not saturated).

For each array module (NumPy; CuPy when it imports and sees a GPU) x precision (``fp32``,
``tf32``, ``fp16``) x batch (GPU ``--batches``; CPU ``--cpu-batches``, 65536 left out by
default because a 2-core CPU takes minutes):

- ``median_ms``: median of ``--repeats`` timed forward passes after ``--warmup`` untimed ones;
  CUDA events around the call on the GPU (``host_ms``: host clock around the synchronised
  call), the host clock on the CPU;
- per-layer times: median per step over ``--profile-repeats`` calls of
  :meth:`DenseExecutor.profile` (CUDA events between layers on the GPU);
- FLOPs of the pass (:func:`hps_core.nn.layer_flops`), achieved TFLOP/s, and the fraction of
  the matrix-rate ceiling measured in the same run: the median rate of a ``--gemm-size``
  square GEMM through the same ``ComputeContext.matmul`` (same array module and precision:
  FP32 SIMT, TF32 and FP16 tensor cores on the GPU; sgemm, the TF32 emulation and widened
  FP16 on the CPU);
- accuracy of tf32/fp16 against fp32 on the same inputs and array module: max abs and
  relative L2 error of the predictions.

On the GPU it also checks that TF32 products really round their operands to TF32, for each
kind of product the network issues (2-D GEMM, batched GEMM of the Interaction, one-element
product), and prints the result.

Prints compact tables; writes ``nn_forward_bench.csv`` (one row per module, precision and
batch) and ``nn_forward_layers.csv`` (one row per step as well) into ``--out``.

Usage (plain ``python3``: NumPy 2, CuPy optional, no torch):
    python3 benchmarks/nn_forward_bench.py --out $OUT
    python3 benchmarks/nn_forward_bench.py --out /tmp/nn --no-gpu --cpu-batches 1,1024,65536
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from hps_core.errors import NotAvailableError
from hps_core.export import DlrmArch, dlrm_network_json
from hps_core.nn import (
    ComputeContext,
    DenseExecutor,
    ForwardProfile,
    NetworkGraph,
    Precision,
    build_graph,
    parse_network_json,
    random_dense_params,
)

#: MLPerf DLRM (Criteo Terabyte). Table row counts do not change the dense network.
MLPERF_DLRM = DlrmArch(
    sparse_feature_size=128,
    embedding_sizes=(1,) * 26,
    bottom_mlp=(13, 512, 256, 128),
    top_mlp=(1024, 1024, 512, 256, 1),
)
BENCH_CSV = "nn_forward_bench.csv"
LAYERS_CSV = "nn_forward_layers.csv"


def mlperf_dlrm_graph() -> NetworkGraph:
    """The MLPerf DLRM network as a graph, from the exporter's network JSON."""
    document = dlrm_network_json(MLPERF_DLRM, [1] * MLPERF_DLRM.num_tables)
    return build_graph(parse_network_json(json.dumps(document), source="mlperf_dlrm.json"))


def random_inputs(
    graph: NetworkGraph, batch: int, seed: int
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Host arrays: ``[batch, 13]`` dense features and ``[batch, 1, 128]`` per embedding."""
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((batch, graph.spec.data.dense_dim), dtype=np.float32)
    pooled = {}
    for node in graph.embeddings:
        shape = (batch, node.layer.slot_num, node.layer.vec_size)
        values = rng.standard_normal(shape, dtype=np.float32)
        values *= node.layer.vec_size**-0.25
        pooled[node.spec.name] = values
    return dense, pooled


class Backend:
    """An array module and how to time work issued through it.

    Args:
        xp: ``numpy`` or ``cupy``.
    """

    def __init__(self, xp: ModuleType) -> None:
        self.xp = xp
        self.gpu = xp.__name__ == "cupy"
        self.device = gpu_name(xp) if self.gpu else cpu_name()

    def sync(self) -> None:
        """Wait for the work issued so far."""
        if self.gpu:
            self.xp.cuda.get_current_stream().synchronize()

    def time_call(self, fn: Callable[[], Any]) -> tuple[float, float]:
        """Seconds of one call: device time (CUDA events; host clock on the CPU) and host time
        around the synchronised call."""
        if not self.gpu:
            start = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - start
            return elapsed, elapsed
        cuda = self.xp.cuda
        start_event, stop_event = cuda.Event(), cuda.Event()
        start = time.perf_counter()
        start_event.record()
        fn()
        stop_event.record()
        stop_event.synchronize()
        host = time.perf_counter() - start
        return cuda.get_elapsed_time(start_event, stop_event) / 1e3, host

    def median_time(self, fn: Callable[[], Any], warmup: int, repeats: int) -> tuple[float, float]:
        """Median device and host seconds of ``fn`` over ``repeats`` calls after ``warmup``."""
        for _ in range(warmup):
            fn()
        self.sync()
        times = [self.time_call(fn) for _ in range(repeats)]
        return statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)


def gpu_name(cupy: ModuleType) -> str:
    """Name of the current GPU."""
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def cpu_name() -> str:
    """CPU model and core count."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model} ({os.cpu_count()} cores)"


def gemm_ceiling(backend: Backend, precision: Precision, size: int, repeats: int) -> float:
    """Median TFLOP/s of a ``size`` x ``size`` GEMM through ``ComputeContext.matmul``."""
    ctx = ComputeContext(backend.xp, precision)
    rng = np.random.default_rng(1)
    a = ctx.cast(backend.xp.asarray(rng.standard_normal((size, size), dtype=np.float32)))
    b = ctx.cast(backend.xp.asarray(rng.standard_normal((size, size), dtype=np.float32)))
    seconds, _ = backend.median_time(lambda: ctx.matmul(a, b), warmup=2, repeats=repeats)
    return 2 * size**3 / seconds / 1e12


def tf32_checks(cupy: ModuleType) -> dict[str, bool]:
    """Whether each kind of TF32 product rounds its operands: sums of 256 terms 1 + 2**-12
    (not a TF32 number) give 256 under TF32 and 256.0625 in float32."""
    ctx = ComputeContext(cupy, Precision.TF32)
    odd = 1 + 2.0**-12
    full, ones, f32 = cupy.full, cupy.ones, cupy.float32
    operands = {
        "gemm": (full((64, 256), odd, f32), ones((256, 64), f32)),
        "batched": (ones((8, 27, 256), f32), full((8, 27, 256), odd, f32).transpose(0, 2, 1)),
        "one-element": (full((1, 256), odd, f32), ones((256, 1), f32)),
    }
    return {kind: bool(cupy.all(ctx.matmul(a, b) == 256.0)) for kind, (a, b) in operands.items()}


def layer_medians(profiles: Sequence[ForwardProfile]) -> list[dict[str, Any]]:
    """Per step: name, layers, type, FLOPs and the median seconds over ``profiles``."""
    rows = []
    for i, first in enumerate(profiles[0].layers):
        rows.append(
            {
                "step": first.step,
                "layers": "+".join(first.layers),
                "type": first.layer_type,
                "flops": first.flops,
                "seconds": statistics.median(p.layers[i].seconds for p in profiles),
            }
        )
    return rows


def errors_against(result: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """Max abs and relative L2 error of ``result`` against ``reference``."""
    diff = result.astype(np.float64) - reference.astype(np.float64)
    return float(np.abs(diff).max()), float(np.linalg.norm(diff) / np.linalg.norm(reference))


def prepare(
    backend: Backend,
    graph: NetworkGraph,
    params: dict,
    precisions: Sequence[Precision],
    args: argparse.Namespace,
) -> tuple[dict[Precision, DenseExecutor], dict[Precision, float], dict[Precision, str]]:
    """Executors (FP32 always, as the accuracy reference), GEMM ceilings and notes per
    precision; a precision the device cannot run is reported and left out."""
    kind = "gpu" if backend.gpu else "cpu"
    gemm_size = args.gemm_size if backend.gpu else args.cpu_gemm_size
    executors: dict[Precision, DenseExecutor] = {}
    ceilings: dict[Precision, float] = {}
    notes: dict[Precision, str] = {}
    for precision in dict.fromkeys([Precision.FP32, *precisions]):
        try:
            executors[precision] = DenseExecutor(graph, params, backend.xp, precision)
        except NotAvailableError as exc:
            print(f"[{kind}] {precision.value}: skipped, {exc}")
            continue
        if precision in precisions:
            ceilings[precision] = gemm_ceiling(backend, precision, gemm_size, args.gemm_repeats)
    if backend.gpu and Precision.TF32 in executors:
        checks = tf32_checks(backend.xp)
        verdict = ", ".join(f"{k} {'yes' if ok else 'NO'}" for k, ok in checks.items())
        print(f"[gpu] TF32 products round their operands to TF32: {verdict}")
        notes[Precision.TF32] = " ".join(f"{k}:{'ok' if ok else 'NO'}" for k, ok in checks.items())
    return executors, ceilings, notes


def measure(
    backend: Backend,
    executor: DenseExecutor,
    inputs: tuple[Any, dict[str, Any]],
    reference: np.ndarray,
    ceiling: float,
    args: argparse.Namespace,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One precision at one batch: the bench row and its per-layer rows."""
    dense, pooled = inputs
    batch = int(dense.shape[0])
    repeats = args.repeats if backend.gpu else args.cpu_repeats
    predictions = executor.forward(dense, pooled)
    outputs = backend.xp.asnumpy(predictions) if backend.gpu else predictions
    seconds, host_seconds = backend.median_time(
        partial(executor.forward, dense, pooled), args.warmup, repeats
    )
    profiles = [executor.profile(dense, pooled) for _ in range(args.profile_repeats)]
    layers = layer_medians(profiles)
    layer_sum = sum(row["seconds"] for row in layers)
    flops = profiles[0].flops
    max_abs, rel_l2 = errors_against(outputs, reference)
    tflops = flops / seconds / 1e12
    common = {
        "xp": backend.xp.__name__,
        "device": backend.device,
        "precision": executor.ctx.precision.value,
        "batch": batch,
    }
    bench = {
        **common,
        "repeats": repeats,
        "median_ms": round(seconds * 1e3, 4),
        "host_ms": round(host_seconds * 1e3, 4),
        "samples_per_s": round(batch / seconds),
        "gflop_per_pass": round(flops / 1e9, 4),
        "tflops": round(tflops, 4),
        "ceiling_tflops": round(ceiling, 3),
        "ceiling_fraction": round(tflops / ceiling, 4),
        "layer_sum_ms": round(layer_sum * 1e3, 4),
        "max_abs_vs_fp32": max_abs,
        "rel_l2_vs_fp32": rel_l2,
    }
    layer_rows = [
        {
            **common,
            "step": row["step"],
            "layers": row["layers"],
            "type": row["type"],
            "median_ms": round(row["seconds"] * 1e3, 4),
            "share_of_layers": round(row["seconds"] / max(layer_sum, 1e-12), 4),
            "gflop": round(row["flops"] / 1e9, 6),
            "tflops": round(row["flops"] / max(row["seconds"], 1e-12) / 1e12, 4),
        }
        for row in layers
    ]
    return bench, layer_rows


def run_backend(
    backend: Backend,
    graph: NetworkGraph,
    params: dict,
    precisions: Sequence[Precision],
    batches: Sequence[int],
    args: argparse.Namespace,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Measure every precision and batch on one backend; return the bench and layer rows."""
    xp, kind = backend.xp, "gpu" if backend.gpu else "cpu"
    executors, ceilings, notes = prepare(backend, graph, params, precisions, args)
    host_dense, host_pooled = random_inputs(graph, max(batches), args.seed)
    bench_rows: list[dict[str, Any]] = []
    layer_rows: list[dict[str, Any]] = []
    for batch in batches:
        inputs = (
            xp.asarray(host_dense[:batch]),
            {name: xp.asarray(v[:batch]) for name, v in host_pooled.items()},
        )
        reference = executors[Precision.FP32].forward(*inputs)
        reference = xp.asnumpy(reference) if backend.gpu else reference
        for precision in (p for p in precisions if p in executors):
            bench, layers = measure(
                backend, executors[precision], inputs, reference, ceilings[precision], args
            )
            bench["note"] = notes.get(precision, "")
            bench_rows.append(bench)
            layer_rows += layers
            print(
                f"[{kind}] {precision.value:>4} batch {batch:>6}: {bench['median_ms']:10.3f} ms, "
                f"{bench['tflops']:8.3f} TFLOP/s ({bench['ceiling_fraction']:.1%} of the GEMM "
                f"ceiling), max |err| vs fp32 {bench['max_abs_vs_fp32']:.1e}"
            )
    return bench_rows, layer_rows


def print_tables(bench_rows: Sequence[dict], layer_rows: Sequence[dict]) -> None:
    """The whole-pass table, then per (module, precision) the steps at the largest batch."""
    head = ("xp", "prec", "batch", "ms", "host ms", "samples/s", "GFLOP", "TFLOP/s",
            "ceiling", "of ceil", "max|err|", "rel L2")  # fmt: skip
    print("\n" + "  ".join(f"{h:>10}" for h in head))
    for r in bench_rows:
        cells = (r["xp"], r["precision"], r["batch"], f"{r['median_ms']:.3f}",
                 f"{r['host_ms']:.3f}", r["samples_per_s"], f"{r['gflop_per_pass']:.3f}",
                 f"{r['tflops']:.3f}", f"{r['ceiling_tflops']:.1f}",
                 f"{r['ceiling_fraction']:.1%}", f"{r['max_abs_vs_fp32']:.2e}",
                 f"{r['rel_l2_vs_fp32']:.2e}")  # fmt: skip
        print("  ".join(f"{c:>10}" for c in cells))
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in layer_rows:
        groups.setdefault((r["xp"], r["precision"]), []).append(r)
    for (xp, precision), rows in groups.items():
        largest = max(r["batch"] for r in rows)
        print(f"\n{xp} {precision}, batch {largest}: per layer")
        for r in merge_data_movement(r for r in rows if r["batch"] == largest):
            print(
                f"  {r['layers']:<44} {r['type']:<34} {r['median_ms']:>9.3f} ms "
                f"{r['share_of_layers']:>6.1%} {r['tflops']:>8.3f} TFLOP/s"
            )


def merge_data_movement(rows: Iterable[dict]) -> list[dict]:
    """Runs of consecutive zero-FLOP steps of one type (the 26 embedding layers) as one row."""
    merged: list[dict] = []
    for row in rows:
        last = merged[-1] if merged else None
        if last and row["gflop"] == 0 == last["gflop"] and row["type"] == last["type"]:
            last["steps"] += 1
            last["layers"] = f"{last['first']} .. {row['layers']} ({last['steps']})"
            last["median_ms"] += row["median_ms"]
            last["share_of_layers"] += row["share_of_layers"]
        else:
            merged.append({**row, "steps": 1, "first": row["layers"]})
    return merged


def write_csv(path: Path, rows: Sequence[dict]) -> None:
    """Write ``rows`` (dicts with the same keys) as CSV."""
    if not rows:
        return
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def parse_ints(text: str) -> list[int]:
    """``"1,1024"`` -> ``[1, 1024]``."""
    return [int(v) for v in text.split(",") if v]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench_results", help="folder for the CSV files")
    parser.add_argument("--batches", default="1,1024,65536", help="GPU batch sizes")
    parser.add_argument("--cpu-batches", default="1,1024", help="CPU batch sizes")
    parser.add_argument("--precisions", default="fp32,tf32,fp16")
    parser.add_argument("--repeats", type=int, default=30, help="timed passes on the GPU")
    parser.add_argument("--cpu-repeats", type=int, default=5, help="timed passes on the CPU")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profile-repeats", type=int, default=3)
    parser.add_argument("--gemm-size", type=int, default=8192, help="GPU ceiling GEMM size")
    parser.add_argument("--cpu-gemm-size", type=int, default=2048, help="CPU ceiling GEMM size")
    parser.add_argument("--gemm-repeats", type=int, default=5)
    parser.add_argument("--no-cpu", action="store_true", help="skip NumPy")
    parser.add_argument("--no-gpu", action="store_true", help="skip CuPy")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    precisions = [Precision.parse(p) for p in args.precisions.split(",") if p]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    graph = mlperf_dlrm_graph()
    params = random_dense_params(graph.dense_layout(), seed=args.seed)
    backends = [] if args.no_cpu else [(Backend(np), parse_ints(args.cpu_batches))]
    if not args.no_gpu:
        try:
            import cupy

            if cupy.cuda.runtime.getDeviceCount() > 0:
                backends.append((Backend(cupy), parse_ints(args.batches)))
        except Exception as exc:  # no CuPy, no driver or no device: report and go on
            print(f"[gpu] skipped: {type(exc).__name__}: {exc}")
    for backend, _ in backends:
        print(f"[{'gpu' if backend.gpu else 'cpu'}] {backend.xp.__name__} on {backend.device}")

    bench_rows: list[dict] = []
    layer_rows: list[dict] = []
    for backend, batches in backends:
        rows, layers = run_backend(backend, graph, params, precisions, batches, args)
        bench_rows += rows
        layer_rows += layers
    print_tables(bench_rows, layer_rows)
    write_csv(out_dir / BENCH_CSV, bench_rows)
    write_csv(out_dir / LAYERS_CSV, layer_rows)
    print(f"\nwrote {out_dir / BENCH_CSV} and {out_dir / LAYERS_CSV}")


if __name__ == "__main__":
    main()
