"""Array modules: NumPy on the host, CuPy on a GPU (which one serves a device, which one holds
an array, and copies to the host).

CuPy is imported only when a GPU is asked for, so CPU-only machines (and CI) never need it.
"""

from __future__ import annotations

import glob
import os
from typing import Any

import numpy as np

from hps_core.errors import NotAvailableError


def gpu_devices() -> list[str]:
    """This machine's GPU device files: ``/dev/nvidia0``, ... (NVIDIA's driver) or ``/dev/dxg``
    (WSL2). They exist wherever a GPU and its driver do, whether CuPy is installed or not, so
    they tell a machine without a GPU from one without CuPy."""
    return sorted(glob.glob("/dev/nvidia[0-9]*")) + glob.glob("/dev/dxg")


def _visible_devices() -> str:
    """`` (CUDA_VISIBLE_DEVICES=...)`` when that variable hides devices from CUDA, else ``""``."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "" if value is None else f" (CUDA_VISIBLE_DEVICES={value!r})"


def array_module(device_id: int | None) -> Any:
    """The array module for a device.

    Args:
        device_id: CUDA device, or ``None`` for the host.

    Returns:
        ``numpy`` for the host, ``cupy`` for a GPU.

    Raises:
        NotAvailableError: a GPU is asked for but the machine has none, CuPy is not installed,
            or CUDA does not see that device (the message says which).
    """
    if device_id is None:
        return np
    asked = f"GPU {device_id} requested"
    no_gpu = f"{asked}, but this machine has no GPU (no NVIDIA device in /dev)"
    on_cpu = "; leave device_id out (None) to run on the CPU"
    try:
        import cupy
    except ImportError as exc:
        # CuPy is missing on every machine without a GPU: say the cause, not the symptom.
        if not gpu_devices():
            raise NotAvailableError(no_gpu + on_cpu) from exc
        raise NotAvailableError(
            f"{asked}, but CuPy is not installed (pip install 'hps-triton[gpu]')"
        ) from exc
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        if not gpu_devices():
            raise NotAvailableError(
                f"{no_gpu}: CuPy is installed, CUDA says {exc}{on_cpu}"
            ) from exc
        raise NotAvailableError(
            f"{asked}, but CUDA is unusable: {exc}{_visible_devices()}"
        ) from exc
    if count == 0:
        raise NotAvailableError(f"{asked}, but CUDA sees no GPU{_visible_devices()}{on_cpu}")
    if not 0 <= device_id < count:
        raise NotAvailableError(
            f"{asked}, but {count} CUDA devices are visible{_visible_devices()}"
        )
    return cupy


def first_gpu() -> int | None:
    """GPU 0 when CuPy is installed and sees a CUDA device, else ``None`` (the host)."""
    try:
        import cupy

        return 0 if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:  # no CuPy, no driver or no device: each raises its own error types
        return None


def module_of(array: Any) -> Any:
    """``cupy`` for a CuPy array, else ``numpy``."""
    if type(array).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def to_host(array: Any) -> np.ndarray:
    """A NumPy copy (or view) of a NumPy or CuPy array."""
    return array.get() if hasattr(array, "get") else np.asarray(array)


HASHED_KEYS = 4096
"""From this many keys :func:`distinct_keys` hashes (pyarrow) rather than sorts (NumPy)."""


def distinct_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of 1-D int64 ``keys`` and each key's position among them, so that
    ``unique[index]`` is ``keys``; in no particular order (first appearance when hashed).

    From :data:`HASHED_KEYS` keys on, a hash table (pyarrow's dictionary encoding) where
    ``np.unique`` sorts: 1.5-2.7x less time for 6K-442K keys on the 2-core CPU machine (fewer
    keys: within 20%, and batches of 64 samples scored no faster). For callers that need no
    order.

    Args:
        keys: 1-D int64 keys on the host.

    Returns:
        ``(unique, index)``: int64 distinct keys and an integer array as long as ``keys``
        (read-only when hashed).

    Example:
        >>> unique, index = distinct_keys(np.array([7, 3, 7, 9], dtype=np.int64))
        >>> unique[index].tolist()
        [7, 3, 7, 9]
    """
    if len(keys) < HASHED_KEYS:
        return np.unique(keys, return_inverse=True)
    import pyarrow as pa  # a dependency; imported here so that importing hps_core stays quick
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(pa.array(np.ascontiguousarray(keys, dtype=np.int64)))
    # The distinct keys go on to the tiers: a writable copy of Arrow's (read-only) buffer.
    unique = np.array(encoded.dictionary.to_numpy(zero_copy_only=False))
    return unique, encoded.indices.to_numpy(zero_copy_only=False)
