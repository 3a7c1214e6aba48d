"""The GPU part of ``benchmarks/large_table.py``: lookups of NV Embedding Cache's step against
the PCIe floor and PyTorch (see that script's docstring). Run through it with ``--lookups``."""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hps_core.formats.sparse import VECTOR_FILE
from hps_core.workload import zipf_keys

DIM = 128
SAMPLES, HOTNESS = 256, 1024
KEYS = SAMPLES * HOTNESS
NVE_M_KEYS_S = 432  # NV Embedding Cache, 256 GB table, 10% cache, GB200 (docs/benchmarks.md)


def copy_rates(cupy) -> tuple[float, float]:
    """Host-to-device (pinned) and device-to-device copy rates in bytes/s, 1 GiB copies."""
    n = 1 << 30
    device = cupy.empty(n, dtype=cupy.uint8)
    other = cupy.empty(n, dtype=cupy.uint8)
    host = cupy.cuda.alloc_pinned_memory(n)
    h2d = cupy.cuda.runtime.memcpyHostToDevice

    def h2d_copy() -> None:
        cupy.cuda.runtime.memcpyAsync(device.data.ptr, host.ptr, n, h2d, 0)

    def d2d_copy() -> None:
        other[...] = device

    rates = []
    for copy in (h2d_copy, d2d_copy):
        copy()
        seconds = gpu_seconds(cupy, copy, 5)
        rates.append(5 * n / seconds)
    return rates[0], rates[1]


def gpu_seconds(cupy, step: Callable[[], None], repeats: int) -> float:
    """Seconds the GPU takes for ``repeats`` calls of ``step`` (CUDA events on the current
    stream, which every lookup orders itself on)."""
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(repeats):
        step()
    stop.record()
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) / 1e3


KERNELS = {"bank_find": "find", "bank_pool": "pool", "bank_insert": "insert"}
"""The bank's kernels by name; every other kernel and copy counts as ``other``."""


