"""The dynamic (LRU) embedding cache: its contract, and the code both implementations share.

:class:`DynamicCache` checks arguments, keeps the clock and the counters, and implements the
operations that need no kernel (``dump``, ``size``, ``clear``). The NumPy twin
(``tests/unit/cache/cache_twin.py``, the reference) and the CuPy cache
(:mod:`hps_core.cache.cupy_cache`) implement
``_query``, ``_replace`` and ``_update``; given the same calls they hold bit-for-bit the same
state. The layout and how it differs from HugeCTR is in :mod:`hps_core.cache.layout`.

Semantics (both implementations):

- ``query(keys, out=None)``: a key is a hit when it is stored. Hit rows of ``out`` get the
  stored vector; miss rows of ``out`` are left untouched (a fresh ``out`` is zero-filled), so
  a caller may pre-fill defaults. Each hit refreshes its slot's stamp to ``clock + position``
  (a key queried twice keeps the later stamp). ``EMPTY_KEY`` always misses.
- ``replace(keys, values)``: keys are applied in batch order. A stored key only gets its
  stamp refreshed (its vector is kept, as in HugeCTR); a new key takes the lowest empty slot
  of its set, or evicts the least recently used one. So if a batch names a new key twice,
  the first vector wins. ``EMPTY_KEY`` is skipped.
- ``update(keys, values)``: overwrites the vectors of stored keys only; no stamp changes; the
  last occurrence of a duplicated key wins.
- ``dump(set_start, set_end)``: stored keys of those sets, in slot order.

Every call advances the clock by its batch length (``query`` and ``replace``), so each touch
has a unique stamp and eviction follows exact LRU order.

A cache may live in memory it does not own (:class:`CacheSlots`): the CUDA cache shares its
slots and clock with other processes on the same GPU that way
(:mod:`hps_core.cache.ipc_group`); every operation then runs inside :meth:`DynamicCache._section`,
which subclasses extend to order the work of those processes.
"""

from __future__ import annotations

import contextlib
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np

from hps_core.cache.arrays import as_keys, as_stored, output_rows
from hps_core.cache.layout import EMPTY_KEY, WAYS, RunPlan, plan_runs, set_of
from hps_core.cache.stats import (
    NUM_COUNTERS,
    CacheStats,
    stats_from_counters,
)
from hps_core.quant import RowFormat, StoragePrecision


@dataclass(frozen=True)
class CacheState:
    """Host copy of a dynamic cache's whole state (for inspection and tests).

    Attributes:
        keys: int64 ``[num_sets, WAYS]``, ``EMPTY_KEY`` in empty slots.
        stamps: uint64 ``[num_sets, WAYS]`` last-touch stamps.
        values: the stored rows, ``[num_sets * WAYS, row_words]`` of the cache's
            ``row_format.stored_dtype`` (float32 ``[.., dim]`` for fp32); rows of empty slots
            are stale.
        clock: the stamp the next call starts from.
    """

    keys: np.ndarray
    stamps: np.ndarray
    values: np.ndarray
    clock: int


@dataclass(frozen=True)
class CacheSlots:
    """The arrays that hold a dynamic cache's state (see :mod:`hps_core.cache.layout`).

    Attributes:
        keys: int64 ``[num_sets, WAYS]``.
        stamps: uint64 ``[num_sets, WAYS]``.
        values: stored rows, ``row_format.stored_dtype`` ``[num_sets * WAYS, row_words]``.
        clock: host uint64 ``[1]``: the stamp the next call starts from. Shared caches keep it
            in shared memory next to the slots' owner record.
    """

    keys: Any
    stamps: Any
    values: Any
    clock: np.ndarray


def new_slots(num_sets: int, row_format: RowFormat, xp: Any) -> CacheSlots:
    """Empty slots of a fresh cache, allocated with ``xp`` on the current device.

    Args:
        num_sets: number of 64-slot sets.
        row_format: how a row is stored.
        xp: ``numpy`` or ``cupy``.

    Returns:
        Keys all ``EMPTY_KEY``, stamps and values zero, clock zero.
    """
    return CacheSlots(
        keys=xp.full((num_sets, WAYS), EMPTY_KEY, dtype=xp.int64),
        stamps=xp.zeros((num_sets, WAYS), dtype=xp.uint64),
        values=xp.zeros((num_sets * WAYS, row_format.row_words), dtype=row_format.stored_dtype),
        clock=np.zeros(1, dtype=np.uint64),
    )


