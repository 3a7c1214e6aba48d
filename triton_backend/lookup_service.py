"""What every HPS-backed Triton model instance does besides its own contract.

- ``initialize``-time checks are the models' job. The service makes the instance's lookup
  once (:attr:`LookupService.lookup`, with the instance's cache sharing fixed in it) and the
  model builds on that object; the HPS itself starts on the first ``execute`` (HugeCTR's
  implicit initialisation): :meth:`LookupService.start` opens the model's tables,
  fills the GPU caches when HugeCTR would (``gpucache``,
  ``cache_refresh_percentage_per_iteration > 0`` and ``init_ec``, true by default), and
  starts the cache refresher when ``refresh_interval > 0``. Instances on one GPU share its
  dynamic caches (parameter ``share_gpu_cache``, on by default); then only the instance that
  created them fills and refreshes them.
- Once started, a thread of the instance publishes the table counters' change to Triton's
  metrics endpoint twice a second (:class:`~triton_backend.metrics.MetricsPublisher`), off the
  requests' path.
- With ``update_source.type: kafka_message_queue`` in the ps.json, each instance applies the
  online updates of its model's tables that the ``update_filters`` match (a model with none
  starts no Kafka consumer) once its tables are open (:mod:`hps_core.updates.apply`),
  in a consumer group of its own (:func:`~hps_core.updates.apply.instance_group_id`: host,
  ps.json path, instance name): each instance keeps its own overlay and caches, so each must
  receive every update, and a restarted instance rejoins the same group. It replays the
  retained updates at start, since its overlay starts empty. Optional config.pbtxt
  parameters: ``update_kafka_options`` (JSON object of librdkafka settings),
  ``update_replay`` (``false``: resume from the committed offsets only).
- ``finalize`` stops the update consumer and background work and detaches the instance's
  lookup from its tables (other models of the process keep theirs).
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from hps_core.footprint import ModelFootprint
from hps_core.hps import HPS
from hps_core.infer.model_io import KAFKA_OPTIONS_PARAMETER, REPLAY_PARAMETER
from hps_core.lookup import LookupOptions, ModelLookup
from hps_core.lookup.refresher import CacheRefresher
from hps_core.updates.apply import ModelUpdates, instance_group_id
from triton_backend.metrics import (
    FAILURE_REASONS,
    LookupMetrics,
    MetricsPublisher,
    RequestMetrics,
    TierBytesMetrics,
    UpdateMetrics,
)
from triton_backend.model_settings import ModelSettings
from triton_backend.served_files import ServedFiles

logger = logging.getLogger("hps_core")

METRICS_PERIOD_S = 0.5


def _parameter(config: Any, key: str) -> str | None:
    value = config.get("parameters", {}).get(key)
    if value is None:
        return None
    return str(value.get("string_value", "")).strip() or None


def update_settings(settings: ModelSettings) -> tuple[str, bool, dict[str, Any]]:
    """The consumer group, replay flag and librdkafka options of an instance's updates.

    Args:
        settings: the instance's settings.

    Returns:
        ``(group_id, replay, kafka_options)``.

    Raises:
        ValueError: ``update_kafka_options`` is not a JSON object.
    """
    group = instance_group_id(
        settings.instance_name or settings.triton_model,
        f"{settings.ps_json}|{settings.triton_model}",
    )
    replay = (_parameter(settings.config, REPLAY_PARAMETER) or "true").lower() not in (
        "false",
        "no",
        "0",
    )
    raw = _parameter(settings.config, KAFKA_OPTIONS_PARAMETER)
    options = json.loads(raw) if raw else {}
    if not isinstance(options, dict):
        raise ValueError(f"parameters.{KAFKA_OPTIONS_PARAMETER}: a JSON object is needed")
    return group, replay, options


def log_to_stderr() -> None:
    """Send ``hps_core`` INFO logs to stderr, which the stub forwards to Triton's log."""
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("hps %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        # Not again through a handler the root logger may have been given (a user's module
        # or a library it imports calling logging.basicConfig): one line per record.
        logger.propagate = False


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
    """The HPS lookup of one model instance, and what runs beside it once started.

    Args:
        settings: the instance's settings.
        files: the instance's files (:class:`~triton_backend.served_files.ServedFiles`),
            settled again before its tables open and compared with the last load's once they
            are; ``None``: not watched.
        served: the process's HPS hands this lookup to whoever asks for the model on this
            device without options (a user's PyTorch layers: :mod:`hps_core.hps_torch`).

    Example:
        >>> service = LookupService(settings, ServedFiles.settle(settings))  # doctest: +SKIP
        >>> session = RankingSession.for_lookup(service.lookup)  # doctest: +SKIP
        >>> service.start().lookup_tables(tables)  # first execute: tables open  # doctest: +SKIP
    """

    def __init__(
        self, settings: ModelSettings, files: ServedFiles | None = None, served: bool = False
    ) -> None:
        self.settings = settings
        self.files = files
        self._options = LookupOptions(share_caches=settings.share_gpu_cache)
        self.lookup: ModelLookup = HPS(settings.ps_json).open_model(
            settings.hps_model, settings.lookup_device, self._options, served=served
        )
        """The instance's lookup; its tables open in :meth:`start`."""
        self._started = False
        self._refresher: CacheRefresher | None = None
        self._metrics: LookupMetrics | None = None
        self._updates: ModelUpdates | None = None
        self._update_metrics: UpdateMetrics | None = None
        self.tier_bytes: TierBytesMetrics | None = None
        """The ``hps_tier_bytes`` gauges, once :meth:`publish_tier_bytes` set them."""
        self._publisher: MetricsPublisher | None = None
        self._lock = threading.Lock()
        self._failed = dict.fromkeys(FAILURE_REASONS, 0)
        self._request_metrics: RequestMetrics | None = None
        self._failed_lock = threading.Lock()  # not _lock: start() holds that while tables open

    @property
    def device(self) -> str:
        """The instance's device label: ``cpu`` or ``gpuN``."""
        device_id = self.settings.lookup_device
        return "cpu" if device_id is None else f"gpu{device_id}"

    def publish_tier_bytes(
        self, footprint: ModelFootprint, gpu_index: bool = False
    ) -> TierBytesMetrics:
        """Set the ``hps_tier_bytes`` gauges of the instance's tiers (at load, before the tables
        open: the bytes come from the ps.json and the sparse files' sizes).

        Args:
            footprint: the model's tier bytes (the load-time check computed them:
                :func:`hps_core.model_check.check_model_files`).
            gpu_index: whether the instance keeps the host tiers' row index on its GPU (the
                GPU ranking pipeline).

        Returns:
            :attr:`tier_bytes`.
        """
        self.tier_bytes = TierBytesMetrics(
            self.settings.triton_model, self.device, footprint, gpu_index=gpu_index
        )
        return self.tier_bytes

    def start(self) -> ModelLookup:
        """Open the tables, warm the caches and start the refresher and the update consumer,
        once (the first ``execute``: HugeCTR's implicit initialisation); later calls return
        at once.

        Returns:
            :attr:`lookup`.
        """
        if not self._started:
            with self._lock:
                if not self._started:
                    self._start()
                    self._started = True
        return self.lookup

    def start_at_load(self) -> None:
        """:meth:`start` now, in ``initialize``, when the model has a warm-up request (its
        tables are to open before it is READY anyway).

        Opened by the warm-up request instead, a table that cannot open (a database that does
        not answer) fails the warm-up, and Triton 2.51 then crashes now and then (3 of 10
        starts beside another loading model, on the CPU machine); a failed ``initialize``
        makes the model UNAVAILABLE, the others serving (0 of 10). Without a warm-up the
        tables open on the first request, as HugeCTR's implicit initialisation does.
        """
        if self.settings.config.get("model_warmup"):
            self.start()

    def _start(self) -> None:
        s, lookup = self.settings, self.lookup
        if self.files is not None:
            self.files.before_opening()
        lookup.open_all()
        if self.files is not None:
            self.files.opened(self.device)
        model = lookup.model
        if lookup.uses_cache and model.cache_refresh_percentage_per_iteration > 0:
            if model.init_ec:  # HugeCTR's switch for this initial fill
                names = [t.name for t in model.tables]
                lookup.initialize_caches(load_hot_keys(s.hot_keys, names))
            if model.refresh_interval > 0 and lookup.lead:
                self._refresher = CacheRefresher(
                    lookup,
                    model.refresh_delay,
                    model.refresh_interval,
                    model.cache_refresh_percentage_per_iteration,
                ).start()
        device = self.device
        self._metrics = LookupMetrics(
            s.triton_model, s.instance_name, device, [t.name for t in model.tables]
        )
        group, replay, options = update_settings(s)
        self._updates = ModelUpdates.start(lookup, group, replay=replay, kafka_options=options)
        if self._updates is not None:
            self._update_metrics = UpdateMetrics(s.triton_model, s.instance_name, device)
        self._publisher = MetricsPublisher(
            self._report, METRICS_PERIOD_S, f"{s.triton_model} {s.instance_name}"
        ).start()

    def count_failed(self, reason: str) -> None:
        """Count a request answered with an error (``invalid_argument`` or ``internal``),
        published with the other counters; at once while the tables are not open (no
        publisher runs yet, and may never: a model whose tables fail to open)."""
        with self._failed_lock:
            self._failed[reason] += 1
        if self._publisher is None:
            self._publish_failed()

    def _publish_failed(self) -> None:
        with self._failed_lock:
            if self._request_metrics is None:
                s = self.settings
                self._request_metrics = RequestMetrics(s.triton_model, s.instance_name, self.device)
            self._request_metrics.report(dict(self._failed))

    def _report(self) -> None:
        """Publish the counters' change since the last publication (the publisher's thread)."""
        self._publish_failed()
        if self._metrics is not None:
            self._metrics.report(self.lookup.counters())
        if self._update_metrics is not None and self._updates is not None:
            self._update_metrics.report(self._updates.stats)

    def close(self) -> None:
        """Stop the update consumer and the refresher, and detach the instance's lookup from
        its tables."""
        if self._publisher is not None:  # first: it reads the counters of what closes next
            self._publisher.stop()
            self._publisher = None
        if self._updates is not None:
            self._updates.stop()  # commits what was applied, before the tables close
            self._updates = None
        if self._refresher is not None:
            self._refresher.stop()
        s = self.settings
        HPS(s.ps_json).close_model(s.hps_model, s.lookup_device, self._options)
