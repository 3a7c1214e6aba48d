"""What every HPS-backed Triton model instance does besides its own contract.

- ``initialize``-time checks are the models' job; the HPS itself starts on the first
  ``execute`` (implicit initialisation): :meth:`LookupService.session` opens the model's
  tables, fills the GPU caches when HugeCTR would (``gpucache`` and
  ``cache_refresh_percentage_per_iteration > 0``), and starts the cache refresher when
  ``refresh_interval > 0``. Instances on one GPU share its dynamic caches (parameter
  ``share_gpu_cache``, on by default); then only the instance that created them fills and
  refreshes them.
- After an ``execute`` the table counters go to Triton's metrics endpoint (at most twice a
  second).
- ``finalize`` stops background work and detaches from the shared host tier.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from hps_core.hps import HPS
from hps_core.lookup import ModelLookup
from hps_core.lookup.refresher import CacheRefresher
from triton_backend.metrics import LookupMetrics
from triton_backend.model_settings import ModelSettings

logger = logging.getLogger("hps_core")

METRICS_PERIOD_S = 0.5


def log_to_stderr() -> None:
    """Send ``hps_core`` INFO logs to stderr, which the stub forwards to Triton's log."""
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("hps %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def load_hot_keys(folder: Path | None, table_names: list[str]) -> dict[int, np.ndarray]:
    """Hot keys per table id from ``<folder>/<table name>.npy`` files that exist.

    Args:
        folder: the ``hot_keys`` folder, or ``None``.
        table_names: the model's table names, in table order.

    Returns:
        int64 key arrays (hottest first) by table id.
    """
    if folder is None:
        return {}
    found = {}
    for t, name in enumerate(table_names):
        path = folder / f"{name}.npy"
        if path.is_file():
            found[t] = np.load(path).astype(np.int64, copy=False)
    return found


class LookupService:
    """The HPS session of one model instance, started on first use.

    Args:
        settings: the instance's settings.
    """

    def __init__(self, settings: ModelSettings) -> None:
        self.settings = settings
        self._session: ModelLookup | None = None
        self._refresher: CacheRefresher | None = None
        self._metrics: LookupMetrics | None = None
        self._next_report = 0.0
        self._lock = threading.Lock()

    @property
    def xp(self) -> Any:
        """Array module of the lookups (CuPy on GPU instances)."""
        return self.session().xp

    def session(self) -> ModelLookup:
        """The lookup session; the first call loads the tables and warms the caches."""
        if self._session is None:
            with self._lock:
                if self._session is None:
                    self._session = self._start()
        return self._session

    def _start(self) -> ModelLookup:
        s = self.settings
        session = HPS(s.ps_json).model(s.hps_model, s.lookup_device)
        session.miss_policy = s.miss_policy
        session.share_caches = s.share_gpu_cache
        session.open_all()
        model = session.model
        if session.uses_cache and model.cache_refresh_percentage_per_iteration > 0:
            names = [t.name for t in model.tables]
            session.initialize_caches(load_hot_keys(s.hot_keys, names))
            if model.refresh_interval > 0 and session.lead:
                self._refresher = CacheRefresher(
                    session,
                    model.refresh_delay,
                    model.refresh_interval,
                    model.cache_refresh_percentage_per_iteration,
                ).start()
        device = "cpu" if s.lookup_device is None else f"gpu{s.lookup_device}"
        self._metrics = LookupMetrics(
            s.triton_model, s.instance_name, device, [t.name for t in model.tables]
        )
        return session

    def report(self) -> None:
        """Publish the counters' change since the last publication, at most twice a second.

        Each metric update is a message from the stub to the server process; doing it for
        every table after every ``execute`` would cost more than small lookups themselves.
        """
        now = time.monotonic()
        if self._metrics is None or self._session is None or now < self._next_report:
            return
        self._next_report = now + METRICS_PERIOD_S
        self._metrics.report(self._session.counters())

    def close(self) -> None:
        """Stop the refresher and detach from every table."""
        if self._refresher is not None:
            self._refresher.stop()
        HPS.close_all()