class _Held:
    """Context of one operation: hold ``lock``, with ``device`` current (a plain class: this
    runs on every query, where a generator-based context manager costs microseconds)."""

    __slots__ = ("_device", "_lock")

    def __init__(self, lock: threading.Lock, device: contextlib.AbstractContextManager[Any]):
        self._lock = lock
        self._device = device

    def __enter__(self) -> None:
        self._lock.acquire()
        try:
            self._device.__enter__()
        except BaseException:
            self._lock.release()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self._device.__exit__(*exc)
        finally:
            self._lock.release()


def _to_host(arr: Any) -> np.ndarray:
    # CuPy arrays copy to host with .get(); NumPy arrays are copied so the state is a snapshot.
    return arr.get() if hasattr(arr, "get") else arr.copy()


class DynamicCache(ABC):
    """Set-associative LRU embedding cache of ``num_sets * 64`` rows.

    Args:
        num_sets: number of 64-slot sets (see :func:`hps_core.cache.layout.num_sets_for`).
        dim: embedding width (floats per row).
        xp: array module holding the cache (``numpy`` or ``cupy``).
        name: label used in error messages, e.g. ``"dcn.table0"``.
        slots: the state's arrays when the caller allocated them (shared memory); by default
            new empty ones on the current device.
        precision: how the rows are stored (:class:`~hps_core.quant.RowFormat`): ``replace``
            and ``update`` take stored rows, ``query`` answers them decoded to float32.

    Raises:
        ValueError: ``num_sets`` or ``dim`` is not a positive integer.
    """

    def __init__(
        self,
        num_sets: int,
        dim: int,
        xp: Any,
        name: str,
        slots: CacheSlots | None = None,
        precision: StoragePrecision = StoragePrecision.FP32,
    ) -> None:
        for label, value in (("num_sets", num_sets), ("dim", dim)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(
                    f"cache {name!r}: {label} must be a positive integer, got {value!r}"
                )
        self.name = name
        self.xp = xp
        self._where = f"cache {name!r}"
        self._num_sets = int(num_sets)
        self._dim = int(dim)
        self.row_format = RowFormat(precision, self._dim)
        self._lock = threading.Lock()
        with self._device():
            if slots is None:
                slots = new_slots(self._num_sets, self.row_format, xp)
            self._keys, self._stamps, self._values = slots.keys, slots.stamps, slots.values
            self._clock = slots.clock
            # Counters stay private to the process even when the slots are shared: each
            # instance reports what its own lookups did.
            self._counters = xp.zeros(NUM_COUNTERS, dtype=xp.int64)

    @property
    def dim(self) -> int:
        """Embedding width."""
        return self._dim

    @property
    def num_sets(self) -> int:
        """Number of 64-slot sets."""
        return self._num_sets

    @property
    def capacity(self) -> int:
        """Number of rows the cache can hold."""
        return self._num_sets * WAYS

    @property
    def size(self) -> int:
        """Number of rows stored now."""
        with self._section():
            return int(self.xp.count_nonzero(self._keys != EMPTY_KEY))

    def query(self, keys: Any, out: Any = None) -> tuple[Any, Any]:
        """Look keys up; hits refresh their LRU stamps.

        Args:
            keys: 1-D integer keys (duplicates allowed).
            out: optional float32 ``[n, dim]`` array of the cache's module; miss rows are not
                written.

        Returns:
            ``(values, hit_mask)``: ``out`` (or a new zero-filled array) and bool ``[n]``.

        Example:
            >>> from hps_core.cache import make_cache
            >>> cache = make_cache("dynamic", 64, 2, np)
            >>> cache.replace(np.array([7]), np.ones((1, 2), np.float32))
            >>> cache.query(np.array([7, 8]))[1]
            array([ True, False])
        """
        xp = self.xp
        with self._section():
            keys = as_keys(keys, xp, self._where)
            n = int(keys.shape[0])
            out = output_rows(out, n, self._dim, xp, self._where)
            if n == 0:
                return out, xp.zeros(0, dtype=bool)
            hit = self._query(keys, out, self._clock[0])
            self._clock[0] += n
            return out, hit

    def replace(self, keys: Any, values: Any) -> None:
        """Insert keys that are not stored (evicting LRU rows of full sets); refresh the rest.

        Args:
            keys: 1-D integer keys (duplicates allowed: the first occurrence is inserted).
            values: stored rows (:func:`~hps_core.cache.arrays.as_stored`), row ``i`` for
                ``keys[i]``: float ``[n, dim]`` vectors for an fp32 cache.
        """
        xp = self.xp
        # The plan is made before entering the section: a shared cache holds its lock only
        # while kernels are launched.
        with self._device():
            # Plan the batch where its keys are: keys on the host (a lookup's misses) are
            # sorted by NumPy, which for small batches beats a round of GPU sorts and syncs.
            plan_xp = np if isinstance(keys, np.ndarray) else xp
            keys = as_keys(keys, plan_xp, self._where)
            n = int(keys.shape[0])
            rows = as_stored(values, n, self.row_format, xp, self._where)
            if n == 0:
                return
            positions = plan_xp.flatnonzero(keys != EMPTY_KEY)
            plan = None
            if positions.shape[0]:
                sets = set_of(keys, self._num_sets, plan_xp)
                plan = plan_runs(sets, positions, plan_xp)
                if plan_xp is not xp:
                    keys, sets = xp.asarray(keys), xp.asarray(sets)
                    plan = RunPlan(order=xp.asarray(plan.order), bounds=xp.asarray(plan.bounds))
        with self._section():
            if plan is not None:
                self._replace(keys, rows, sets, plan, self._clock[0])
            self._clock[0] += n

    def update(self, keys: Any, values: Any) -> None:
        """Overwrite the vectors of keys that are stored; ignore the others.

        Args:
            keys: 1-D integer keys (duplicates allowed: the last occurrence wins).
            values: stored rows, as for :meth:`replace`.
        """
        xp = self.xp
        with self._section():
            keys = as_keys(keys, xp, self._where)
            n = int(keys.shape[0])
            rows = as_stored(values, n, self.row_format, xp, self._where)
            positions = xp.flatnonzero(keys != EMPTY_KEY)
            if positions.shape[0]:
                self._update(keys, rows, set_of(keys, self._num_sets, xp), positions)

    def dump(self, set_start: int = 0, set_end: int | None = None) -> Any:
        """Keys stored in sets ``[set_start, set_end)``, set by set in slot order.

        Args:
            set_start: first set.
            set_end: one past the last set; ``None`` means ``num_sets``.

        Returns:
            int64 array of the cache's module.

        Raises:
            ValueError: the range is not within ``[0, num_sets]``.
        """
        end = self._num_sets if set_end is None else set_end
        if not 0 <= set_start <= end <= self._num_sets:
            raise ValueError(
                f"{self._where}: set range [{set_start}, {end}) is not within [0, {self._num_sets}]"
            )
        with self._section():
            stored = self._keys[set_start:end].reshape(-1)
            return stored[stored != EMPTY_KEY]

    def clear(self) -> None:
        """Empty every slot. Counters and the clock keep running."""
        with self._section():
            self._keys.fill(EMPTY_KEY)
            self._stamps.fill(0)

    def stats(self) -> CacheStats:
        """Counters since creation."""
        with self._lock, self._device():
            return stats_from_counters(self._counters)

    def export_state(self) -> CacheState:
        """Copy the whole state to host memory."""
        with self._section():
            return CacheState(
                keys=_to_host(self._keys),
                stamps=_to_host(self._stamps),
                values=_to_host(self._values),
                clock=int(self._clock[0]),
            )

    @property
    def created_here(self) -> bool:
        """Whether this process created the cache (False when it joined a shared one)."""
        return True

    @property
    def shared(self) -> bool:
        """Whether other processes use the same slots."""
        return False

    def _section(self) -> contextlib.AbstractContextManager[Any]:
        """Where every operation on the state runs: this cache's lock, on its device."""
        return _Held(self._lock, self._device())

    def _device(self) -> contextlib.AbstractContextManager[Any]:
        """Context that makes the cache's device current (nothing to do for NumPy)."""
        return contextlib.nullcontext()

    @abstractmethod
    def _query(self, keys: Any, out: Any, clock: np.uint64) -> Any:
        """Write hit rows into ``out``, refresh hit stamps, count hits, misses and reserved
        keys, and return the bool hit mask."""

    @abstractmethod
    def _replace(self, keys: Any, rows: Any, sets: Any, plan: RunPlan, clock: np.uint64) -> None:
        """Apply ``replace`` to the batch positions of ``plan`` (none holds ``EMPTY_KEY``)."""

    @abstractmethod
    def _update(self, keys: Any, rows: Any, sets: Any, positions: Any) -> None:
        """Apply ``update`` to the batch ``positions`` (none holds ``EMPTY_KEY``)."""
