"""The dynamic cache on a GPU: CuPy arrays and the kernels of ``hps_core/cuda/kernels/cache.cu``.

The kernel file is compiled through :mod:`hps_core.cuda.kernels` with the constants of
:mod:`hps_core.cache.kernel_consts`.

Importing this module needs CuPy; :func:`hps_core.cache.make_cache` imports it only for
``xp=cupy``. Calls run on the caller's current CUDA stream; all calls on one cache must use
the same stream (or synchronise between them), as the clock and counters assume call order.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import cupy
import numpy as np

from hps_core.cache.dynamic import DynamicCache
from hps_core.cache.ipc_group import SharedCacheGroup
from hps_core.cache.kernel_consts import (
    KERNEL_FILE,
    KERNEL_NAMES,
    LANES,
    THREADS,
    WARP,
    cuda_defines,
    storage_code,
)
from hps_core.cache.layout import RunPlan, plan_runs
from hps_core.cache.order import StreamOrder
from hps_core.cuda import kernels
from hps_core.errors import HPSError
from hps_core.quant import RowFormat, StoragePrecision

_CUDA_ERRORS = (cupy.cuda.driver.CUDADriverError, cupy.cuda.runtime.CUDARuntimeError)


class CacheKernelError(HPSError):
    """A cache kernel failed to compile, to launch, or to run."""


@functools.cache
def load_kernels(device_id: int) -> dict[str, Any]:
    """Compile (once per device and process) and load the cache kernels (``kernels/cache.cu``).

    Args:
        device_id: CUDA device ordinal.

    Returns:
        ``{name: cupy.RawKernel}`` for every name in ``KERNEL_NAMES``.

    Raises:
        CacheKernelError: NVRTC rejected the source or the module did not load.
    """
    with cupy.cuda.Device(device_id):
        try:
            module = kernels.module(KERNEL_FILE, device_id, defines=cuda_defines())
            return {name: module.get_function(name) for name in KERNEL_NAMES}
        except (kernels.KernelBuildError, *_CUDA_ERRORS) as exc:
            raise CacheKernelError(
                f"cache kernels failed to build for CUDA device {device_id}: {exc}"
            ) from exc


class CupyDynamicCache(DynamicCache):
    """The dynamic cache on the current CUDA device; semantics in :mod:`hps_core.cache.dynamic`.

    Args:
        num_sets: number of 64-slot sets.
        dim: embedding width.
        name: label used in error messages.
        sync_checks: synchronise after every kernel so that a fault inside it is reported
            with its name (slower; meant for tests and debugging). Launch errors are always
            reported.
        group: share the slots with the other processes of this group (CUDA IPC), as table
            ``group_index``; see :mod:`hps_core.cache.ipc_group`.
        group_index: the table's index in ``group``.
        precision: how the rows are stored; queries decode them to float32 in the kernel.
    """

    def __init__(
        self,
        num_sets: int,
        dim: int,
        *,
        name: str = "cache",
        sync_checks: bool = False,
        group: SharedCacheGroup | None = None,
        group_index: int = 0,
        precision: StoragePrecision = StoragePrecision.FP32,
    ) -> None:
        self._device_id = cupy.cuda.Device().id
        self._group = group
        slots, self._created_here = None, True
        if group is not None:
            fmt = RowFormat(precision, int(dim))
            slots, self._created_here = group.table_slots(group_index, int(num_sets), fmt)
        super().__init__(num_sets, dim, cupy, name, slots, precision=precision)
        self.sync_checks = sync_checks
        self._kernels = load_kernels(self._device_id)
        # Kernel arguments that never change, made once: a query is short enough for the
        # host's per-call work to matter.
        self._num_sets_arg = np.uint64(self._num_sets)
        self._dim_arg = np.int32(self._dim)
        self._words_arg = np.int32(self.row_format.row_words)
        self._storage_arg = np.int32(storage_code(self.row_format.precision))
        self._rows_aligned = self._dim % 4 == 0 and self._values.data.ptr % 16 == 0
        #: Orders this cache's kernels after those of other streams touching it (set by the
        #: GPU pipeline, see :mod:`hps_core.cache.order`); a shared cache's group does that.
        self.order: StreamOrder | None = None

    @property
    def shared(self) -> bool:
        """Whether other processes use the same slots."""
        return self._group is not None

    @property
    def created_here(self) -> bool:
        """Whether this process allocated the slots (always, unless it joined a group)."""
        return self._created_here

    def _section(self) -> contextlib.AbstractContextManager[Any]:
        if self._group is None and self.order is None:
            return super()._section()
        return self._ordered_section()

    @contextlib.contextmanager
    def _ordered_section(self) -> Iterator[None]:
        # The group (or order) first, then the cache: every thread takes them in this order.
        outer = self._group if self._group is not None else self.order
        with outer.section(), self._lock, self._device():
            yield

    @property
    def device_id(self) -> int:
        """CUDA device holding the cache."""
        return self._device_id

    def _device(self) -> contextlib.AbstractContextManager[Any]:
        return cupy.cuda.Device(self._device_id)

    def _launch(self, name: str, items: int, args: tuple[Any, ...], lanes: int = WARP) -> None:
        """Run kernel ``name`` with ``lanes`` threads per item; report any CUDA error by name."""
        blocks = -(-items * lanes // THREADS)
        try:
            self._kernels[name]((blocks,), (THREADS,), args)
            if self.sync_checks:
                cupy.cuda.get_current_stream().synchronize()
        except _CUDA_ERRORS as exc:
            raise CacheKernelError(
                f"cache {self.name!r}: kernel {name} on {items} items failed: {exc}"
            ) from exc

    def _query(self, keys: Any, out: Any, clock: np.uint64) -> Any:
        n = int(keys.shape[0])
        hit = cupy.empty(n, dtype=bool)
        self._launch(
            "cache_query",
            n,
            (
                keys,
                np.int64(n),
                self._num_sets_arg,
                self._keys,
                self._stamps,
                self._values,
                self._dim_arg,
                self._words_arg,
                self._storage_arg,
                clock,
                out,
                hit,
                self._counters,
                # 16-byte row copies need rows of whole float4s on 16-byte boundaries.
                self._rows_aligned and out.data.ptr % 16 == 0,
            ),
            lanes=LANES,
        )
        return hit

    def _replace(self, keys: Any, rows: Any, sets: Any, plan: RunPlan, clock: np.uint64) -> None:
        self._launch(
            "cache_replace",
            plan.runs,
            (
                keys,
                rows,
                plan.order,
                plan.bounds,
                np.int64(plan.runs),
                sets,
                self._keys,
                self._stamps,
                self._values,
                self._words_arg,
                clock,
                self._counters,
            ),
        )

    def _update(self, keys: Any, rows: Any, sets: Any, positions: Any) -> None:
        plan = plan_runs(sets, positions, cupy)
        self._launch(
            "cache_update",
            plan.runs,
            (
                keys,
                rows,
                plan.order,
                plan.bounds,
                np.int64(plan.runs),
                sets,
                self._keys,
                self._values,
                self._words_arg,
                self._counters,
            ),
        )
