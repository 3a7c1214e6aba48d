"""Where each zoo model's batch spends its GPU time: GEMMs, lookups and everything else.

Every family of ``hps prepare --zoo`` (HugeCTR's sample models: DLRM with MLP layers, DIN,
BST, MMoE, NCF, shared bottom, DLRM-v2) on the GPU pipeline, ``--batches`` samples per batch
(random known keys, each table's fixed number of keys per slot; BST's sequence lengths 0 to
6), ``--precision`` dense network. ``torch.profiler`` (CUPTI) records every kernel and copy
of ``--profiled`` predictions after warm-up; their device times are summed by kind:

- ``gemm``: cuBLAS/cuBLASLt kernels (names with gemm, gemv, xmma, cutlass or splitK);
- ``lookup``: the pipeline's ``bank_*`` kernels;
- ``copy``: host-device copies and memsets;
- ``other``: every other kernel (element-wise layers, reductions, concatenations, the
  interaction, ...).

Those shares sum device times, so a copy that ran beside a kernel counts as much as one the
GPU waited for. The trace's timeline gives the other view (``trace_overlap.timeline_split``):
of the time the device was busy (any kernel, copy or memset running), the share in which no
GEMM or lookup ran, split into other kernels and copies alone (``outside_share`` =
``exposed_other_share`` + ``exposed_copy_share``).

Outside the profiler, ``wall_ms_per_batch`` is the median time of ``predict`` over ``--timed``
fresh batches, host staging included: where it is well above the busy time, the GPU waited for
the host (copies that run alone then wait for the host's staging of their part). Before
either, fresh batches run until the pipeline has chosen how it stages (``staged``: in parts or
whole, for a large bucket) and scores them.

Prints one row per (model, batch): GPU ms per batch, the share of each kind, the timeline's
busy ms and its shares outside GEMMs and lookups, the wall ms per batch, and the largest
``other`` kernels; writes ``zoo_kernel_profile.csv`` under ``--out``.

Usage:
    python benchmarks/zoo_kernel_profile.py --out $OUT
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import cupy
import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile
from trace_overlap import device_events, timeline_split
from zoo_batches import random_batch

from hps_core.demo import ZOO_MODELS
from hps_core.hps import HPS
from hps_core.infer import RankingSession, SparseBatch
from hps_core.infer.gpu.buckets import in_parts_by_default
from hps_core.infer.gpu.staging import bucket_for
from hps_core.triton_repo import InstanceGroup, ServingOptions

KINDS = ("gemm", "lookup", "copy", "other")
_GEMM_WORDS = ("gemm", "gemv", "xmma", "cutlass", "splitk")


def kind_of(name: str) -> str:
    """The kind of a profiled kernel or copy (see the module docstring)."""
    lower = name.lower()
    if name.startswith("bank_"):
        return "lookup"
    if "memcpy" in lower or "memset" in lower:
        return "copy"
    if any(word in lower for word in _GEMM_WORDS):
        return "gemm"
    return "other"


def device_times(
    session: RankingSession, batches: list[SparseBatch]
) -> tuple[dict[str, float], str, dict[str, float]]:
    """Device microseconds per profiled kernel or copy name over ``batches``; a summary of the
    copies: per kind (pinned or pageable host memory, memset), the calls, MB and GB/s per
    batch, from the trace's copy events; and the trace's busy time split by what ran
    (``trace_overlap.timeline_split``, GEMMs and lookups inside)."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for batch in batches:
            session.predict(batch)
        cupy.cuda.Device(0).synchronize()
    times: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        total = getattr(event, "self_device_time_total", None)
        if total is None:
            total = event.self_cuda_time_total
        times[event.key] += float(total)
    with tempfile.NamedTemporaryFile(suffix=".json") as trace:
        prof.export_chrome_trace(trace.name)
        trace_json = json.loads(Path(trace.name).read_text())
    events = trace_json["traceEvents"]
    split = timeline_split(
        device_events(trace_json), lambda e: kind_of(e["name"]) in ("gemm", "lookup")
    )
    copies: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])  # calls, bytes, us
    for event in events:
        if event.get("cat") in ("gpu_memcpy", "gpu_memset"):
            entry = copies[event["name"]]
            entry[0] += 1
            entry[1] += float(event.get("args", {}).get("bytes", 0))
            entry[2] += float(event.get("dur", 0))
    n = len(batches)
    summary = "; ".join(
        f"{name} x{calls / n:.0f} {nbytes / n / 1e6:.2f} MB {nbytes / max(us, 1e-9) / 1e3:.1f} GB/s"
        for name, (calls, nbytes, us) in sorted(copies.items())
    )
    return times, summary, split


