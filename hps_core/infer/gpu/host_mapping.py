"""Host-tier segments read in place by GPU kernels (zero copy).

A table's shared-memory segment (:mod:`hps_core.tiers.host_table`) is pinned with
``cudaHostRegister(Mapped | ReadOnly)``. On GPUs that can use the host pointer for registered
memory (``CanUseHostPointerForRegisteredMem``; every Linux GPU with unified addressing), the
host address is then also the device address, so kernels read rows of the one copy of the host
tier that every process of the machine maps. Each process registers the pages it maps; a
process-wide count lets several models share a segment's registration.
"""

from __future__ import annotations

import threading

import cupy

from hps_core.errors import NotAvailableError
from hps_core.tiers.host_table import SharedHostTable

# CUDA runtime flags CuPy does not name (cuda_runtime_api.h)
_MAPPED = 2  # cudaHostRegisterMapped
_READ_ONLY = 8  # cudaHostRegisterReadOnly

_lock = threading.Lock()
_registered: dict[int, int] = {}  # base address -> users


def map_host_table(host: SharedHostTable, device_id: int) -> int:
    """Register ``host``'s segment for GPU access and return the device address of its rows.

    Args:
        host: an open host-tier table.
        device_id: the GPU that reads it.

    Returns:
        Address of ``values[0, 0]`` usable by kernels on ``device_id``.

    Raises:
        NotAvailableError: the GPU cannot read registered host memory at its host address, or
            registration failed.
    """
    with cupy.cuda.Device(device_id) as device:
        if not device.attributes.get("CanUseHostPointerForRegisteredMem", 0):
            raise NotAvailableError(
                f"GPU {device_id} cannot read registered host memory at its host address "
                "(CanUseHostPointerForRegisteredMem is 0); the host tier cannot be read in place"
            )
        base, nbytes = host.buffer_address()
        with _lock:
            users = _registered.get(base, 0)
            if users == 0:
                try:
                    cupy.cuda.runtime.hostRegister(base, nbytes, _MAPPED | _READ_ONLY)
                except cupy.cuda.runtime.CUDARuntimeError as exc:
                    raise NotAvailableError(
                        f"cannot register the host tier of {host.sparse_dir} "
                        f"({nbytes / 2**20:.1f} MiB) for GPU access: {exc}"
                    ) from exc
            _registered[base] = users + 1
    return base + host.layout.values_offset


def unmap_host_table(host: SharedHostTable) -> None:
    """Drop one registration of ``host``'s segment (the last one unregisters it).

    Call before the table is closed: the pages must stay mapped while registered.
    """
    base, _ = host.buffer_address()
    with _lock:
        users = _registered.get(base, 0)
        if users <= 1:
            _registered.pop(base, None)
            if users == 1:
                cupy.cuda.runtime.hostUnregister(base)
        else:
            _registered[base] = users - 1
