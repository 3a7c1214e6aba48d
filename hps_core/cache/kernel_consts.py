"""Constants of the GPU cache kernels, shared by Python and the kernel sources.

Two kernel files probe the 64-way sets of a dynamic cache, through the helpers of
``hps_core/cuda/kernels/cache_set.cuh``: ``hps_core/cuda/kernels/cache.cu``, the dynamic cache's
and the static table's own kernels (``cache_query``, ``cache_replace``, ``cache_update``,
``static_query``, ``static_find``, loaded by :func:`hps_core.cache.cupy_cache.load_kernels`),
and ``hps_core/cuda/kernels/bank.cu``, the GPU ranking pipeline's grouped-table kernels
(compiled with :func:`hps_core.infer.gpu.constants.bank_defines`). Both are compiled at run
time (NVRTC, through CuPy and :mod:`hps_core.cuda.kernels`). The constants they share with
Python and with each other (ways, empty key, lanes per key, threads per block, counter
positions) are written once, by :func:`shared_defines`, from the Python modules that own them,
so they cannot drift apart. This module needs no CuPy.

How ``cache.cu``'s kernels split the work is described at the top of that file; their
semantics are those of :mod:`hps_core.cache.dynamic` and :mod:`hps_core.cache.static_table`.
"""

from __future__ import annotations

from hps_core.cache.layout import EMPTY_KEY, WAYS
from hps_core.cache.stats import (
    EVICTIONS,
    HITS,
    HOST_ROWS,
    INSERTS,
    KEYS,
    MISSES,
    NUM_COUNTERS,
    RESERVED_KEY_MISSES,
    UNKNOWN,
    UPDATED,
)
from hps_core.cuda.kernels import define_lines
from hps_core.quant import StoragePrecision

KERNEL_FILE = "cache"
"""Stem of the cache's kernel file: ``hps_core/cuda/kernels/cache.cu``."""

KERNEL_NAMES = ("cache_query", "cache_replace", "cache_update", "static_query", "static_find")

WARP = 32
"""Threads of a warp: the kernels that give a work item a warp, and ``bank_pool``'s groups of
``LANES`` lanes sharing a bag (at most ``WARP // LANES`` of them)."""

THREADS = 256
"""Threads per block of every kernel of ``kernels/cache.cu`` and ``kernels/bank.cu``."""

LANES = 8
"""Lanes per key, four keys per warp (``GROUP_MASK`` in the kernels: as many low bits set): in
``kernels/cache.cu`` those of ``cache_query``, each loading ``WAYS / LANES`` of the set's keys,
and of ``static_query`` (the other kernels there use a warp, 32 lanes, per work item); in
``kernels/bank.cu`` those that serve one key or bag in ``bank_find``, ``bank_pool`` and
``bank_probe`` (``bank_insert`` uses a warp per miss)."""


STORAGE_CODES: dict[StoragePrecision, int] = {
    StoragePrecision.FP32: 0,
    StoragePrecision.FP16: 1,
    StoragePrecision.INT8: 2,
    StoragePrecision.FP8: 3,
}
"""The kernels' number for each storage precision (``STORAGE_FP32`` ... in
``kernels/row_codec.cuh``, which decodes rows of each)."""


def storage_code(precision: StoragePrecision) -> int:
    """The kernels' number of a storage precision (:data:`STORAGE_CODES`).

    Example:
        >>> storage_code(StoragePrecision.INT8)
        2
    """
    return STORAGE_CODES[StoragePrecision.parse(precision)]


def shared_defines() -> dict[str, int | str]:
    """The constants both ``kernels/cache.cu`` and ``kernels/bank.cu`` are compiled with.

    Returns:
        ``#define`` name -> value, for :func:`hps_core.cuda.kernels.define_lines`.
    """
    return {
        "WAYS": WAYS,
        "EMPTY_KEY": f"{EMPTY_KEY}LL",
        "WARP": WARP,
        "THREADS": THREADS,
        "LANES": LANES,
        "GROUP_MASK": f"{(1 << LANES) - 1:#x}u",
        "HITS": HITS,
        "MISSES": MISSES,
        "RESERVED_KEY_MISSES": RESERVED_KEY_MISSES,
        "INSERTS": INSERTS,
        "EVICTIONS": EVICTIONS,
        "UPDATED": UPDATED,
        "KEYS": KEYS,
        "UNKNOWN": UNKNOWN,
        "HOST_ROWS": HOST_ROWS,
        "NUM_COUNTERS": NUM_COUNTERS,
        **{f"STORAGE_{p.name}": code for p, code in STORAGE_CODES.items()},
    }


def cuda_defines() -> str:
    """The ``#define`` lines ``kernels/cache.cu`` is compiled with: :func:`shared_defines`.

    Returns:
        CUDA C++ text to put before the kernel file's text.
    """
    return define_lines(shared_defines())
