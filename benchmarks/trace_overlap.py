"""How much kernels of named kinds ran at the same time, from a Chrome trace of CUPTI events.

``ranking_kernel_profile.py --trace`` writes a trace per case (``torch.profiler``'s
``export_chrome_trace``: every kernel with its stream, start and duration). Given kinds as
name prefixes (default: the lookup's ``bank_find`` and its poolings ``bank_pool``), this
prints, per kind, the kernels' summed time and the time at least one of them ran (their
union), and for each pair of kinds the time both ran at once; then the GPU's busy time (any
kernel or copy). Pooling that overlaps the next part's ``bank_find`` shows as a pair time
near the smaller kind's union; pooling that waits for free SMs as a pair time near zero.

Usage:
    python benchmarks/ranking_kernel_profile.py --ps-json /tmp/d2/ps.json --batches 16384 \\
        --precisions tf32 --variant-rounds 0 --trace --out $OUT
    python benchmarks/trace_overlap.py $OUT/trace_hps-triton_default_tf32_16384.json \\
        --kinds bank_find,bank_pool,bank_insert --out $OUT
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from result_table import write_results

Interval = tuple[float, float]
"""Start and end of a kernel, microseconds."""
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def device_events(trace: dict) -> list[dict]:
    """The trace's device activities (kernels, copies, memsets): ``name``, ``cat``,
    ``stream``, ``start`` and ``end`` (microseconds)."""
    events = []
    for event in trace.get("traceEvents", []):
        if event.get("ph") != "X" or event.get("cat") not in DEVICE_CATEGORIES:
            continue
        start = float(event["ts"])
        events.append({
            "name": event.get("name", ""),
            "cat": event["cat"],
            "stream": event.get("args", {}).get("stream", event.get("tid")),
            "start": start,
            "end": start + float(event.get("dur", 0.0)),
        })  # fmt: skip
    return events


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """``intervals`` merged where they touch or overlap, in order.

    Example:
        >>> union([(3.0, 5.0), (0.0, 1.0), (0.5, 2.0), (5.0, 6.0)])
        [(0.0, 2.0), (3.0, 6.0)]
    """
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def length(intervals: Sequence[Interval]) -> float:
    """Summed length of disjoint ``intervals``."""
    return sum(end - start for start, end in intervals)


def intersection(a: Sequence[Interval], b: Sequence[Interval]) -> float:
    """Length of the time covered by both of two sorted, disjoint interval lists.

    Example:
        >>> intersection([(0.0, 4.0), (6.0, 8.0)], [(3.0, 7.0)])
        2.0
    """
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        low, high = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, high - low)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap_table(events: Sequence[dict], kinds: Sequence[str]) -> list[dict]:
    """Rows of the report: per kind (kernels whose name starts with it) its kernel count,
    streams, summed and union time; per pair of kinds the time both ran; the device's busy
    time (every kernel, copy and memset)."""
    unions = {}
    rows = []
    for kind in kinds:
        mine = [e for e in events if e["cat"] == "kernel" and e["name"].startswith(kind)]
        unions[kind] = union((e["start"], e["end"]) for e in mine)
        rows.append({
            "what": kind,
            "kernels": len(mine),
            "streams": len({e["stream"] for e in mine}),
            "summed_us": sum(e["end"] - e["start"] for e in mine),
            "union_us": length(unions[kind]),
        })  # fmt: skip
    for a, b in itertools.combinations(kinds, 2):
        rows.append({"what": f"{a} & {b}", "union_us": intersection(unions[a], unions[b])})
    busy = union((e["start"], e["end"]) for e in events)
    rows.append({
        "what": "device busy",
        "kernels": len(events),
        "streams": len({e["stream"] for e in events}),
        "summed_us": sum(e["end"] - e["start"] for e in events),
        "union_us": length(busy),
    })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path, help="a Chrome trace (torch.profiler)")
    parser.add_argument("--kinds", default="bank_find,bank_pool", help="kernel name prefixes")
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    args = parser.parse_args()
    events = device_events(json.loads(args.trace.read_text()))
    if not events:
        raise SystemExit(f"{args.trace}: no kernel, copy or memset events (a CUDA trace?)")
    rows = overlap_table(events, [k for k in args.kinds.split(",") if k])
    args.out.mkdir(parents=True, exist_ok=True)
    write_results(
        args.out / f"{args.trace.stem}_overlap.csv",
        ["what", "kernels", "streams", "summed_us", "union_us"],
        rows,
    )


if __name__ == "__main__":
    main()
