"""``benchmarks/faults.py``: its pure parts (recovery time, log lines of a window, the truths an
answer may equal), without a server."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import faults  # noqa: E402
from checked_load import TableTruth  # noqa: E402  (faults put tests/ on the path)


def test_recovery_counts_from_the_end_of_the_fault_to_the_last_bad_answer():
    assert faults.recovery_time(10.0, 0.0, 0.0) is None  # nothing failed at all: "-"
    assert faults.recovery_time(10.0, 8.0, 0.0) == 0.0  # failures during the fault only
    assert faults.recovery_time(10.0, 12.5, 11.0) == 2.5
    assert faults.recovery_time(10.0, 11.0, 13.0) == 3.0  # a wrong answer counts too


def test_lines_of_a_window_from_sampled_sizes():
    samples = [(1.0, 0), (2.0, 10), (3.0, 25), (4.0, 25)]
    assert faults.offset_at(samples, 0.5) == 0  # before the first sample
    assert faults.offset_at(samples, 2.0) == 10 and faults.offset_at(samples, 2.9) == 10
    assert faults.offset_at(samples, 9.0) == 25
    log = b"I1207 server ready\n%3|1765.1|FAIL|rdkafka#consumer-2| refused\nhps WARNING kafka\n"
    assert faults.count_log_lines(log) == (3, 1)
    assert faults.count_log_lines(b"") == (0, 0)
    assert faults.count_log_lines(b"one\npartial") == (2, 0)


def truth(value: float) -> TableTruth:
    return TableTruth(np.arange(4, dtype=np.int64), np.full((4, 2), value, np.float32), 0.0)


def test_an_answer_may_equal_the_truths_from_its_sending_on():
    old, new = [truth(1.0)], [truth(2.0)]
    load = faults.TimedLoad("127.0.0.1:1", "m", [old], threads=1)  # no thread started
    rng = np.random.default_rng(0)
    load._keys(rng, old[0])  # this thread sends a request...
    load.truths = [old, new]  # ...the reload starts...
    load.truths = [new]  # ...and returns before the answer comes
    assert load.truths == [old, new]
    load._keys(rng, old[0])  # a request sent after the reload returned
    assert load.truths == [new]

    seen = []  # a thread that sent nothing yet sees the epoch now
    reader = threading.Thread(target=lambda: seen.append(load.truths))
    reader.start()
    reader.join()
    assert seen == [[new]]
