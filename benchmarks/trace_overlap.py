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
from collections.abc import Callable, Iterable, Sequence
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


def timeline_split(events: Sequence[dict], inside: Callable[[dict], bool]) -> dict[str, float]:
    """The device's busy time (microseconds) split by what ran in it: ``inside_us`` while a
    kernel for which ``inside`` holds ran; ``other_kernels_us`` while only other kernels (and
    maybe copies) ran; ``copies_us`` while only copies or memsets ran. Unlike summed kernel
    times, a copy that ran beside a kernel counts nowhere: it took no time of the timeline.

    Example:
        >>> ev = lambda cat, name, start, end: dict(cat=cat, name=name, start=start, end=end)
        >>> timeline_split([ev("kernel", "gemm", 0, 4), ev("gpu_memcpy", "copy", 3, 6),
        ...                 ev("kernel", "add", 5, 7)], lambda e: e["name"] == "gemm")
        {'busy_us': 7.0, 'inside_us': 4.0, 'other_kernels_us': 2.0, 'copies_us': 1.0}
    """
    kernels = [e for e in events if e["cat"] == "kernel"]
    inner = union((e["start"], e["end"]) for e in kernels if inside(e))
    kernel_time = union((e["start"], e["end"]) for e in kernels)
    busy = length(union((e["start"], e["end"]) for e in events))
    return {
        "busy_us": float(busy),
        "inside_us": float(length(inner)),
        "other_kernels_us": float(length(kernel_time) - length(inner)),
        "copies_us": float(busy - length(kernel_time)),
    }


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
