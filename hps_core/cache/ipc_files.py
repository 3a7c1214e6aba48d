"""The ``/dev/shm`` files behind CUDA interprocess events, and their removal.

The CUDA driver backs the interprocess events of a process with a file
``/dev/shm/cuda.shm.<uid>.<pid in hex>.<n>`` (80 KiB) and leaves it there when the process
exits (seen with driver 580 on the H200 machine, clean exits included). A shared cache group
(:mod:`hps_core.cache.ipc_group`) gives every process one such event, so without cleanup each
stub that ever shared a cache would leave a file behind. Removing the file of a process is safe
once that process no longer creates events: only it creates the file, and processes that have
opened its events keep their mapping.

This module needs no CUDA: the server launcher uses it to sweep after stubs it had to kill.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

CUDA_SHM_DIR = Path("/dev/shm")


def cuda_event_files(pid: int, directory: Path = CUDA_SHM_DIR) -> list[Path]:
    """The event files CUDA made for process ``pid`` of this user.

    Args:
        pid: process id.
        directory: where CUDA puts them (``/dev/shm``).

    Returns:
        The existing files, sorted.
    """
    return sorted(directory.glob(f"cuda.shm.{os.getuid()}.{pid:x}.*"))


def remove_cuda_event_files(pids: Iterable[int], directory: Path = CUDA_SHM_DIR) -> list[str]:
    """Remove the event files of ``pids`` (processes of this user that are done with CUDA IPC).

    Args:
        pids: the processes, e.g. stubs of a server that stopped, or this process at exit.
        directory: where CUDA puts them (``/dev/shm``).

    Returns:
        Names of the files removed.
    """
    removed = []
    for pid in pids:
        for path in cuda_event_files(pid, directory):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path.name)
    return removed


def remove_own_event_files_at_exit() -> None:
    """Remove this process's event files when it exits (registered once per process)."""
    import atexit

    global _registered
    if not _registered:
        _registered = True
        pid = os.getpid()
        atexit.register(remove_cuda_event_files, [pid])


_registered = False
