"""Order GPU work on a model's caches that different threads launch on different streams.

A model's embedding caches are touched by the GPU pipeline (its own stream, from Triton's
thread), by cache warm-up and by the refresher (other threads, other streams). Kernels of two
streams may run at the same time, and a lookup must not read a slot while an insert or a
refresh rewrites it. :class:`StreamOrder` makes every such piece of work wait, on the GPU, for
the one launched before it, whatever stream launched it; the host never waits. (Caches shared
between processes are ordered the same way by their
:class:`~hps_core.cache.ipc_group.SharedCacheGroup`.)
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import cupy


class StreamOrder:
    """A serial order for GPU work launched from any thread on any stream of one device.

    Args:
        device_id: the CUDA device.

    Example:
        >>> order = StreamOrder(0)  # doctest: +SKIP
        >>> with order.section():  # doctest: +SKIP
        ...     launch_kernels_on_the_current_stream()
    """

    def __init__(self, device_id: int) -> None:
        self.device_id = device_id
        self._lock = threading.RLock()
        self._depth = 0
        with cupy.cuda.Device(device_id):
            self._event = cupy.cuda.Event(block=False, disable_timing=True)
        self._last_stream: int | None = None

    @contextlib.contextmanager
    def section(self) -> Iterator[None]:
        """Launch work on the current stream after all work of earlier sections.

        Re-entrant; work must be launched on the current CUDA stream of the thread.
        """
        with self._lock, cupy.cuda.Device(self.device_id):
            self._depth += 1
            stream = cupy.cuda.get_current_stream()
            outer = self._depth == 1
            try:
                if outer and self._last_stream not in (None, stream.ptr):
                    stream.wait_event(self._event)
                yield
            finally:
                self._depth -= 1
                if outer:
                    self._event.record(stream)
                    self._last_stream = stream.ptr
