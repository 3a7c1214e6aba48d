"""keep_freed_memory: batch after batch of freshly allocated arrays stops faulting its pages
in (glibc), and ``HPS_MALLOC_TUNING=off`` leaves glibc as it is.

Each case runs in a child process: the settings are process-wide and would otherwise outlive
the test in the worker.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="the thresholds are glibc's"
)

# Batches of five 4 MiB arrays, each written and then freed: glibc's default heap returns its
# top once more than twice the largest freed block (8 MiB) lies free, so every batch maps and
# zeroes its 20 MiB again. Prints whether the settings applied and the minor page faults of
# the last 20 batches.
CHILD = """
import resource, sys
import numpy as np
from hps_core.host_memory import keep_freed_memory

applied = keep_freed_memory() if sys.argv[1] == "keep" else None
assert applied is None or keep_freed_memory() is applied  # the first call decides

def batch():
    arrays = [np.ones(1 << 20, np.float32) for _ in range(5)]
    return sum(float(a[-1]) for a in arrays)

for _ in range(5):
    batch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    batch()
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def run_child(mode: str, **env: str) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.split()
    return out[0], int(out[1])


def test_freed_batch_memory_is_kept_for_the_next_batch() -> None:
    applied, kept = run_child("keep")
    _, default = run_child("default")
    assert applied == "True"
    # 20 batches of 20 MiB: tens of thousands of faults of 4 KiB pages with the defaults.
    assert default > 20 * 1000
    assert kept < 200


def test_switched_off_by_the_environment() -> None:
    applied, faults = run_child("keep", HPS_MALLOC_TUNING="off")
    assert applied == "False"
    assert faults > 20 * 1000
