"""Constants the ranking pipeline shares with ``kernels/bank.cu``, and the ``#define`` lines
it is compiled with (written by :func:`hps_core.cuda.kernels.define_lines`)."""

from __future__ import annotations

from hps_core.cache.layout import EMPTY_KEY, WAYS
from hps_core.cuda.kernels import define_lines
from hps_core.infer.gpu.counters import (
    C_EVICTIONS,
    C_HITS,
    C_HOST_ROWS,
    C_INSERTS,
    C_KEYS,
    C_MISSES,
    C_UNKNOWN,
    NUM_COUNTERS,
)

LANES = 8
"""Lanes that serve one key or bag in ``bank_find`` / ``bank_pool`` (four per warp)."""

THREADS = 256
"""Threads per block of the bank's kernels."""

COMBINER_SUM = 0
COMBINER_MEAN = 1

STATE_MISSES = 0
"""Position, in a batch's device state (uint64), of the number of listed misses."""
STATE_STAGED = 1
"""Position of table 0's count of staged rows (table ``t``'s at ``STATE_STAGED + t``)."""


def bank_defines() -> str:
    """The ``#define`` lines ``kernels/bank.cu`` is compiled with.

    Returns:
        CUDA C++ text to put before the kernel file's text.
    """
    return define_lines(
        {
            "WAYS": WAYS,
            "LANES": LANES,
            "GROUP_MASK": f"{(1 << LANES) - 1:#x}u",
            "EMPTY_KEY": f"{EMPTY_KEY}LL",
            "C_KEYS": C_KEYS,
            "C_HITS": C_HITS,
            "C_MISSES": C_MISSES,
            "C_UNKNOWN": C_UNKNOWN,
            "C_INSERTS": C_INSERTS,
            "C_EVICTIONS": C_EVICTIONS,
            "C_HOST_ROWS": C_HOST_ROWS,
            "NUM_COUNTERS": NUM_COUNTERS,
            "COMBINER_SUM": COMBINER_SUM,
            "COMBINER_MEAN": COMBINER_MEAN,
            "STATE_MISSES": STATE_MISSES,
            "STATE_STAGED": STATE_STAGED,
        }
    )
