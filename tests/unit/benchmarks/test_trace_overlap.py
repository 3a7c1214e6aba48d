"""``benchmarks/trace_overlap.py``: the overlap of kernel kinds in a Chrome trace, against
times worked out by hand on a synthetic trace."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import trace_overlap  # noqa: E402


def kernel(name: str, stream: int, ts: float, dur: float, cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}


TRACE = {
    "traceEvents": [
        kernel("bank_find", 7, 0.0, 10.0),
        kernel("bank_pool_rows", 9, 8.0, 4.0),  # 2 us beside the first find
        kernel("bank_find", 7, 12.0, 10.0),
        kernel("bank_pool", 9, 20.0, 6.0),  # 2 us beside the second find
        kernel("Memcpy HtoD (Pinned -> Device)", 3, 30.0, 5.0, "gpu_memcpy"),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 99.0},  # host side
        {"ph": "i", "cat": "kernel", "name": "marker", "ts": 1.0},
    ]
}


def test_kinds_their_union_and_the_time_both_ran():
    events = trace_overlap.device_events(TRACE)
    assert len(events) == 5
    rows = {r["what"]: r for r in trace_overlap.overlap_table(events, ["bank_find", "bank_pool"])}
    assert rows["bank_find"]["kernels"] == 2 and rows["bank_find"]["union_us"] == 20.0
    assert rows["bank_pool"]["summed_us"] == 10.0 and rows["bank_pool"]["streams"] == 1
    assert rows["bank_find & bank_pool"]["union_us"] == pytest.approx(4.0)
    # Busy: [0, 26) from the kernels, [30, 35) the copy.
    assert rows["device busy"]["union_us"] == pytest.approx(31.0)
    assert rows["device busy"]["streams"] == 3


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        ([], [(0.0, 1.0)], 0.0),
        ([(0.0, 1.0)], [(1.0, 2.0)], 0.0),
        ([(0.0, 10.0)], [(2.0, 3.0), (4.0, 6.0), (9.0, 12.0)], 4.0),
        ([(0.0, 2.0), (3.0, 5.0)], [(1.0, 4.0)], 2.0),
    ],
)
def test_intersection(a, b, want):
    assert trace_overlap.intersection(a, b) == want
    assert trace_overlap.intersection(b, a) == want


def test_the_script_writes_its_table(tmp_path: Path):
    trace = tmp_path / "trace_x.json"
    trace.write_text(json.dumps(TRACE))
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "trace_overlap.py"), str(trace), "--out", str(tmp_path)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "| bank_find & bank_pool |" in done.stdout
    assert (tmp_path / "trace_x_overlap.csv").read_text().startswith("what,kernels,streams")
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"traceEvents": []}))
    failed = subprocess.run(
        [sys.executable, str(BENCHMARKS / "trace_overlap.py"), str(empty)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert failed.returncode != 0 and "no kernel, copy or memset events" in failed.stderr


def test_timeline_split_counts_copies_only_where_no_kernel_ran():
    """Of the 31 us busy: 20 us of finds, 6 us of poolings alone, 5 us of the copy alone; a
    copy beside a find counts nowhere."""
    events = trace_overlap.device_events(TRACE)
    split = trace_overlap.timeline_split(events, lambda e: e["name"] == "bank_find")
    assert split == {
        "busy_us": 31.0, "inside_us": 20.0, "other_kernels_us": 6.0, "copies_us": 5.0,
    }  # fmt: skip
    beside = [*events, {"cat": "gpu_memcpy", "name": "copy", "start": 1.0, "end": 9.0}]
    assert trace_overlap.timeline_split(beside, lambda e: e["name"] == "bank_find") == split
    everything = trace_overlap.timeline_split(events, lambda e: True)
    assert everything["inside_us"] == 26.0 and everything["other_kernels_us"] == 0.0