def kernel_split(torch, run: Callable[[], None], steps: int) -> dict[str, float]:
    """Milliseconds per step the GPU spends in each of the bank's kernels and in the rest
    (other kernels, copies), from one ``torch.profiler`` run of ``steps`` steps (CUPTI sees
    CuPy's kernels as well as PyTorch's)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    split = dict.fromkeys([*KERNELS.values(), "other"], 0.0)
    for event in prof.key_averages():
        us = getattr(event, "self_device_time_total", None)
        if us is None:
            us = getattr(event, "self_cuda_time_total", 0.0)
        part = next((v for k, v in KERNELS.items() if event.key.startswith(k)), "other")
        split[part] += us / 1e3 / steps
    return split


def ps_json(scratch: Path, folder: Path, precision: str, cache: str) -> Path:
    """A ps.json of one table (the written files) with a dynamic cache of share ``cache`` or
    the whole table static on the GPU."""
    model = {
        "model": "big",
        "sparse_files": [str(folder)],
        "embedding_vecsize_per_table": [DIM],
        "maxnum_catfeature_query_per_table_per_sample": [HOTNESS],
        "max_batch_size": SAMPLES,
        "deployed_device_list": [0],
        "default_value_for_each_table": [0.0],
        "gpucache": True,
        "storage_precision": precision,
    }
    if cache == "static":
        model["embedding_cache_type"] = "static"
    else:
        model |= {"embedding_cache_type": "dynamic", "gpucacheper": float(cache)}
    path = scratch / f"ps_{precision}_{cache}.json"
    path.write_text(json.dumps({"supportlonglong": True, "models": [model]}))
    return path


def measure_lookups(
    args: argparse.Namespace, folder: Path, rows: int, table_key: Callable[..., np.ndarray]
) -> list[dict]:
    """Every configuration's unpooled and pooled steps, PyTorch's beside them; prints a table
    and writes ``large_table_lookups.csv`` under ``args.out``."""
    import cupy
    import torch
    import torch.nn.functional as F

    from hps_core import HPS

    h2d, d2d = copy_rates(cupy)
    rng = np.random.default_rng(1)
    total = args.warm + args.steps
    index = [zipf_keys(rng, KEYS, rows, args.alpha) for _ in range(total)]
    keys = [cupy.asarray(table_key(i)) for i in index]
    vectors = np.memmap(folder / VECTOR_FILE, dtype=np.float32, mode="r", shape=(rows, DIM))
    check = np.sort(index[-1][:4096])  # rows checked against the files, in file order
    check_at = {int(r): i for i, r in enumerate(index[-1][:4096])}
    results: list[dict] = []
    name = torch.cuda.get_device_name(0)
    print(f"GPU {name}: host-to-device {h2d / 1e9:.1f} GB/s, device copy {d2d / 1e9:.0f} GB/s")

    # PyTorch on a GPU copy of the FP32 table, the same steps (row indices for keys).
    free, _ = torch.cuda.mem_get_info()
    if free > 2.2 * rows * DIM * 4:
        weight = torch.empty((rows, DIM), dtype=torch.float32, device="cuda")
        chunk = 1 << 22
        for first in range(0, rows, chunk):
            part = torch.from_numpy(np.ascontiguousarray(vectors[first : first + chunk]))
            weight[first : first + part.shape[0]].copy_(part)
        idx = [torch.from_numpy(i).cuda() for i in index]
        for label, call in (
            ("F.embedding", lambda i: F.embedding(i, weight)),
            ("F.embedding_bag sum", lambda i: F.embedding_bag(i.view(SAMPLES, HOTNESS), weight,
                                                              mode="sum")),
        ):  # fmt: skip
            for i in idx[: args.warm]:
                call(i)
            torch.cuda.synchronize()
            started = time.perf_counter()
            for i in idx[args.warm :]:
                call(i)
            torch.cuda.synchronize()
            seconds = (time.perf_counter() - started) / args.steps
            results.append({"engine": "pytorch", "precision": "fp32", "cache": "whole table",
                            "lookup": label, "m_keys_s": KEYS / seconds / 1e6,
                            "ms_per_step": 1e3 * seconds})  # fmt: skip
        del weight, idx
        torch.cuda.empty_cache()
    else:
        print(f"PyTorch peer skipped: {free / 1e9:.0f} GB free on the GPU")

    with tempfile.TemporaryDirectory() as scratch:
        for precision in args.precisions.split(","):
            row_bytes = DIM * (4 if precision == "fp32" else 2)
            for cache in [*args.cache_shares.split(","), "static"]:
                path = ps_json(Path(scratch), folder, precision, cache)
                hps = HPS(path)
                started = time.perf_counter()
                hps.model("big", 0).open_all()
                opened = time.perf_counter() - started
                for pooled in (False, True):
                    bags = SAMPLES if pooled else KEYS
                    out = cupy.empty((bags, DIM), dtype=cupy.float32)
                    pooling = {"hotness": HOTNESS, "combiner": "sum"} if pooled else {}

                    def step(k, hps=hps, out=out, pooling=pooling):
                        hps.lookup_fromdlpack(k, out, "big", 0, 0, **pooling)

                    for k in keys[: args.warm]:
                        step(k)
                    before = hps.model("big", 0).counters()[0]
                    it = iter(keys[args.warm :])
                    seconds = gpu_seconds(cupy, lambda it=it: step(next(it)), args.steps)
                    after = hps.model("big", 0).counters()[0]
                    _check(out, pooled, precision, vectors, check, check_at, index[-1])
                    it = iter(keys[args.warm :])
                    split = kernel_split(
                        torch, lambda it=it: [step(next(it)) for _ in range(args.steps)],
                        args.steps,
                    )  # fmt: skip
                    n = after.keys - before.keys
                    missed = after.host_rows - before.host_rows
                    per_step = seconds / args.steps
                    floor = (missed * row_bytes / h2d + (n - missed) * row_bytes / d2d) / args.steps
                    results.append({
                        "engine": "hps bank", "precision": precision,
                        "cache": "static" if cache == "static" else f"{float(cache):.0%}",
                        "lookup": "pooled h=1024 sum" if pooled else "unpooled",
                        "m_keys_s": KEYS / per_step / 1e6, "ms_per_step": 1e3 * per_step,
                        "hit_rate": (after.cache_hits - before.cache_hits) / max(n, 1),
                        "pcie_mb_per_step": missed * row_bytes / args.steps / 1e6,
                        "floor_ms": 1e3 * floor, "x_floor": per_step / floor if floor else 0,
                        "open_s": opened,
                        **{f"{k}_ms": v for k, v in split.items()},
                    })  # fmt: skip
                HPS.close_all()
                cupy.get_default_memory_pool().free_all_blocks()
    fields = ["engine", "precision", "cache", "lookup", "m_keys_s", "ms_per_step", "hit_rate",
              "pcie_mb_per_step", "floor_ms", "x_floor", "open_s", "find_ms", "pool_ms",
              "insert_ms", "other_ms"]  # fmt: skip
    with open(args.out / "large_table_lookups.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(results)
        f.write(f"# GPU {name}; h2d {h2d / 1e9:.2f} GB/s; d2d {d2d / 1e9:.1f} GB/s; "
                f"{rows} rows x {DIM}; Zipf {args.alpha}; {KEYS} keys a step; "
                f"{args.steps} steps after {args.warm}\n")  # fmt: skip
    print(f"{'engine':11} {'prec':4} {'cache':>11} {'lookup':>20} {'Mkeys/s':>8} {'ms':>7} "
          f"{'hit':>6} {'PCIe MB':>8} {'floor ms':>8} {'x floor':>7}")  # fmt: skip
    nan = float("nan")
    for r in results:
        print(
            f"{r['engine']:11} {r['precision']:4} {r['cache']:>11} {r['lookup']:>20} "
            f"{r['m_keys_s']:8.0f} {r['ms_per_step']:7.3f} {r.get('hit_rate', nan):6.3f} "
            f"{r.get('pcie_mb_per_step', nan):8.1f} {r.get('floor_ms', nan):8.3f} "
            f"{r.get('x_floor', nan):7.2f}"
        )
    print(f"(NV Embedding Cache: {NVE_M_KEYS_S} M keys/s, 256 GB table, 10% cache, GB200)")
    print("GPU time per step by kernel (torch.profiler), ms:")
    print(f"{'engine':11} {'prec':4} {'cache':>11} {'lookup':>20} {'find':>7} {'pool':>7} "
          f"{'insert':>7} {'other':>7}")  # fmt: skip
    for r in results:
        if "find_ms" in r:
            print(
                f"{r['engine']:11} {r['precision']:4} {r['cache']:>11} {r['lookup']:>20} "
                f"{r['find_ms']:7.3f} {r['pool_ms']:7.3f} {r['insert_ms']:7.3f} "
                f"{r['other_ms']:7.3f}"
            )
    return results


def _check(out, pooled, precision, vectors, check, check_at, last) -> None:
    """The last step's answer against the files: a row per key exactly (FP16 rows rounded
    as stored), or the first bags' sums within float32 rounding of a float64 sum."""
    got = out.get()
    if not pooled:
        want = np.asarray(vectors[check])
        if precision == "fp16":
            want = want.astype(np.float16).astype(np.float32)
        mine = got[[check_at[int(r)] for r in check]]
        np.testing.assert_array_equal(mine, want, err_msg=f"{precision} rows differ")
        return
    for bag in range(4):
        rows = np.asarray(vectors[np.sort(last[bag * HOTNESS : (bag + 1) * HOTNESS])])
        if precision == "fp16":
            rows = rows.astype(np.float16).astype(np.float32)
        want = rows.astype(np.float64).sum(axis=0)
        np.testing.assert_allclose(got[bag], want, rtol=1e-4, atol=2e-3)
