"""A ranking batch on the GPU: hps-triton's pipeline against the PyTorch DLRM a user would write.

Model: a ps.json ranking model as ``make_large_dlrm.py`` writes it (``--ps-json``; key ``i``
is row ``i``): MLPerf's DLRM (26 one-hot tables of dim 128, dot interaction) or, written with
``--dcnv2``, MLPerf's DLRM-v2 (26 tables of a fixed hotness each, 214 keys per sample, DCN v2
cross layers). Keys are drawn Zipf(``--alpha``) over each table's rows, dense features
uniform, on the host (what Triton hands over) as the samples contract gives them: a
:class:`~hps_core.infer.SparseBatch` keeping the ``[B, K]`` key matrix.

hps-triton: :class:`~hps_core.infer.RankingSession` on GPU 0 (the CUDA-graph pipeline of
:mod:`hps_core.infer.gpu.pipeline`), for each cache setting (``--caches``: ``gpucacheper`` values
and ``static``), after ``--warmup`` warm-up batches of 16,384 samples; predict() returns host
scores, so each timed call is keys in -> scores out, synchronised.

The peer: the same network in PyTorch (``torch_dlrm.py``) with every table whole on the GPU
(``nn.EmbeddingBag`` per table, fed with offsets for multi-hot tables), the bottom MLP, the
interaction (HugeCTR's dot interaction, or the low-rank cross layers as matmuls), the top MLP
and a sigmoid, with the same weights; inputs copied from pinned host buffers with
``non_blocking=True``; eager, and replayed from a CUDA graph per batch size. Both compute the
same function: the script checks their scores agree before timing.

Also, for the first cache setting and for the eager peer, the same batches already on the GPU
(``inputs`` = gpu: CuPy arrays handed to ``predict``, as HugeCTR's ``lookup_fromdlpack`` takes
keys; torch tensors on the GPU for the peer), so no host copy is timed.

Precisions (``--precisions``): ``fp32`` (large products as 3xTF32, see
:mod:`hps_core.cuda.linear`), ``fp32-sgemm`` (every FP32 product on SGEMM), ``tf32``; the peer
runs strict FP32 for both FP32 rows. Storage (``--storage``): the precision hps-triton stores
its tables in (every tier; ps.json ``storage_precision``); the peer always holds FP32 tables
on the GPU, and the miss bytes count stored rows.

Per (batch, precision): median over ``--runs`` calls, each on a fresh batch for hps-triton (a
batch seen before would find its keys in the cache); ms, samples/s, ratio to the eager and to
the graphed peer (and to the peer given the same kind of inputs), key-occurrence and unique-key
hit rate and the rows read from host memory (``hps_host_rows_read_total``) of the timed
batches, GPU memory. Also the GPU time of the pipeline's three graphs (lookup, insert, dense)
from CUDA events on three more fresh batches, with the bytes of the rows each of them read
from host memory, the PCIe floor those bytes imply at the pinned host-to-device copy rate
measured in the same run, and the lookup's time over that floor (medians of the three); and
of each step run without graphs (``GpuRankingPipeline.profile``: upload, lookup, insert,
forward, download).
Writes ``ranking_vs_pytorch.csv`` and a plot (with matplotlib) under ``--out``.

Usage:
    python benchmarks/make_large_dlrm.py --out /tmp/dlrm --max-rows-per-table 1000000 \\
        --max-batch-size 65536
    python benchmarks/ranking_vs_pytorch.py --ps-json /tmp/dlrm/ps.json --out $OUT
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import cupy
import numpy as np
import torch
from ps_variant import ps_variant
from result_table import write_results
from torch_dlrm import TorchDlrm, torch_peer

from hps_core.config import load_ps_config
from hps_core.hps import HPS
from hps_core.infer import RankingLayout, RankingSession, SparseBatch, load_ranking_graph
from hps_core.infer.gpu import pipeline as gpu_pipeline
from hps_core.infer.gpu.buckets import grouped
from hps_core.infer.gpu.staging import bucket_for
from hps_core.quant import RowFormat
from hps_core.workload import zipf_keys

WARMUP_BATCH = 16384


class PeerRunner:
    """The peer as a careful user runs it: pinned inputs, non-blocking copies, optionally
    replayed from a CUDA graph per batch size."""

    def __init__(self, net: TorchDlrm, graphs: bool) -> None:
        self.net = net
        self.graphs = graphs
        self._state: dict[int, Any] = {}

    def __call__(self, dense: np.ndarray, keys: np.ndarray) -> np.ndarray:
        batch = dense.shape[0]
        state = self._state.get(batch)
        if state is None:
            state = self._state[batch] = self._prepare(dense, keys)
        pin_dense, pin_keys, dev_dense, dev_keys, graph, out = state
        pin_dense.numpy()[:] = dense
        pin_keys.numpy()[:] = keys
        dev_dense.copy_(pin_dense, non_blocking=True)
        dev_keys.copy_(pin_keys, non_blocking=True)
        with torch.no_grad():
            if graph is not None:
                graph.replay()
                result = out
            else:
                result = self.net(dev_dense, dev_keys)
        return result.cpu().numpy()

    def _prepare(self, dense: np.ndarray, keys: np.ndarray):
        pin_dense = torch.from_numpy(dense.copy()).pin_memory()
        pin_keys = torch.from_numpy(keys.copy()).pin_memory()
        dev_dense, dev_keys = pin_dense.cuda(), pin_keys.cuda()
        graph = out = None
        if self.graphs:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.no_grad():
                for _ in range(3):
                    self.net(dev_dense, dev_keys)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph), torch.no_grad():
                out = self.net(dev_dense, dev_keys)
        return pin_dense, pin_keys, dev_dense, dev_keys, graph, out


def peer_on_gpu(net: TorchDlrm, dense: Any, keys: Any) -> np.ndarray:
    """The eager peer on inputs already on the GPU."""
    with torch.no_grad():
        return net(dense, keys).cpu().numpy()


def device_batch(sparse: SparseBatch) -> SparseBatch:
    """``sparse`` with every array copied to GPU 0 (CuPy), as a caller holding its keys on the
    GPU hands them over."""
    widths = [k.shape[1] for k in sparse.keys]
    return SparseBatch.from_sample_keys(
        cupy.asarray(sparse.dense), cupy.asarray(sparse.sample_keys), widths, sparse.hotness
    )


def make_batch(
    rng: np.random.Generator, rows: list[int], batch: int, alpha: float, layout: RankingLayout
):
    """Dense features, the ``[batch, K]`` key matrix (each table's keys Zipf over its rows)
    and the batch the samples contract makes of them (no offsets, one key matrix)."""
    widths = [t.sample_width for t in layout.tables]
    keys = np.concatenate(
        [
            zipf_keys(rng, batch * w, r, alpha, permutation_seed=t).reshape(batch, w)
            for t, (r, w) in enumerate(zip(rows, widths, strict=True))
        ],
        axis=1,
    )
    dense = rng.random((batch, layout.dense_dim), dtype=np.float32)
    sparse = SparseBatch.from_sample_keys(dense, keys, widths, layout.hotness)
    return dense, keys, sparse


def pcie_rate(nbytes: int = 1 << 28, runs: int = 5) -> float:
    """Bytes per second of a pinned host-to-device copy of ``nbytes`` (median of ``runs``)."""
    host = cupy.cuda.alloc_pinned_memory(nbytes)
    device = cupy.empty(nbytes, dtype=cupy.uint8)
    times = []
    for _ in range(runs + 1):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        cupy.cuda.runtime.memcpyAsync(device.data.ptr, host.ptr, nbytes, 1, 0)
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return nbytes / statistics.median(times[1:])


def variant(ps_json: Path, cache: str, storage: str = "fp32") -> Path:
    """The model with ``cache`` and ``storage`` (:func:`ps_variant`), batches up to 65,536."""
    return ps_variant(ps_json, cache, storage, min_batch_size=65536)


def timed(fn, calls: list[tuple], runs: int) -> float:
    """Median seconds of ``runs`` calls of ``fn``, cycling through the argument tuples."""
    times = []
    for i in range(runs):
        args = calls[i % len(calls)]
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def settle(session: RankingSession, rng: Any, rows: Any, batch: int, alpha: float, layout) -> str:
    """Predict fresh batches of ``batch`` samples until each bucket has chosen how it stages
    and scores a large batch (its first batches time both schedules of each choice:
    hps_core.infer.gpu.schedule), so that the timed batches run the chosen ones; returns the
    choices of this batch's bucket ("staged whole", or how a batch staged in parts is scored)."""
    pipe = session.pipeline
    for _ in range(32):
        if pipe.schedules_chosen():
            break
        session.predict(make_batch(rng, rows, batch, alpha, layout)[2])
    size = bucket_for(batch)
    if pipe.staged_whole(size):
        return "staged whole"
    return "by part" if pipe.scored_by_part(size) else "whole"


def unique_hit_rate(session: RankingSession, sparse: SparseBatch) -> float:
    """Share of the distinct (table, key) pairs of ``sparse`` the GPU holds now."""
    hits = total = 0
    for t in range(len(sparse.keys)):
        table = session.lookup.table(t)
        unique = np.unique(sparse.keys[t])
        total += len(unique)
        cache = getattr(table, "cache", None)
        if cache is None or not hasattr(cache, "dump"):
            hits += len(unique) if cache is not None else 0
            continue
        hits += int(np.count_nonzero(np.isin(unique, cache.dump().get())))
    return hits / total if total else 0.0


def counted(before: list, after: list, row_bytes: list[int]) -> tuple[int, int, int, int]:
    """Cache hits, keys, rows read from host memory and their stored bytes between two
    readings of ``session.lookup.counters()``."""
    pairs = list(zip(after, before, strict=True))
    host = [a.host_rows - b.host_rows for a, b in pairs]
    return (
        sum(a.cache_hits - b.cache_hits for a, b in pairs),
        sum(a.keys - b.keys for a, b in pairs),
        sum(host),
        sum(h * n for h, n in zip(host, row_bytes, strict=True)),
    )


def host_bucket(pipe: Any, samples: int) -> Any:
    """The bucket ``predict`` runs a host batch of ``samples`` samples in: for a size whose
    trial chose to stage large batches whole, the bucket of that size that stages whole."""
    size = bucket_for(samples)
    return pipe._bucket(size, whole=pipe.staged_whole(size))


def graph_times(session: RankingSession, sparse: SparseBatch) -> tuple[float, float, float]:
    """GPU ms of the lookup, insert and dense (with its dense-only prefix) graphs for this
    batch, after its whole copy, one after the other (CUDA events; the batch's misses are
    inserted, as in predict())."""
    pipe = session.pipeline
    bucket = host_bucket(pipe, sparse.batch_size)
    events = [cupy.cuda.Event() for _ in range(4)]
    stream, cache = pipe._stream, pipe._cache_stream
    graphs = bucket.graphs
    # The parts predict() looks up a host batch in: ranges of samples for a sample-major
    # batch in a grouped bucket, else groups of tables.
    rows = pipe.placement.row_parts(bucket.layout.size, grouped(bucket))
    by_rows = bool(rows) and gpu_pipeline._ROW_PARTS and pipe._uploader.sample_major(sparse)
    parts = rows if by_rows else pipe.placement.parts(bucket.layout.size, grouped(bucket))
    with cupy.cuda.Device(0), stream:
        pipe._uploader.stage_and_upload(bucket, sparse)
        events[0].record(stream)
        # The parts' finds and poolings as predict() launches them (cache and pool streams).
        with cache, pipe.bank.section():
            cache.wait_event(events[0])
            for index, part in enumerate(parts):
                pipe._launch_lookup(bucket, index, part, by_rows)
            pipe._join_pools()
            events[1].record(cache)
            graphs.insert.launch(cache)
            events[2].record(cache)
        stream.wait_event(events[2])
        if graphs.prefix is not None:
            graphs.prefix.launch(stream)
        graphs.dense.launch(stream)
        events[3].record(stream)
        events[3].synchronize()
    lookup_ms, insert_ms, dense_ms = (
        cupy.cuda.get_elapsed_time(a, b) for a, b in itertools.pairwise(events)
    )
    return lookup_ms, insert_ms, dense_ms


def profile(session, rng, rows, batch, args, layout, precision) -> None:
    """cProfile of predict() on fresh batches, from the host and with the inputs already on
    the GPU: where the host's time goes."""
    import cProfile
    import pstats

    batches = [make_batch(rng, rows, batch, args.alpha, layout)[2] for _ in range(50)]
    for inputs, runs in (("", batches), ("_gpu_inputs", [device_batch(b) for b in batches])):
        session.predict(runs[0])
        profiler = cProfile.Profile()
        profiler.enable()
        for sparse in runs:
            session.predict(sparse)
        profiler.disable()
        with open(args.out / f"profile_{precision}_{batch}{inputs}.txt", "w") as f:
            stats = pstats.Stats(profiler, stream=f)
            stats.sort_stats("tottime").print_stats(30)
            stats.sort_stats("cumulative").print_stats(30)


def gpu_memory_mib() -> int:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return int(out.stdout.split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ps-json", type=Path, required=True)
    parser.add_argument("--batches", default="1,64,1024,16384,65536")
    parser.add_argument("--precisions", default="fp32,tf32")
    parser.add_argument("--caches", default="0.2,0.5,static")
    parser.add_argument(
        "--storage", default="fp32", help="storage precisions of the tables (fp32,fp16,int8,fp8)"
    )
    parser.add_argument("--alpha", type=float, default=1.05)
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--profile-batches", default="1024,16384", help="cProfile these sizes")
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    config = load_ps_config(args.ps_json).model(load_ps_config(args.ps_json).models[0].name)
    name = config.name
    rows = [(t.sparse_file / "key").stat().st_size // 8 for t in config.tables]
    _, layout = load_ranking_graph(config)
    storages = args.storage.split(",")
    pcie = pcie_rate()
    print(f"pinned host-to-device copy: {pcie / 1e9:.1f} GB/s")
    print(f"model {name}: {len(rows)} tables, {sum(rows):,} rows, GPU "
          f"{cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}")  # fmt: skip
    # Keep the host tier mapped between cache settings (it is built once, not per setting).
    HPS(args.ps_json).model(name).open_all()
    started = time.perf_counter()
    net = torch_peer(args.ps_json, name)
    print(f"peer loaded in {time.perf_counter() - started:.1f} s")
    rng = np.random.default_rng(0)
    results = []
    for precision in args.precisions.split(","):
        # "fp32-sgemm": FP32 with every product on SGEMM (no 3xTF32; hps_core.cuda.linear).
        os.environ["HPS_FP32_GEMM"] = "sgemm" if precision == "fp32-sgemm" else "3xtf32"
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = precision == "tf32"
        peers = {"eager": PeerRunner(net, graphs=False), "graph": PeerRunner(net, graphs=True)}
        peer_ms: dict[tuple[str, int], float] = {}
        for batch in batches:
            inputs = [make_batch(rng, rows, batch, args.alpha, layout) for _ in range(4)]
            for kind, runner in peers.items():
                for dense, keys, _ in inputs[:2]:
                    runner(dense, keys)  # warm-up (and graph capture)
                ms = timed(runner, [(d, k) for d, k, _ in inputs], runs=args.runs)
                peer_ms[(kind, batch)] = 1e3 * ms
                results.append(dict(system=f"pytorch-{kind}", cache="all on GPU", inputs="host",
                                    precision=precision, batch=batch, ms=1e3 * ms))  # fmt: skip
            # The same peer given inputs already on the GPU (no copy in the timed call).
            on_gpu = [
                (torch.from_numpy(d).cuda(), torch.from_numpy(k).cuda()) for d, k, _ in inputs
            ]
            for args_gpu in on_gpu[:2]:
                peer_on_gpu(net, *args_gpu)
            ms = timed(lambda d, k: peer_on_gpu(net, d, k), on_gpu, runs=args.runs)
            peer_ms[("eager-gpu-inputs", batch)] = 1e3 * ms
            results.append(dict(system="pytorch-eager", cache="all on GPU", inputs="gpu",
                                precision=precision, batch=batch, ms=1e3 * ms))  # fmt: skip
            torch.cuda.empty_cache()
        settings = [(c, s) for s in storages for c in args.caches.split(",")]
        for cache, storage in settings:
            ps = variant(args.ps_json, cache, storage)
            row_bytes = [RowFormat(storage, t.dim).row_bytes for t in config.tables]
            session = RankingSession.open(
                ps, name, device_id=0, precision=precision.removesuffix("-sgemm")
            )
            started = time.perf_counter()
            for _ in range(args.warmup):
                session.predict(make_batch(rng, rows, WARMUP_BATCH, args.alpha, layout)[2])
            print(f"{precision} cache {cache} storage {storage}: warmed in "
                  f"{time.perf_counter() - started:.1f} s")  # fmt: skip
            for batch in batches:
                inputs = [make_batch(rng, rows, batch, args.alpha, layout) for _ in range(4)]
                want = PeerRunner(net, graphs=False)(inputs[0][0], inputs[0][1])
                got = session.predict(inputs[0][2])
                error = float(np.max(np.abs(got - want)))
                for _, _, sparse in inputs[1:3]:
                    session.predict(sparse)
                unique = unique_hit_rate(session, inputs[3][2])
                scored = settle(session, rng, rows, batch, args.alpha, layout)
                # Timed on fresh batches: a batch seen before finds its keys in the cache.
                timed_batches = [
                    (make_batch(rng, rows, batch, args.alpha, layout)[2],) for _ in range(args.runs)
                ]
                before = session.lookup.counters()
                ms = timed(session.predict, timed_batches, runs=args.runs)
                after = session.lookup.counters()
                hits, keys, host_rows, _ = counted(before, after, row_bytes)
                host_rows /= args.runs
                # The lookup's GPU time and the PCIe floor of the rows those same batches read.
                fresh = [make_batch(rng, rows, batch, args.alpha, layout)[2] for _ in range(3)]
                gpu_ms, floors, misses = [], [], []
                for f in fresh:
                    before = session.lookup.counters()
                    gpu_ms.append(graph_times(session, f))
                    miss_bytes = counted(before, session.lookup.counters(), row_bytes)[3]
                    misses.append(miss_bytes)
                    floors.append(gpu_ms[-1][0] / (1e3 * miss_bytes / pcie) if miss_bytes else 0)
                lookup_ms = statistics.median(t[0] for t in gpu_ms)
                insert_ms = statistics.median(t[1] for t in gpu_ms)
                dense_ms = statistics.median(t[2] for t in gpu_ms)
                miss_bytes = statistics.median(misses)
                fresh = [make_batch(rng, rows, batch, args.alpha, layout)[2] for _ in range(3)]
                steps = [session.pipeline.profile(f) for f in fresh]
                split = {k: statistics.median(s[k] for s in steps) for k in steps[0]}
                profiled = [int(b) for b in args.profile_batches.split(",") if b]
                first = (cache, storage) == settings[0]
                if batch in profiled and first:
                    profile(session, rng, rows, batch, args, layout, precision)
                if first:
                    # Keys and dense features already on the GPU (lookup_fromdlpack's case).
                    on_gpu = [(device_batch(s),) for _, _, s in inputs]
                    for (b,) in on_gpu[:2]:
                        session.predict(b)
                    device_ms = timed(session.predict, on_gpu, runs=args.runs)
                    results.append(dict(
                        system="hps-triton", cache=cache, storage=storage, inputs="gpu",
                        precision=precision, batch=batch, ms=1e3 * device_ms,
                    ))  # fmt: skip
                    peer_gpu = peer_ms[("eager-gpu-inputs", batch)]
                    print(f"  batch {batch}, inputs on the GPU: {1e3 * device_ms:.3f} ms (peer "
                          f"with GPU inputs {peer_gpu:.3f})")  # fmt: skip
                results.append(dict(
                    system="hps-triton", cache=cache, storage=storage, inputs="host",
                    precision=precision, batch=batch,
                    ms=1e3 * ms, key_hit_rate=hits / keys if keys else 0.0,
                    unique_hit_rate=unique, max_abs_diff_vs_peer=error,
                    gpu_lookup_ms=lookup_ms, gpu_insert_ms=insert_ms, gpu_dense_ms=dense_ms,
                    scored=scored, host_rows_per_batch=host_rows,
                    miss_mb_per_batch=miss_bytes / 1e6,
                    pcie_floor_ms=1e3 * miss_bytes / pcie,
                    lookup_x_floor=statistics.median(floors),
                    **{f"eager_{k}_ms": v for k, v in split.items()},
                    gpu_mib=gpu_memory_mib(),
                ))  # fmt: skip
                peer = peer_ms[("eager", batch)]
                print(f"  batch {batch} ({scored}): {1e3 * ms:.3f} ms (peer eager {peer:.3f}), "
                      f"|diff| {error:.2e}, GPU lookup {lookup_ms:.3f} insert {insert_ms:.3f} "
                      f"dense {dense_ms:.3f} ms, misses {miss_bytes / 1e6:.1f} MB (lookup "
                      f"{statistics.median(floors):.2f}x their PCIe floor)",
                      flush=True)  # fmt: skip
            HPS(ps).close()
        for r in results:
            if r["precision"] == precision:
                r["samples_per_s"] = r["batch"] / (r["ms"] / 1e3)
                r["x_peer_eager"] = peer_ms[("eager", r["batch"])] / r["ms"]
                r["x_peer_graph"] = peer_ms[("graph", r["batch"])] / r["ms"]
                same = "eager-gpu-inputs" if r["inputs"] == "gpu" else "eager"
                r["x_peer_same_inputs"] = peer_ms[(same, r["batch"])] / r["ms"]
    columns = ["system", "cache", "storage", "inputs", "precision", "batch", "ms", "samples_per_s",
               "x_peer_eager", "x_peer_graph", "x_peer_same_inputs", "scored",
               "key_hit_rate", "unique_hit_rate", "gpu_lookup_ms", "gpu_insert_ms", "gpu_dense_ms",
               "host_rows_per_batch", "miss_mb_per_batch", "pcie_floor_ms", "lookup_x_floor",
               "gpu_mib",
               "max_abs_diff_vs_peer", "eager_upload_ms", "eager_lookup_ms", "eager_insert_ms",
               "eager_forward_ms", "eager_download_ms"]  # fmt: skip
    write_results(args.out / "ranking_vs_pytorch.csv", columns, results)
    plot(results, args.out / "ranking_vs_pytorch.png")


def plot(results: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    precisions = sorted({r["precision"] for r in results})
    fig, axes = plt.subplots(1, len(precisions), figsize=(6 * len(precisions), 4.5), squeeze=False)
    for ax, precision in zip(axes[0], precisions, strict=True):
        series: dict[str, list[tuple[int, float]]] = {}
        for r in results:
            if r["precision"] == precision:
                label = r["system"] if r["system"] != "hps-triton" else f"hps-triton {r['cache']}"
                if r["inputs"] == "gpu":
                    label += ", inputs on GPU"
                series.setdefault(label, []).append((r["batch"], r["samples_per_s"]))
        for label, points in sorted(series.items()):
            xs, ys = zip(*sorted(points), strict=True)
            ax.plot(xs, ys, marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("samples per batch")
        ax.set_ylabel("samples/s")
        ax.set_title(f"DLRM on one GPU, {precision}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
