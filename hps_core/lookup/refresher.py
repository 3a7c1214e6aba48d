"""Refresh cached rows from the host tier while serving (HugeCTR's ``refresh_*`` settings).

After ``refresh_delay`` seconds, every ``refresh_interval`` seconds, the refresher re-reads a
stride of ``cache_refresh_percentage_per_iteration`` of each dynamic cache's sets from the
host tier, so that a change of the host tier reaches the GPU caches within
``interval / percentage`` seconds.
"""

from __future__ import annotations

import logging
import math
import threading

from hps_core.lookup.model_lookup import ModelLookup
from hps_core.lookup.table_lookup import CachedTableLookup

logger = logging.getLogger("hps_core")


class CacheRefresher:
    """Background thread that walks each cache in strides and re-reads its rows.

    Args:
        lookup: the model's lookup (its caches are refreshed).
        delay_s: wait before the first pass.
        interval_s: wait between strides.
        fraction: share of a cache's sets refreshed per stride, in ``(0, 1]``.
    """

    def __init__(
        self, lookup: ModelLookup, delay_s: float, interval_s: float, fraction: float
    ) -> None:
        if not 0 < fraction <= 1:
            raise ValueError(f"refresh fraction must be in (0, 1], got {fraction}")
        self.lookup = lookup
        self.delay_s = delay_s
        self.interval_s = interval_s
        self.fraction = fraction
        self.rows_refreshed = 0
        self._stop = threading.Event()
        self._next_set = [0] * lookup.num_tables
        self._thread = threading.Thread(
            target=self._run, name=f"hps-refresh-{lookup.model.name}", daemon=True
        )

    def start(self) -> CacheRefresher:
        """Start the thread."""
        self._thread.start()
        return self

    def step(self) -> int:
        """Refresh the next stride of every cache (what each interval does).

        Returns:
            Rows refreshed.
        """
        refreshed = 0
        for table_id in range(self.lookup.num_tables):
            table = self.lookup.table(table_id)
            if not isinstance(table, CachedTableLookup) or not hasattr(table.cache, "num_sets"):
                continue
            num_sets = table.cache.num_sets
            stride = max(1, math.ceil(num_sets * self.fraction))
            start = self._next_set[table_id]
            end = min(num_sets, start + stride)
            if self.lookup.device_id is None:
                refreshed += table.refresh(start, end)
            else:
                with self.lookup.xp.cuda.Device(self.lookup.device_id):
                    refreshed += table.refresh(start, end)
            self._next_set[table_id] = 0 if end >= num_sets else end
        self.rows_refreshed += refreshed
        return refreshed

    def _run(self) -> None:
        if self._stop.wait(self.delay_s):
            return
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as exc:  # a refresh failure must not stop serving
                logger.error("cache refresh of model '%s' failed: %s", self.lookup.model.name, exc)
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> None:
        """Stop the thread and wait for it."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
