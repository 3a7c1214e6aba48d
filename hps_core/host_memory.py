"""How the process's C allocator keeps memory between batches.

The NumPy path allocates each batch's arrays afresh (keys, rows, activations: megabytes at a
thousand samples). glibc's ``malloc`` hands out blocks from 128 KiB on with ``mmap`` until a
block of that size is freed (it then raises that threshold to the block's size), and gives the
top of its heap back to the operating system whenever more than twice the largest freed block
lies free there. A batch's arrays together are many times its largest one, so every batch freed
its heap's top and the next one mapped and zeroed those pages again: on the 2-core CPU machine
the zoo's DLRM at 1,024 samples took 1,848 page faults and 10.8-11.2 ms a batch, 4.1-4.7 ms
with the settings below and no fault (``benchmarks/cpu_batch_memory.py``,
docs/BENCHMARKS_HISTORY.md).

:func:`keep_freed_memory` makes glibc serve blocks below :data:`MMAP_THRESHOLD` from its heap
and keep up to :data:`TRIM_THRESHOLD` of freed memory for the next batch. It is process-wide:
the Triton models call it when they initialise (each instance is a process of its own), as
does ``hps predict``; ``HPS_MALLOC_TUNING=off`` in the environment leaves glibc's defaults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading

logger = logging.getLogger("hps_core")

MMAP_THRESHOLD = 32 << 20
"""Blocks smaller than this come from the heap (glibc's largest allowed value on 64-bit)."""
TRIM_THRESHOLD = 256 << 20
"""The most freed memory the heap keeps at its top rather than returning it."""

# mallopt parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_lock = threading.Lock()
_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Let this process's glibc ``malloc`` keep freed memory for the next batch (see the
    module docstring); the first call decides, later calls return its answer.

    Returns:
        Whether the settings are in effect: False without glibc, when ``mallopt`` refuses
        them, or with ``HPS_MALLOC_TUNING=off``.

    Example:
        >>> from hps_core.host_memory import keep_freed_memory
        >>> keep_freed_memory()  # doctest: +SKIP
        True
    """
    global _applied
    with _lock:
        if _applied is None:
            _applied = _apply()
        return _applied


def _apply() -> bool:
    if os.environ.get("HPS_MALLOC_TUNING", "on").strip().lower() == "off":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    # glibc only: another C library (musl) reads these parameter numbers otherwise, if at all.
    if not (hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt")):
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    settings = ((_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    applied = all(mallopt(param, value) == 1 for param, value in settings)
    if not applied:
        logger.warning("glibc refused the malloc thresholds; batches may fault their pages in")
    return applied
