"""Where a large ranking batch spends its GPU time: CUPTI kernel times of hps-triton's
``predict`` and of the PyTorch peer, side by side.

``torch.profiler`` (CUPTI) records every kernel and copy on the device, CuPy's and cuBLAS's as
well as PyTorch's, so one run shows both systems' kernels by name. Same model, batches and
peer as ``ranking_vs_pytorch.py`` (one-hot Zipf keys on the host, ``gpucacheper`` ``--cache``
after warm-up); per (precision, batch): the host time of staging and copying the batch as
``predict`` stages it (results before this script did so staged every batch whole), the
median ``predict`` (and with ``--staging-threads``, with each number of threads filling the
staging buffer), the median ``predict`` of fresh batches and the GPU time of a fresh batch's
lookup (``ranking_vs_pytorch.graph_times``) under each of ``--variants`` (of ``VARIANTS``) and
the default, then the kernel table of ``--batches-profiled`` predictions of fresh batches and
of as many peer calls.

Usage:
    python benchmarks/make_large_dlrm.py --out /tmp/dlrm --max-rows-per-table 1000000 \\
        --max-batch-size 65536
    python benchmarks/ranking_kernel_profile.py --ps-json /tmp/dlrm/ps.json --out $OUT
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from pathlib import Path

import cupy
import numpy as np
import torch
from ranking_vs_pytorch import PeerRunner, graph_times, host_bucket, make_batch, variant
from torch.profiler import ProfilerActivity, profile
from torch_dlrm import torch_peer

from hps_core.config import load_ps_config
from hps_core.hps import HPS
from hps_core.infer import RankingSession, load_ranking_graph
from hps_core.infer.gpu import chunks, kernel_steps, schedule, uploads
from hps_core.infer.gpu import pipeline as gpu_pipeline
from hps_core.infer.gpu.buckets import grouped

WARMUP_BATCH = 16384
BANK_KERNELS = ("bank_find", "bank_pool", "bank_insert")


VARIANTS = {
    "insert beside the dense network": {"_INSERT_AFTER_SCORES": False},
    "whole batches (no chunks)": {"_CHUNKED_KEY_BYTES": 1 << 62},
    "chunks with dynamic caches": {"_CHUNKS_WITH_DYNAMIC_CACHES": True},
    # The insert runs after the scores (unless caches are shared), no longer beside the GEMMs
    # that made 2 blocks per SM the default.
    "insert 8 blocks/SM": {"_INSERT_BLOCKS_PER_SM": 8},
    "pooling after each find (one stream)": {"_POOL_BESIDE_FIND": False},
    "pool stream of the cache stream's priority": {"_POOL_PRIORITY": 0},
    "finds sample by sample": {"_FIND_BY_COLUMN": False},
    "sample-major batches by groups of tables": {"_ROW_PARTS": False},
    "large batches staged in parts": {"_STAGED_IN_PARTS": True},
    "large batches staged whole": {"_STAGED_IN_PARTS": False},
    "every part scored as soon as looked up": {"_DENSE_BY_PART": True},
    "whole dense network after every lookup": {"_DENSE_BY_PART": False},
}
"""Settings of :mod:`hps_core.infer.gpu.pipeline` and its ``chunks``, ``kernel_steps`` and
``schedule`` timed beside the default (the median predict of fresh batches, the settings
alternating)."""
SETTINGS_MODULES = (gpu_pipeline, chunks, kernel_steps, schedule)


def apply_settings(settings: dict[str, object]) -> list[tuple[object, str, object]]:
    """Set each of ``settings`` in the module that holds it; returns what to restore."""
    saved = []
    for key, value in settings.items():
        (module,) = [m for m in SETTINGS_MODULES if hasattr(m, key)]
        saved.append((module, key, getattr(module, key)))
        setattr(module, key, value)
    return saved


def restore_settings(saved: list[tuple[object, str, object]]) -> None:
    """Undo :func:`apply_settings`."""
    for module, key, value in saved:
        setattr(module, key, value)


def staged_as_predict(pipe, bucket, sparse) -> None:
    """Stage and copy the host batch ``sparse`` into ``bucket`` as ``predict`` does (a grouped
    bucket by ranges of samples or by groups of tables, any other whole), without its lookups,
    and wait for the copies."""
    uploader = pipe._uploader
    if grouped(bucket):
        if uploader.sample_major(sparse):
            parts = uploader.upload_rows(bucket, sparse)
        else:
            parts = uploader.upload_groups(bucket, sparse)
        for _ in parts:  # each part's copy is queued as it is staged
            pass
    else:
        uploader.stage_and_upload(bucket, sparse)
    for stream in pipe._streams:
        stream.synchronize()


def rebuild(pipe) -> None:
    """Drop the pipeline's buckets (their graphs bake the settings in); the next predict of
    each size records them again."""
    for stream in pipe._streams:
        stream.synchronize()
    # The pool stream's priority is a setting too, fixed when a stream is made.
    priority = gpu_pipeline._POOL_PRIORITY
    with cupy.cuda.Device(pipe.device_id):
        pipe._pool_stream = cupy.cuda.Stream(non_blocking=True, priority=priority)
    pipe._drop_buckets()
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    pipe.steps.insert_blocks = sms * kernel_steps._INSERT_BLOCKS_PER_SM


def kernel_resources(module, names: tuple[str, ...]) -> str:
    """Registers and spilled bytes per thread of each kernel of ``module`` (what bounds how
    many of its blocks an SM holds)."""
    parts = []
    for name in names:
        attrs = module.get_function(name).attributes
        parts.append(f"{name} {attrs.get('num_regs')} registers, "
                     f"{attrs.get('local_size_bytes')} B local")  # fmt: skip
    return "; ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ps-json", type=Path, required=True)
    parser.add_argument("--batches", default="16384,65536")
    parser.add_argument("--precisions", default="fp32,tf32")
    parser.add_argument("--cache", default="0.2")
    parser.add_argument("--storage", default="fp32", help="storage precision of the tables")
    parser.add_argument("--alpha", type=float, default=1.05)
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--batches-profiled", type=int, default=2)
    parser.add_argument(
        "--variant-rounds", type=int, default=3, help="rounds alternating the VARIANTS settings"
    )
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="time these VARIANTS (comma list)"
    )
    parser.add_argument(
        "--profile-variants", default="", help="also profile under these VARIANTS (comma list)"
    )
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    parser.add_argument(
        "--staging-threads", default="", help="also time predict with these thread counts"
    )
    parser.add_argument(
        "--trace", action="store_true", help="write a Chrome trace (CPU and CUDA) per case"
    )
    args = parser.parse_args()
    activities = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if args.trace else [])
    args.out.mkdir(parents=True, exist_ok=True)
    config = load_ps_config(args.ps_json).models[0]
    name = config.name
    rows = [(t.sparse_file / "key").stat().st_size // 8 for t in config.tables]
    _, layout = load_ranking_graph(config)
    HPS(args.ps_json).model(name).open_all()
    net = torch_peer(args.ps_json, name)
    rng = np.random.default_rng(0)
    lines: list[str] = []

    def log(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    for precision in args.precisions.split(","):
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        ps = variant(args.ps_json, args.cache, args.storage)
        session = RankingSession.open(ps, name, device_id=0, precision=precision)
        for _ in range(args.warmup):
            session.predict(make_batch(rng, rows, WARMUP_BATCH, args.alpha, layout)[2])
        pipe = session.pipeline
        log(f"{precision}: {kernel_resources(pipe._bank_kernels, BANK_KERNELS)}")
        peer = PeerRunner(net, graphs=False)
        for batch in (int(b) for b in args.batches.split(",")):
            inputs = [make_batch(rng, rows, batch, args.alpha, layout) for _ in range(4)]
            for dense, keys, sparse in inputs[:2]:
                peer(dense, keys)
                session.predict(sparse)
            bucket = host_bucket(pipe, batch)
            staging, whole = [], []
            for _, _, sparse in inputs:
                started = time.perf_counter()
                staged_as_predict(pipe, bucket, sparse)
                staging.append(time.perf_counter() - started)
            for _, _, sparse in inputs:
                started = time.perf_counter()
                session.predict(sparse)
                whole.append(time.perf_counter() - started)
            staging_ms = 1e3 * statistics.median(staging)
            whole_ms = 1e3 * statistics.median(whole)
            log(f"{precision} {batch}: staging + copy {staging_ms:.3f} ms, predict "
                f"{whole_ms:.3f} ms (medians of {len(inputs)})")  # fmt: skip
            default_threads = uploads._STAGING_THREADS
            for threads in (int(t) for t in args.staging_threads.split(",") if t):
                uploads._STAGING_THREADS = threads
                pipe._uploader.close()  # its thread count is read when it starts threads
                times = []
                for _, _, sparse in inputs * 2:
                    started = time.perf_counter()
                    session.predict(sparse)
                    times.append(time.perf_counter() - started)
                log(f"  {threads} staging threads: predict "
                    f"{1e3 * statistics.median(times):.3f} ms")  # fmt: skip
            uploads._STAGING_THREADS = default_threads
            # Settings are compared on fresh batches (a batch seen before hits more), in rounds
            # that alternate them, so that drift in the cache or the machine hits all alike.
            labels = ("default", *(v for v in args.variants.split(",") if v))
            times: dict[str, list[float]] = {label: [] for label in labels}
            lookups: dict[str, list[float]] = {label: [] for label in labels}
            for _ in range(args.variant_rounds):
                for label in times:
                    settings = VARIANTS.get(label, {})
                    saved = apply_settings(settings)
                    rebuild(pipe)
                    session.predict(make_batch(rng, rows, batch, args.alpha, layout)[2])
                    for _ in range(3):
                        sparse = make_batch(rng, rows, batch, args.alpha, layout)[2]
                        started = time.perf_counter()
                        session.predict(sparse)
                        times[label].append(time.perf_counter() - started)
                    sparse = make_batch(rng, rows, batch, args.alpha, layout)[2]
                    lookups[label].append(graph_times(session, sparse)[0])
                    restore_settings(saved)
            rebuild(pipe)
            for label, samples in times.items():
                if not samples:  # --variant-rounds 0
                    continue
                log(f"  {label}: predict {1e3 * statistics.median(samples):.3f} ms "
                    f"(median of {len(samples)} fresh batches), GPU lookup "
                    f"{statistics.median(lookups[label]):.3f} ms (median of "
                    f"{len(lookups[label])})")  # fmt: skip
            cases = [("hps-triton", "default"), ("pytorch", "")]
            cases += [("hps-triton", label) for label in args.profile_variants.split(",") if label]
            for who, label in cases:
                settings = VARIANTS.get(label, {})
                saved = apply_settings(settings)
                if settings:
                    rebuild(pipe)
                ours = who == "hps-triton"
                for dense, keys, sparse in inputs[:2]:  # graphs recorded outside the profile
                    session.predict(sparse) if ours else peer(dense, keys)
                # Fresh batches: a batch seen before misses less.
                fresh = [make_batch(rng, rows, batch, args.alpha, layout)
                         for _ in range(args.batches_profiled)]  # fmt: skip
                calls = [
                    functools.partial(session.predict, sparse)
                    if ours
                    else functools.partial(peer, dense, keys)
                    for dense, keys, sparse in fresh
                ]
                torch.cuda.synchronize()
                with profile(activities=activities) as prof:
                    for call in calls:
                        call()
                    torch.cuda.synchronize()
                restore_settings(saved)
                if settings:
                    rebuild(pipe)
                tag = f"{who} {label}".strip().replace(" ", "_").replace("(", "").replace(")", "")
                if args.trace:
                    trace = args.out / f"trace_{tag}_{precision}_{batch}.json"
                    prof.export_chrome_trace(str(trace))
                log(f"==== {who} {label} {precision} batch {batch} ({args.batches_profiled} "
                    "batches, fresh, after two unprofiled)")  # fmt: skip
                log(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25,
                                              max_name_column_width=70))  # fmt: skip
        HPS(ps).close()
    (args.out / "ranking_kernel_profile.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
