"""Constants only the ranking pipeline shares with ``kernels/bank.cu`` (combiners, the one-key
segment of a pooling plan, positions in a batch's device state), and the ``#define`` lines it
is compiled with (written by :func:`hps_core.cuda.kernels.define_lines`).

What ``bank.cu`` shares with the cache's ``kernels/cache.cu`` (ways, empty key, ``LANES``,
``THREADS``, counter positions) comes from :func:`hps_core.cache.kernel_consts.shared_defines`,
the counter positions from :mod:`hps_core.cache.stats`.
"""

from __future__ import annotations

from hps_core.cache.kernel_consts import shared_defines
from hps_core.cuda.kernels import define_lines

COMBINER_SUM = 0
COMBINER_MEAN = 1

POOL_ROWS = 0
"""The split of a pooling segment (``PoolPlan``) whose one-key slots ``bank_pool`` copies as
rows, a group of lanes per ``LANES`` samples (other segments: groups of lanes per bag)."""

STATE_MISSES = 0
"""Position, in a batch's device state (uint64), of the number of listed misses."""
STATE_STAGED = 1
"""Position of table 0's count of staged rows (table ``t``'s at ``STATE_STAGED + t``)."""


def bank_defines() -> str:
    """The ``#define`` lines ``kernels/bank.cu`` is compiled with: :func:`shared_defines` and
    the constants of this module.

    Returns:
        CUDA C++ text to put before the kernel file's text.
    """
    return define_lines(
        shared_defines()
        | {
            "COMBINER_SUM": COMBINER_SUM,
            "COMBINER_MEAN": COMBINER_MEAN,
            "POOL_ROWS": POOL_ROWS,
            "STATE_MISSES": STATE_MISSES,
            "STATE_STAGED": STATE_STAGED,
        }
    )