def settle(session: RankingSession, rng: np.random.Generator, batch: int) -> str:
    """Predict fresh batches of ``batch`` samples until the pipeline has chosen how it stages
    and scores batches of that size (its first ones time both schedules of each choice:
    hps_core.infer.gpu.schedule), so that the measured batches run the chosen ones; returns
    how it stages them: "whole", "in parts" or "-" (a size that is never staged in parts)."""
    pipe = session.pipeline
    size = bucket_for(batch)
    for _ in range(32):
        if pipe.schedules_chosen():
            break
        session.predict(random_batch(session, rng, batch))
    if not in_parts_by_default(size):
        return "-"
    return "whole" if pipe.staged_whole(size) else "in parts"


def wall_ms(session: RankingSession, batches: list[SparseBatch]) -> float:
    """Median milliseconds of ``session.predict`` over ``batches`` (it returns host scores: the
    GPU's work is done when it returns)."""
    times = []
    for batch in batches:
        start = time.perf_counter()
        session.predict(batch)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1024,16384")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--models", default=",".join(ZOO_MODELS))
    parser.add_argument("--profiled", type=int, default=3)
    parser.add_argument("--timed", type=int, default=9, help="fresh batches timed unprofiled")
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    repo = Path(tempfile.mkdtemp(prefix="zoo_profile_"))
    options = ServingOptions(instances=(InstanceGroup(count=1, kind="KIND_GPU"),))
    rng = np.random.default_rng(0)
    results = []
    for name in args.models.split(","):
        ZOO_MODELS[name](repo, options)
        ps = json.loads((repo / name / "ps.json").read_text())
        ps["models"][0]["max_batch_size"] = max(batches)
        path = repo / name / "ps_profile.json"
        path.write_text(json.dumps(ps))
        session = RankingSession.open(path, name, device_id=0, precision=args.precision)
        for batch in batches:
            for _ in range(3):  # warm-up: kernels, graphs, caches
                session.predict(random_batch(session, rng, batch))
            staged = settle(session, rng, batch)
            fresh = [random_batch(session, rng, batch) for _ in range(args.profiled)]
            times, copies, split = device_times(session, fresh)
            wall = wall_ms(session, [random_batch(session, rng, batch) for _ in range(args.timed)])
            by_kind = dict.fromkeys(KINDS, 0.0)
            for kernel, us in times.items():
                by_kind[kind_of(kernel)] += us
            total = sum(by_kind.values())
            busy = max(split["busy_us"], 1e-9)
            others = sorted(
                ((us, k) for k, us in times.items() if kind_of(k) == "other"), reverse=True
            )
            results.append(
                dict(
                    model=name, batch=batch, precision=args.precision,
                    gpu_ms_per_batch=total / 1e3 / args.profiled,
                    **{f"{k}_share": by_kind[k] / total for k in KINDS},
                    busy_ms_per_batch=split["busy_us"] / 1e3 / args.profiled,
                    outside_share=(split["other_kernels_us"] + split["copies_us"]) / busy,
                    exposed_other_share=split["other_kernels_us"] / busy,
                    exposed_copy_share=split["copies_us"] / busy,
                    wall_ms_per_batch=wall, staged=staged,
                    top_other="; ".join(f"{k[:40]} {us / total:.1%}" for us, k in others[:4]),
                    copies=copies,
                )
            )  # fmt: skip
            row = results[-1]
            print(
                f"{name:14} {batch:6} {row['gpu_ms_per_batch']:8.3f} ms  "
                + "  ".join(f"{k} {row[f'{k}_share']:5.1%}" for k in KINDS)
                + f"  | busy {row['busy_ms_per_batch']:.3f} ms, outside GEMMs and lookups "
                f"{row['outside_share']:5.1%} (kernels {row['exposed_other_share']:5.1%}, "
                f"copies alone {row['exposed_copy_share']:5.1%}), wall {wall:.3f} ms, "
                f"staged {staged}" + f"  | {row['top_other']}\n{'':22}copies: {copies}",
                flush=True,
            )
        HPS(path).close()
    columns = [
        "model", "batch", "precision", "gpu_ms_per_batch",
        *(f"{k}_share" for k in KINDS), "busy_ms_per_batch", "outside_share",
        "exposed_other_share", "exposed_copy_share", "wall_ms_per_batch", "staged", "top_other",
        "copies",
    ]  # fmt: skip
    with open(args.out / "zoo_kernel_profile.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(results)


if __name__ == "__main__":
    main()
