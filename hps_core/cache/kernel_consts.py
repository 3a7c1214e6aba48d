"""Constants of the dynamic cache's CUDA kernels, shared by Python and the kernel source.

The kernels (``cache_query``, ``cache_replace``, ``cache_update``, ``static_query``,
``static_find``) are CUDA C++ in ``hps_core/cuda/kernels/cache.cu``, which takes its set-probing
helpers from ``hps_core/cuda/kernels/cache_set.cuh`` (shared with the GPU pipeline's
``bank.cu``); :func:`hps_core.cache.cupy_cache.load_kernels` compiles them at run time (NVRTC,
through CuPy and :mod:`hps_core.cuda.kernels`). The constants the source shares with Python
(ways, empty key, counter positions, lanes per key) are gathered here by :func:`cuda_defines`
from the Python modules that own them, so the two cannot drift apart. This module needs no
CuPy.

How the kernels split the work is described at the top of ``cache.cu``; their semantics
are those of :mod:`hps_core.cache.dynamic` and :mod:`hps_core.cache.static_table`.
"""

from __future__ import annotations

from hps_core.cache.layout import EMPTY_KEY, WAYS
from hps_core.cache.stats import (
    EVICTIONS,
    HITS,
    INSERTS,
    MISSES,
    RESERVED_KEY_MISSES,
    UPDATED,
)
from hps_core.cuda.kernels import define_lines

KERNEL_FILE = "cache"
"""Stem of the kernel file: ``hps_core/cuda/kernels/cache.cu``."""

KERNEL_NAMES = ("cache_query", "cache_replace", "cache_update", "static_query", "static_find")

THREADS_PER_BLOCK = 256
"""Threads per block of every kernel."""

QUERY_LANES = 8
"""Lanes per key of ``cache_query`` (a warp probes four keys at once); 32 for the others."""


def cuda_defines() -> str:
    """The ``#define`` lines ``kernels/cache.cu`` is compiled with.

    Returns:
        CUDA C++ text to put before the kernel file's text.
    """
    return define_lines(
        {
            "WAYS": WAYS,
            "QUERY_LANES": QUERY_LANES,
            "QUERY_GROUP_MASK": f"{(1 << QUERY_LANES) - 1}u",
            "EMPTY_KEY": f"{EMPTY_KEY}LL",
            "INSERTS": INSERTS,
            "EVICTIONS": EVICTIONS,
            "UPDATED": UPDATED,
            "HITS": HITS,
            "MISSES": MISSES,
            "RESERVED_KEY_MISSES": RESERVED_KEY_MISSES,
        }
    )
