"""Served: TorchRec's own ``DLRM_DCN`` at MLPerf DLRM-v2's shape, its EmbeddingBagCollection
swapped for ``hps_core.hps_torchrec.EmbeddingBagCollection``, predicts as with TorchRec's tables.

The model is ``client_examples/torch/dlrm_dcn.py`` at ``mlperf(--max-rows)``: 26 tables of dim
128 with MLPerf's multi-hot sizes (214 ids a sample), MLPerf's rows capped at ``--max-rows``,
dense arch 512-256-128 over 13 dense features, DCN v2 of 3 layers of rank 512, over arch
1024-1024-512-256-1. With seeded random weights (``torch.manual_seed``) and TorchRec's own
tables, its state dict is saved, ``hps convert torchrec`` writes the tables and a ps.json,
``hps repo-torch --module dlrm_dcn.py:build_mlperf`` the Triton model folder, and a real
tritonserver serves it. Requests of 1, 64 and 1024 samples (random ids of each table's rows,
some repeated across samples and within bags, first and last rows included) go over gRPC; the
scores must equal the in-process TorchRec-tables module's within ``--tolerance`` (1e-5, FP32),
else the script exits 1.

The tables' rows are drawn from N(0, ``--table-std``) so that every table matters:
``min_table_effect`` is the least change of a request's scores when one table's ids are drawn
again. (TorchRec's own init, ``--table-std 0``, leaves a capped table's rows so small that its
ids move the scores by less than the tolerance.)

Then perf_analyzer (gRPC, ``-b`` samples a request) measures the served model's samples/s at
each ``--samples`` and ``--concurrency`` (``--instances`` instances, one BLAS thread each, as
``TritonServer`` starts them), and the eager in-process modules (TorchRec's tables; the HPS's
tables) are timed at the same batches, at one thread and at torch's default, once the server is
gone; ``vs_eager_torchrec`` divides by the faster eager TorchRec.

Usage::

    cd benchmarks && ../.venv/bin/python torchrec_dlrm_dcn_mlperf.py --out /tmp/mlperf_out

``--kind KIND_GPU`` serves on a GPU (the TorchRec reference stays on the CPU).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
import tritonclient.grpc as grpcclient
from ranking_serve_vs_pytorch import measure
from result_table import write_results
from torch_model_serve import write_input

from hps_core.cli.main import main as hps_main
from hps_core.hps import HPS
from hps_core.server.perf import PerfAnalyzerError, run_perf_analyzer
from hps_core.server.process import TritonServer
from hps_core.torch_repo import is_table_weight

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parent / "client_examples" / "torch" / "dlrm_dcn.py"
MODEL = "dlrm_dcn"
CHECK_SAMPLES = (1, 64, 1024)
"""Samples of the requests whose scores are compared."""


def load_example() -> ModuleType:
    """client_examples/torch/dlrm_dcn.py as a module (it is not a package).

    Returns:
        The module, registered in ``sys.modules`` (its dataclass needs that).
    """
    spec = importlib.util.spec_from_file_location("dlrm_dcn_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as Triton's loader does (dataclasses look it up)
    spec.loader.exec_module(module)
    return module


def with_repeats(request: dict[str, np.ndarray], shape: Any) -> dict[str, np.ndarray]:
    """``request`` with ids repeated and the tables' edges read.

    Args:
        request: ``dense`` and ``sparse`` of ``sample_inputs``.
        shape: the example's ``DlrmDcnShape``.

    Returns:
        A copy where sample 1 carries sample 0's ids, every multi-hot bag of sample 0 holds its
        first id twice, and (from 4 samples) the last two samples read each table's first and
        last rows.
    """
    sparse = request["sparse"].copy()
    starts = np.cumsum((0, *shape.hotness))
    if len(sparse) > 1:
        sparse[1] = sparse[0]
    for start, hot, rows in zip(starts, shape.hotness, shape.rows, strict=False):
        if hot > 1:
            sparse[0, start + 1] = sparse[0, start]
        if len(sparse) > 3:
            sparse[-2, start] = 0
            sparse[-1, start + hot - 1] = rows - 1
    return {"dense": request["dense"], "sparse": sparse}


def check_layout(
    example: ModuleType, shape: Any, reference: torch.nn.Module, rng: np.random.Generator
) -> float:
    """The served module's packing of ``sparse`` against a KeyedJaggedTensor built id by id
    (the HPS-vs-TorchRec comparison goes through the same packing, so it would not see it).

    Args:
        example: dlrm_dcn.py.
        shape: its ``DlrmDcnShape``.
        reference: the served module with TorchRec's tables.
        rng: the random generator.

    Returns:
        The largest difference of ``reference`` and its DLRM_DCN on that KJT (5 samples).
    """
    from torchrec import KeyedJaggedTensor

    request = with_repeats(example.sample_inputs(rng, 5, shape), shape)
    starts = np.cumsum((0, *shape.hotness))
    values = [int(request["sparse"][s, starts[t] + j])
              for t, hot in enumerate(shape.hotness)
              for s in range(5) for j in range(hot)]  # fmt: skip
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"cat_{t}" for t in range(len(shape.hotness))],
        values=torch.tensor(values, dtype=torch.int64),
        lengths=torch.tensor([hot for hot in shape.hotness for _ in range(5)], dtype=torch.int32),
    )
    dense = torch.from_numpy(request["dense"])
    with torch.no_grad():
        want = torch.sigmoid(reference.dlrm(dense, kjt))
        got = reference(dense, torch.from_numpy(request["sparse"]))
    return float((got - want).abs().max())


def table_effects(
    reference: torch.nn.Module, request: dict[str, np.ndarray], shape: Any,
    rng: np.random.Generator,
) -> list[float]:  # fmt: skip
    """How far a wrong row of each table would move the scores.

    Args:
        reference: the served module with TorchRec's tables.
        request: ``dense`` and ``sparse``.
        shape: the example's ``DlrmDcnShape``.
        rng: the random generator.

    Returns:
        Per table, the largest change of the request's scores when that table's ids are drawn
        again.
    """
    tensors = {k: torch.from_numpy(v) for k, v in request.items()}
    starts = np.cumsum((0, *shape.hotness))
    found = []
    with torch.no_grad():
        base = reference(**tensors)
        for start, hot, rows in zip(starts, shape.hotness, shape.rows, strict=False):
            sparse = request["sparse"].copy()
            sparse[:, start : start + hot] = rng.integers(0, rows, (len(sparse), hot))
            moved = reference(dense=tensors["dense"], sparse=torch.from_numpy(sparse))
            found.append(float((moved - base).abs().max()))
    return found


def ask(client: grpcclient.InferenceServerClient, request: dict[str, np.ndarray]) -> np.ndarray:
    """The served scores of ``request``.

    Args:
        client: a gRPC client of the server.
        request: ``dense`` and ``sparse``.

    Returns:
        float32 ``[samples, 1]``.
    """
    inputs = []
    for name, array in request.items():
        kind = "FP32" if array.dtype == np.float32 else "INT64"
        tensor = grpcclient.InferInput(name, list(array.shape), kind)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return client.infer(MODEL, inputs).as_numpy("score")


def eager_samples_per_s(
    module: torch.nn.Module, found: list[dict[str, np.ndarray]], min_s: float
) -> float:
    """Samples/s of ``module`` in this process.

    Args:
        module: the module, called on ``found``'s requests in turn after two warm-up forwards.
        found: requests of ``dense`` and ``sparse``.
        min_s: the least seconds timed (and at least 5 forwards).

    Returns:
        Samples a second.
    """
    tensors = [{k: torch.from_numpy(v) for k, v in r.items()} for r in found]
    with torch.no_grad():
        for request in tensors[:2]:
            module(**request)
        done, samples, began = 0, 0, time.perf_counter()
        while done < 5 or time.perf_counter() - began < min_s:
            request = tensors[done % len(tensors)]
            module(**request)
            done, samples = done + 1, samples + len(request["dense"])
        return samples / (time.perf_counter() - began)


def machine() -> str:
    """The machine, in words.

    Returns:
        The CPU's model and cores (and the GPU's name, where one is).
    """
    cpu = platform.processor() or "cpu"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    found = f"{cpu}, {os.cpu_count()} cores"
    if torch.cuda.is_available():
        found += f", {torch.cuda.get_device_name(0)}"
    return found


def main() -> int:
    """Run the check and the measurements.

    Returns:
        0, or 1 where a score differs by more than ``--tolerance``.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-rows", type=int, default=100_000,
                        help="most rows of a table (MLPerf's largest have 40M)")  # fmt: skip
    parser.add_argument("--kind", default="KIND_CPU", choices=("KIND_CPU", "KIND_GPU"))
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--samples", default="1,256", help="samples a request, measured")
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--distinct-samples", type=int, default=2048,
                        help="different samples in perf_analyzer's input")  # fmt: skip
    parser.add_argument("--window-ms", type=int, default=1000)
    parser.add_argument("--window-requests", type=int, default=30,
                        help="requests a perf_analyzer window (count_windows)")  # fmt: skip
    parser.add_argument("--stability", type=float, default=25.0)
    parser.add_argument("--eager-s", type=float, default=3.0, help="seconds an eager timing")
    parser.add_argument("--tolerance", type=float, default=1e-5)
    parser.add_argument(
        "--table-std", type=float, default=1.0,
        help="tables' rows drawn from N(0, std); 0 keeps TorchRec's init (uniform within "
        "1/sqrt(rows): a capped table's ids then move the scores by less than 1e-5)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.samples.split(",")]
    levels = [int(c) for c in args.concurrency.split(",")]
    max_batch = max(*CHECK_SAMPLES, *(s * max(levels) for s in sizes))
    example = load_example()
    shape = example.mlperf(args.max_rows)
    where = machine()
    print(f"machine: {where}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"MLPerf DLRM-v2 shape, rows capped at --max-rows {args.max_rows:,}: "
          f"{len(shape.rows)} tables x dim {shape.dim}, {sum(shape.rows):,} rows "
          f"({sum(shape.rows) * shape.dim * 4 / 1e9:.2f} GB FP32), {shape.sparse_width} ids "
          f"a sample; capped tables: "
          f"{sum(r > args.max_rows for r in example.MLPERF_ROWS)}")  # fmt: skip

    torch.manual_seed(args.seed)
    began = time.perf_counter()
    tables = example.torchrec_collection(shape)
    if args.table_std > 0:
        for bag in tables.embedding_bags.values():
            torch.nn.init.normal_(bag.weight, 0.0, args.table_std)
    reference = example.served_module(tables, shape).eval()
    print(f"TorchRec model built in {time.perf_counter() - began:.1f} s")
    rng = np.random.default_rng(args.seed)
    layout = check_layout(example, shape, reference, rng)
    print(f"sparse packing vs a KeyedJaggedTensor built id by id: max abs diff {layout:.3g}")
    if layout > args.tolerance:
        print("FAILED: the served module packs the sparse ids wrongly", file=sys.stderr)
        return 1
    base = dict(kind=args.kind, max_rows=args.max_rows, machine=where)
    results, failed = [], []
    with tempfile.TemporaryDirectory(prefix="hps-torchrec-mlperf-") as tmp:
        weights, tables, repo = Path(tmp) / "model.pt", Path(tmp) / "tables", Path(tmp) / "repo"
        torch.save(reference.state_dict(), weights)
        hotness = "-".join(str(h) for h in shape.hotness)
        assert hps_main(["convert", "torchrec", "--state-dict", str(weights), "--model-name",
                         MODEL, "--out", str(tables), "--max-keys-per-table", hotness,
                         "--max-batch-size", str(max_batch)]) == 0  # fmt: skip
        ps_json = tables / "ps.json"
        inputs = [arg for spec in shape.inputs for arg in ("--input", spec)]
        assert hps_main(["repo-torch", str(ps_json), str(repo), "--model", MODEL,
                         "--module", f"{EXAMPLE}:build_mlperf", "--state-dict", str(weights),
                         *inputs, "--kind", args.kind, "--instances", str(args.instances),
                         "--max-batch-size", str(max_batch)]) == 0  # fmt: skip
        perf_inputs = {}
        for samples in sizes:
            count = max(4, args.distinct_samples // samples)
            found = [example.sample_inputs(rng, samples, shape) for _ in range(count)]
            perf_inputs[samples] = (Path(tmp) / f"input_{samples}.json", found)
            write_input(found, perf_inputs[samples][0])

        began = time.perf_counter()
        with TritonServer(repo, startup_timeout_s=600, log_file=args.out / "server.log") as server:
            print(f"tritonserver ready in {time.perf_counter() - began:.1f} s "
                  f"({args.instances} {args.kind} instances)")  # fmt: skip
            client = grpcclient.InferenceServerClient(server.grpc_url.removeprefix("grpc://"))
            try:
                for samples in CHECK_SAMPLES:
                    request = with_repeats(example.sample_inputs(rng, samples, shape), shape)
                    got = ask(client, request)
                    with torch.no_grad():
                        want = reference(**{k: torch.from_numpy(v) for k, v in request.items()})
                    diff = float(np.abs(got.reshape(want.shape) - want.numpy()).max())
                    print(f"{samples} samples: scores {got.min():.4f} to {got.max():.4f}")
                    ok = got.shape == (samples, 1) and diff <= args.tolerance
                    effects = table_effects(reference, request, shape, rng)
                    weakest = int(np.argmin(effects))
                    verdict = "ok" if ok else "FAILED"
                    print(f"{samples} samples: max abs diff {diff:.3g} ({verdict}, "
                          f"tolerance {args.tolerance:g}); redrawing one table's ids moves "
                          f"the scores by {min(effects):.3g} (t_cat_{weakest}) to "
                          f"{max(effects):.3g}")  # fmt: skip
                    if min(effects) < 10 * args.tolerance:
                        print(f"  WEAK: t_cat_{weakest}'s ids move the scores by less than "
                              "10x the tolerance (raise --table-std)")  # fmt: skip
                    if not ok:
                        failed.append(samples)
                    results.append(dict(base, measure="max_abs_diff", model="served vs torchrec",
                                        samples=samples, max_abs_diff=diff,
                                        min_table_effect=min(effects)))  # fmt: skip
            finally:
                client.close()
            logs = []
            for samples, (data, _) in perf_inputs.items():
                # Windows of at least --window-requests requests (perf_analyzer's count
                # windows): a short time window holds too few 256-sample requests on 2 cores
                # for p99 to settle.
                extra = ["--measurement-mode", "count_windows",
                         "--measurement-request-count", str(args.window_requests)]  # fmt: skip
                stable = True
                try:
                    found, log = measure(MODEL, server.grpc_url, data, levels, args, extra, samples)
                except PerfAnalyzerError as exc:  # noisy machine: one unchecked measurement
                    first = str(exc).splitlines()[0]
                    print(f"{samples} samples: no stable measurement ({first}); measured "
                          "once without the stability check")  # fmt: skip
                    stable = False
                    found, log = run_perf_analyzer(
                        MODEL, server.grpc_url, "grpc", data, levels,
                        measurement_ms=args.window_ms, stability_percent=100.0, max_trials=3,
                        extra_args=extra, batch_size=samples,
                    )  # fmt: skip
                logs.append(log)
                for r in found:
                    results.append(dict(base, measure="samples_per_s", model="served_triton",
                                        threads=1, samples=samples, concurrency=r.concurrency,
                                        samples_per_s=r.throughput, p50_ms=r.p50_us / 1e3,
                                        p99_ms=r.p99_us / 1e3, stable=stable))  # fmt: skip
        (args.out / "perf_analyzer.log").write_text("\n".join(logs))

        # Eager, in this process, once the server is gone (its cores free).
        hps_tables = example.build_mlperf(str(ps_json), MODEL).eval()
        dense = {k: v for k, v in reference.state_dict().items() if not is_table_weight(k)}
        hps_tables.load_state_dict(dense, strict=True)
        threads = torch.get_num_threads()
        try:
            for name, module in (("eager_torchrec", reference), ("eager_hps_tables", hps_tables)):
                for count in sorted({1, threads}):
                    torch.set_num_threads(count)
                    for samples, (_, found) in perf_inputs.items():
                        rate = eager_samples_per_s(module, found, args.eager_s)
                        results.append(dict(base, measure="samples_per_s", model=name,
                                            threads=count, samples=samples, concurrency=1,
                                            samples_per_s=rate))  # fmt: skip
        finally:
            torch.set_num_threads(threads)
            HPS.close_all()

    eager: dict[int, float] = {}  # the faster of eager TorchRec's thread counts, per batch
    for r in results:
        if r["model"] == "eager_torchrec":
            eager[r["samples"]] = max(eager.get(r["samples"], 0.0), r["samples_per_s"])
    for r in results:
        if r["measure"] == "samples_per_s" and r["samples"] in eager:
            r["vs_eager_torchrec"] = r["samples_per_s"] / eager[r["samples"]]
    print(f"\n{args.instances} {args.kind} instances (one BLAS thread each); eager: this "
          f"process; vs_eager_torchrec: against eager TorchRec "
          f"at its faster thread count; rows capped at {args.max_rows:,}; {where}")  # fmt: skip
    columns = ["measure", "model", "threads", "samples", "concurrency", "samples_per_s",
               "vs_eager_torchrec", "p50_ms", "p99_ms", "stable", "max_abs_diff",
               "min_table_effect", "kind", "max_rows", "machine"]  # fmt: skip
    write_results(args.out / "torchrec_dlrm_dcn_mlperf.csv", columns, results)
    if failed:
        print(f"FAILED: scores differ by more than {args.tolerance:g} at {failed} samples",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
