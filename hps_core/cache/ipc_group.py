"""Dynamic caches shared by the processes that serve one model on one GPU (CUDA IPC).

Triton runs each model instance in its own stub process. Without sharing, two instances on
one GPU hold two copies of every cache and fill each separately. A :class:`SharedCacheGroup`
gives them one copy:

- A small shared-memory segment per (model, GPU, server) -- a
  :class:`~hps_core.tiers.shm_segment.SharedSegment`, so it is reference counted and removed
  after its last user exactly like the host tier -- records for each table the CUDA IPC handle
  of the GPU memory holding its slots, its size, and its LRU clock.
- The first process that opens a table's cache allocates that memory (one ``cudaMalloc``) and
  publishes the handle; the others map it with ``cudaIpcOpenMemHandle``. The driver keeps the
  memory while any process maps it, so the allocating process may stop first.
- Operations of different processes must not overlap on the GPU: a query racing an eviction
  could copy a row while it is overwritten. Every operation runs inside :meth:`section`: an
  exclusive ``flock`` on the segment while the process makes its CUDA stream wait for the
  interprocess event recorded by whoever worked on the group last, launches its kernels and
  records its own event. The GPU orders the work of all processes; the host lock is held only
  while kernels are launched, never while a kernel runs.

The process that built the segment is the group's *lead*: it alone warms the caches at start-up
and runs the refresher, so that N instances do not repeat that work N times.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import mmap
import os
import threading
from collections.abc import Iterator
from typing import Any

import cupy
import numpy as np

from hps_core.cache.dynamic import CacheSlots
from hps_core.cache.ipc_files import remove_own_event_files_at_exit
from hps_core.cache.layout import EMPTY_KEY, WAYS, slot_bytes
from hps_core.errors import HPSError
from hps_core.quant import RowFormat
from hps_core.tiers.shm_segment import SharedSegment, pid_alive

logger = logging.getLogger("hps_core")

# Part of every group name: bump it when the segment layout changes.
_LAYOUT_VERSION = 1
_MAGIC = 0x4850_5347_5250_0001  # "HPSGRP" + version
MAX_PROCESSES = 64
"""Processes that can use one group at once (more fall back to private caches)."""

_HEADER = np.dtype([("magic", "<u8"), ("num_tables", "<i8"), ("last", "<i8"), ("pad", "<i8")])
_TABLE = np.dtype(
    [
        ("ready", "<i8"),
        ("num_sets", "<i8"),
        ("dim", "<i8"),
        ("nbytes", "<i8"),
        ("clock", "<u8"),
        ("handle", "u1", 64),
    ]
)
_PROCESS = np.dtype([("pid", "<i8"), ("event", "u1", 64)])
_ALIGN = 256  # offsets of the keys, stamps and values inside one allocation
_CUDA_ERRORS = (cupy.cuda.driver.CUDADriverError, cupy.cuda.runtime.CUDARuntimeError)


class SharingError(HPSError):
    """A cache could not be shared (the caller falls back to a private cache)."""


def group_name(scope: str, model: str, bus_id: str, tables: list[str]) -> str:
    """Segment name of a group: equal names mean the same caches.

    Args:
        scope: who may share, e.g. ``"ppid1234"`` for the stubs of one Triton server.
        model: the ps.json model name.
        bus_id: PCI bus id of the GPU (the same GPU has the same id in every process, whatever
            its ordinal under ``CUDA_VISIBLE_DEVICES``).
        tables: one identity per table (contents, kind and capacity of its cache).

    Returns:
        A short hexadecimal digest, prefixed so the files are recognisable.
    """
    ident = "|".join([str(_LAYOUT_VERSION), scope, model, bus_id, *tables])
    return "gpucache-" + hashlib.sha256(ident.encode()).hexdigest()[:24]


def _segment_size(num_tables: int) -> int:
    return _HEADER.itemsize + num_tables * _TABLE.itemsize + MAX_PROCESSES * _PROCESS.itemsize


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class SharedCacheGroup:
    """The shared state of one model's dynamic caches on one GPU.

    Args:
        name: segment name (:func:`group_name`).
        num_tables: number of tables of the model.
        device_id: CUDA device ordinal in this process.

    Raises:
        SharingError: every process slot is taken, or the segment is not a group's.
    """

    def __init__(self, name: str, num_tables: int, device_id: int) -> None:
        self.name = name
        self.device_id = device_id
        self._num_tables = num_tables
        self._segment = SharedSegment.open(
            name, _segment_size(num_tables), self._build, writable=True
        )
        buf = self._segment.buffer
        assert buf is not None
        self._header = np.frombuffer(buf, _HEADER, 1, 0)
        self._tables = np.frombuffer(buf, _TABLE, num_tables, _HEADER.itemsize)
        self._processes = np.frombuffer(
            buf, _PROCESS, MAX_PROCESSES, _HEADER.itemsize + num_tables * _TABLE.itemsize
        )
        # The lock is an flock on the segment file; a thread lock makes it re-entrant inside
        # this process (flock does not exclude threads sharing one open file).
        self._fd = os.open(self._segment.data_path, os.O_RDWR)
        self._thread_lock = threading.RLock()
        self._depth = 0
        self._memory: dict[int, Any] = {}
        self._opened: list[int] = []
        self._events: dict[int, tuple[int, Any]] = {}
        try:
            header = self._header[0]
            if int(header["magic"]) != _MAGIC or int(header["num_tables"]) != num_tables:
                raise SharingError(f"shared cache segment {name} is not this model's group")
            with cupy.cuda.Device(device_id):
                self._event = cupy.cuda.Event(block=False, disable_timing=True, interprocess=True)
            remove_own_event_files_at_exit()
            self._slot = self._register()
        except BaseException:
            self._release()
            raise

    @property
    def lead(self) -> bool:
        """Whether this process built the group (it warms and refreshes the caches)."""
        return self._segment.built_here

    def _build(self, buffer: mmap.mmap) -> None:
        header = np.frombuffer(buffer, _HEADER, 1, 0)
        header["magic"] = _MAGIC
        header["num_tables"] = self._num_tables
        header["last"] = -1

    def _register(self) -> int:
        handle = np.frombuffer(cupy.cuda.runtime.ipcGetEventHandle(self._event.ptr), np.uint8)
        with self._locked():
            for slot, proc in enumerate(self._processes):
                pid = int(proc["pid"])
                if pid == 0 or not pid_alive(pid):
                    self._processes["event"][slot] = handle
                    self._processes["pid"][slot] = os.getpid()
                    return slot
        raise SharingError(f"shared cache group {self.name}: {MAX_PROCESSES} processes use it")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._thread_lock:
            self._depth += 1
            try:
                if self._depth == 1:
                    fcntl.flock(self._fd, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    if self._depth == 1:
                        fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                self._depth -= 1

    @contextlib.contextmanager
    def section(self) -> Iterator[None]:
        """Run GPU work on the group's caches after, and before, every other process's.

        Re-entrant: nested sections of one thread share the outer one. Work must be launched
        on the current CUDA stream of the thread that entered the section.
        """
        with self._locked(), cupy.cuda.Device(self.device_id):
            outer = self._depth == 1
            stream = cupy.cuda.get_current_stream()
            if outer:
                self._wait_for_last(stream)
            try:
                yield
            finally:
                if outer:
                    self._event.record(stream)
                    self._header["last"] = self._slot

    def _wait_for_last(self, stream: Any) -> None:
        last = int(self._header["last"][0])
        if last < 0:
            return
        if last == self._slot:
            stream.wait_event(self._event)
            return
        pid = int(self._processes["pid"][last])
        if pid == 0:
            return  # that process detached after synchronising its work
        known = self._events.get(last)
        if known is None or known[0] != pid:
            if known is not None:
                cupy.cuda.runtime.eventDestroy(known[1])
            try:
                event = cupy.cuda.runtime.ipcOpenEventHandle(bytes(self._processes["event"][last]))
            except _CUDA_ERRORS as exc:
                # Its process is gone (its context, and any work in it, with it).
                logger.warning("shared cache %s: event of pid %d unusable: %s", self.name, pid, exc)
                self._events.pop(last, None)
                return
            known = (pid, event)
            self._events[last] = known
        cupy.cuda.runtime.streamWaitEvent(stream.ptr, known[1], 0)

    def table_slots(
        self, index: int, num_sets: int, row_format: RowFormat
    ) -> tuple[CacheSlots, bool]:
        """The slots of table ``index``: mapped if another process made them, else new.

        Args:
            index: table index in the model.
            num_sets: sets of its cache.
            row_format: how its rows are stored (width and precision).

        Returns:
            ``(slots, created_here)``.

        Raises:
            SharingError: the published cache has another shape, or could not be mapped.
        """
        dim = row_format.dim
        sizes = slot_bytes(num_sets, dim, row_format.precision)
        keys_bytes = sizes.keys
        values_offset = _aligned(sizes.keys) + _aligned(sizes.stamps)
        nbytes = values_offset + sizes.values
        with self.section():
            entry = self._tables[index : index + 1]
            created = int(entry["ready"][0]) == 0
            if created:
                memory = cupy.cuda.memory.Memory(nbytes)
                ptr = memory.ptr
            else:
                published = (int(entry["num_sets"][0]), int(entry["dim"][0]))
                # Equal shapes of another precision differ in their bytes.
                if published != (num_sets, dim) or int(entry["nbytes"][0]) != nbytes:
                    raise SharingError(
                        f"shared cache group {self.name}, table {index}: published with "
                        f"{published[0]} sets of dim {published[1]} in "
                        f"{int(entry['nbytes'][0])} bytes, wanted {num_sets} of dim {dim} "
                        f"({row_format.precision.value}) in {nbytes} bytes"
                    )
                try:
                    ptr = cupy.cuda.runtime.ipcOpenMemHandle(bytes(entry["handle"][0]))
                except _CUDA_ERRORS as exc:
                    raise SharingError(
                        f"shared cache group {self.name}, table {index}: cannot map: {exc}"
                    ) from exc
                self._opened.append(ptr)
                memory = cupy.cuda.UnownedMemory(ptr, nbytes, owner=self)
            self._memory[index] = memory

            def view(offset: int, shape: tuple[int, ...], dtype: Any) -> Any:
                return cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(memory, offset))

            slots = CacheSlots(
                keys=view(0, (num_sets, WAYS), cupy.int64),
                stamps=view(_aligned(keys_bytes), (num_sets, WAYS), cupy.uint64),
                values=view(
                    values_offset,
                    (num_sets * WAYS, row_format.row_words),
                    row_format.stored_dtype,
                ),
                clock=self._tables["clock"][index : index + 1],
            )
            if created:
                slots.keys.fill(EMPTY_KEY)
                slots.stamps.fill(0)
                handle = cupy.cuda.runtime.ipcGetMemHandle(ptr)
                entry["handle"][0] = np.frombuffer(handle, np.uint8)
                entry["num_sets"], entry["dim"], entry["nbytes"] = num_sets, dim, nbytes
                entry["clock"] = 0
                entry["ready"] = 1
        return slots, created

    def close(self) -> None:
        """Finish this process's work on the caches, then detach (the last user frees them)."""
        with self._locked(), cupy.cuda.Device(self.device_id) as device:
            # Every stream of this process (the GPU pipeline, the lookup engine and online
            # updates have their own) must be done with the slots before they are unmapped
            # or freed.
            device.synchronize()
            if int(self._processes["pid"][self._slot]) == os.getpid():
                self._processes["pid"][self._slot] = 0
        self._release()

    def _release(self) -> None:
        if self._fd < 0:
            return
        with cupy.cuda.Device(self.device_id):
            for _, event in self._events.values():
                with contextlib.suppress(*_CUDA_ERRORS):
                    cupy.cuda.runtime.eventDestroy(event)
            self._events.clear()
            self._memory.clear()
            for ptr in self._opened:
                with contextlib.suppress(*_CUDA_ERRORS):
                    cupy.cuda.runtime.ipcCloseMemHandle(ptr)
            self._opened.clear()
        os.close(self._fd)
        self._fd = -1
        # Views of the mapping must go before the segment unmaps it.
        del self._header, self._tables, self._processes
        self._segment.close()
