"""Per-table lookup metrics on Triton's metrics endpoint (``pb_utils.MetricFamily``).

Counters mirror :class:`hps_core.lookup.TableCounters`; twice a second a thread of each
started instance (:class:`MetricsPublisher`) adds what changed since the last report. Keys
are counted per occurrence, on CPU and GPU instances alike (``hps_lookup_keys_total``,
``hps_cache_hits_total``, ``hps_cache_misses_total``, ``hps_unknown_keys_total``); the
gauge ``hps_cache_hit_rate`` is hits over hits and misses since the model loaded.
Labels: ``model``, ``table``, ``device`` (``cpu`` or ``gpuN``) and ``instance``, so instances
and GPUs can be told apart.

The tiers of the host side (:mod:`hps_core.tiers.cascade`) add a ``tier`` label:
``hps_tier_hits_total{tier="host"|"redis_cluster"|"rocks_db"|"default"}`` (keys each tier
answered, as the tiers are asked: each lookup's distinct keys once; ``default``: keys no tier
holds) and
``hps_tier_errors_total{tier="redis_cluster"|"rocks_db"}``; ``tier="overlay"`` counts keys
answered by the rows online updates added, and ``hps_tier_evictions_total{tier="overlay"}`` the
rows it evicted to stay within ``volatile_db.overflow_margin``. Each tier below the shared one
counts the lookups that reached it, ``hps_tier_lookups_total``, and their time,
``hps_tier_duration_us_total`` (their ratio: a tier's time per lookup). No label or value carries a
tier's address or credentials.

Memory: ``hps_tier_bytes`` (a gauge, labels ``model``, ``table``, ``tier``, ``precision``,
``device``) holds the bytes each tier of the instance holds, set once when the model loads
(:class:`TierBytesMetrics`, numbers from :mod:`hps_core.footprint`): ``tier="host"``
(``device="host"``: the shared-memory copy, one per machine whatever the number of instances),
and on a GPU instance ``tier="gpu_cache"`` (dynamic cache) or ``tier="gpu_static"`` (static
table) and, for ranking models, ``tier="gpu_index"`` (the GPU copy of the host tier's row
index), with ``device="gpuN"``: per instance (instances of one GPU that share their caches
hold one cache). ``precision`` is the storage precision, ``fp32`` for every table today.

Online updates (:mod:`hps_core.updates.apply`) are counted per instance by
:class:`UpdateMetrics`: ``hps_update_messages_total``, ``hps_update_keys_total``,
``hps_update_malformed_total``, ``hps_update_errors_total``,
``hps_update_source_outages_total`` (times every Kafka broker became unreachable from the
instance's process, said once in the log each time, :mod:`hps_core.updates.broker_watch`) and
the gauges ``hps_update_source_reachable`` (0 during such an outage, else 1) and
``hps_update_consumer_lag`` (messages published and not read yet) (labels ``model``,
``device``, ``instance``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any

import triton_python_backend_utils as pb_utils

from hps_core.footprint import ModelFootprint
from hps_core.lookup import TableCounters

logger = logging.getLogger("hps_core")

# counter field -> (metric name, help); keys are counted per occurrence on every path
_COUNTERS = {
    "lookups": ("hps_lookups_total", "Lookup calls per table"),
    "keys": ("hps_lookup_keys_total", "Keys looked up, per occurrence (duplicates included)"),
    "cache_hits": (
        "hps_cache_hits_total",
        "Keys answered from GPU memory (the embedding cache or a static table), per occurrence",
    ),
    "cache_misses": (
        "hps_cache_misses_total",
        "Keys the GPU did not hold (answered from the host or lower tiers or the default "
        "vector), per occurrence",
    ),
    "unknown_keys": (
        "hps_unknown_keys_total",
        "Keys no tier holds (the table's default vector answered), per occurrence",
    ),
    "inserted_keys": ("hps_cache_inserted_keys_total", "Keys inserted into the GPU cache"),
    "evictions": ("hps_cache_evictions_total", "Rows the GPU cache evicted to make room"),
    "host_rows": ("hps_host_rows_read_total", "Rows the GPU read from host memory over PCIe"),
}
# counter field -> (metric name, tier label)
_TIER_COUNTERS = {
    "tier_host_hits": ("hps_tier_hits_total", "host"),
    "tier_overlay_hits": ("hps_tier_hits_total", "overlay"),
    "tier_redis_cluster_hits": ("hps_tier_hits_total", "redis_cluster"),
    "tier_rocks_db_hits": ("hps_tier_hits_total", "rocks_db"),
    "tier_model_files_hits": ("hps_tier_hits_total", "model_files"),
    "tier_default_keys": ("hps_tier_hits_total", "default"),
    "tier_overlay_errors": ("hps_tier_errors_total", "overlay"),
    "tier_redis_cluster_errors": ("hps_tier_errors_total", "redis_cluster"),
    "tier_rocks_db_errors": ("hps_tier_errors_total", "rocks_db"),
    "tier_model_files_errors": ("hps_tier_errors_total", "model_files"),
    "tier_unanswered_keys": ("hps_tier_unanswered_keys_total", "all"),
    "tier_elevated_keys": ("hps_tier_elevated_keys_total", "redis_cluster"),
    "tier_refilled_keys": ("hps_tier_refilled_keys_total", "redis_cluster"),
    "tier_dropped_elevations": ("hps_tier_dropped_elevations_total", "redis_cluster"),
    "tier_overlay_evictions": ("hps_tier_evictions_total", "overlay"),
    **{
        f"tier_{kind}_{what}": (name, kind)
        for kind in ("overlay", "redis_cluster", "rocks_db", "model_files")
        for what, name in (
            ("lookups", "hps_tier_lookups_total"),
            ("seconds", "hps_tier_duration_us_total"),
        )
    },
}
_TIER_HELP = {
    "hps_tier_hits_total": (
        "Distinct keys per lookup answered by each host-side tier (default: no tier holds them)"
    ),
    "hps_tier_errors_total": "Failed requests to a tier below the shared host tier",
    "hps_tier_unanswered_keys_total": (
        "Keys a request needed that a tier that may hold them did not answer, and no tier "
        "below could (their requests failed UNAVAILABLE)"
    ),
    "hps_tier_elevated_keys_total": (
        "Rows found below the Redis cluster written to it (RocksDB's with "
        "cache_missed_embeddings; the model files' for rows the cluster lost)"
    ),
    "hps_tier_refilled_keys_total": "Rows offered to refill a Redis cluster that lost them",
    "hps_tier_dropped_elevations_total": "Batches of such rows dropped (too many pending)",
    "hps_tier_evictions_total": "Rows a tier evicted to stay within volatile_db.overflow_margin",
    "hps_tier_lookups_total": "Lookups that reached a tier below the shared host tier",
    "hps_tier_duration_us_total": (
        "Time the lookups of a tier below the shared host tier took (failed ones included), "
        "microseconds"
    ),
}
_LATENCY = ("hps_lookup_duration_us_total", "Time spent in lookups, microseconds")
_HIT_RATE = (
    "hps_cache_hit_rate",
    "GPU cache hits over hits and misses, per key occurrence, since start",
)


class LookupMetrics:
    """Publishes one model instance's table counters.

    Args:
        model: Triton model name.
        instance: instance name (``args["model_instance_name"]``).
        device: ``"cpu"`` or ``"gpuN"``.
        table_names: names of the model's tables.
    """

    def __init__(self, model: str, instance: str, device: str, table_names: list[str]) -> None:
        counter, gauge = pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE
        self._families = {
            field: pb_utils.MetricFamily(name=name, description=doc, kind=counter)
            for field, (name, doc) in _COUNTERS.items()
        }
        self._families["seconds"] = pb_utils.MetricFamily(
            name=_LATENCY[0], description=_LATENCY[1], kind=counter
        )
        self._hit_rate_family = pb_utils.MetricFamily(
            name=_HIT_RATE[0], description=_HIT_RATE[1], kind=gauge
        )
        # Kept as long as their metrics: Triton refuses updates once a family is deleted.
        self._tier_families = {
            name: pb_utils.MetricFamily(name=name, description=doc, kind=counter)
            for name, doc in _TIER_HELP.items()
        }
        self._metrics: list[dict[str, Any]] = []
        self._hit_rate: list[Any] = []
        for table in table_names:
            labels = {"model": model, "table": table, "device": device, "instance": instance}
            metrics = {f: fam.Metric(labels=labels) for f, fam in self._families.items()}
            for f, (name, tier) in _TIER_COUNTERS.items():
                metrics[f] = self._tier_families[name].Metric(labels={**labels, "tier": tier})
            self._metrics.append(metrics)
            self._hit_rate.append(self._hit_rate_family.Metric(labels=labels))
        self._last = [TableCounters() for _ in table_names]

    def report(self, counters: list[TableCounters]) -> None:
        """Add the change since the last report to each metric.

        Args:
            counters: current counters, one per table.
        """
        for t, now in enumerate(counters):
            before = self._last[t]
            for f in fields(TableCounters):
                delta = getattr(now, f.name) - getattr(before, f.name)
                if delta:
                    scale = 1e6 if f.name.endswith("seconds") else 1  # microseconds
                    self._metrics[t][f.name].increment(delta * scale)
            if now.hit_rate != before.hit_rate:
                self._hit_rate[t].set(now.hit_rate)
            self._last[t] = now


class MetricsPublisher:
    """Calls ``report`` every ``period_s`` seconds on a thread of its own until stopped.

    Each metric update is a round trip from the stub to the server process: publishing the
    counters of a model of 26 tables took 4.5-15 ms (CPU instances, 2 cores, Triton 2.51), which
    on the ``execute`` path made every request that paid it the slowest (16-sample requests of
    the default DLRM: p99 13.5-14.2 ms against a p50 of 4.2-4.3 ms; 7.0-9.0 ms p99 from this
    thread, docs/BENCHMARKS_HISTORY.md). On this thread requests never wait for it, and
    counters reach the endpoint within ``period_s`` with or without traffic.

    Args:
        report: publishes what changed since its last call; an exception is logged (its first
            occurrence as a warning) and the next period tries again.
        period_s: seconds between calls.
        name: says whose metrics, in the thread's name and in log lines.

    Example:
        >>> publisher = MetricsPublisher(report, 0.5, "dlrm instance 0").start()  # doctest: +SKIP
        >>> publisher.stop()  # doctest: +SKIP
    """

    def __init__(self, report: Callable[[], None], period_s: float, name: str) -> None:
        self._report = report
        self._period_s = period_s
        self._name = name
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"hps metrics {name}", daemon=True)
        self._failures = 0

    def start(self) -> MetricsPublisher:
        """Start the thread; returns ``self``."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and wait for a publication under way."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stopping.wait(self._period_s):
            try:
                self._report()
            except Exception as error:  # a failed publication must not stop the next ones
                self._failures += 1
                logger.log(
                    logging.WARNING if self._failures == 1 else logging.DEBUG,
                    "metrics of %s not published (%d times so far): %s",
                    self._name, self._failures, error,
                )  # fmt: skip


# UpdateStats field -> (metric name, help)
_UPDATE_COUNTERS = {
    "messages_applied": ("hps_update_messages_total", "Kafka update messages applied whole"),
    "keys_applied": ("hps_update_keys_total", "Rows of the update messages applied"),
    "malformed": ("hps_update_malformed_total", "Update messages skipped as not decodable"),
    "errors": (
        "hps_update_errors_total",
        "Broker errors, failed commits and failed applies of updates (each retried)",
    ),
    "outages": (
        "hps_update_source_outages_total",
        "Times every Kafka broker of the update source became unreachable from the process",
    ),
}
_REACHABLE = (
    "hps_update_source_reachable",
    "Whether the Kafka brokers of the update source are reachable (0 during an outage)",
)
_LAG = (
    "hps_update_consumer_lag",
    "Update messages published that the instance's consumer has not read yet, summed over "
    "its partitions (librdkafka's consumer_lag)",
)


def _increment(metrics: dict[str, Any], last: dict[str, int], now: Mapping[str, int]) -> None:
    """Add to each counter what its count gained since ``last`` (updated in place)."""
    for key, metric in metrics.items():
        count = now.get(key, 0)
        if count > last[key]:
            metric.increment(count - last[key])
        last[key] = count


class UpdateMetrics:
    """Publishes one model instance's online-update counters
    (:class:`~hps_core.updates.consumer.UpdateStats`).

    Args:
        model: Triton model name.
        instance: instance name.
        device: ``"cpu"`` or ``"gpuN"``.
    """

    def __init__(self, model: str, instance: str, device: str) -> None:
        labels = {"model": model, "device": device, "instance": instance}
        counter = pb_utils.MetricFamily.COUNTER
        # Families are kept as long as their metrics (see LookupMetrics).
        self._families = {
            field: pb_utils.MetricFamily(name=name, description=doc, kind=counter)
            for field, (name, doc) in _UPDATE_COUNTERS.items()
        }
        self._metrics = {f: fam.Metric(labels=labels) for f, fam in self._families.items()}
        self._last = {f: 0 for f in _UPDATE_COUNTERS}
        self._reachable_family = pb_utils.MetricFamily(
            name=_REACHABLE[0], description=_REACHABLE[1], kind=pb_utils.MetricFamily.GAUGE
        )
        self._reachable = self._reachable_family.Metric(labels=labels)
        self._reachable.set(1)
        self._was_reachable = True
        self._lag_family = pb_utils.MetricFamily(
            name=_LAG[0], description=_LAG[1], kind=pb_utils.MetricFamily.GAUGE
        )
        self._lag = self._lag_family.Metric(labels=labels)
        self._lag.set(0)
        self._last_lag = 0

    def report(self, stats: Any) -> None:
        """Add the change since the last report, and set the reachability gauge.

        Args:
            stats: the consumer's :class:`~hps_core.updates.consumer.UpdateStats`.
        """
        _increment(self._metrics, self._last, {f: int(getattr(stats, f)) for f in self._metrics})
        if stats.reachable != self._was_reachable:
            self._reachable.set(int(stats.reachable))
            self._was_reachable = stats.reachable
        if stats.lag >= 0 and stats.lag != self._last_lag:  # -1: not reported yet
            self._lag.set(stats.lag)
            self._last_lag = stats.lag


_FAILED = (
    "hps_requests_failed_total",
    "Requests the model answered with an error, by reason (invalid_argument: the request; "
    "unavailable: a tier that may hold its keys did not answer; internal: the server); "
    "Triton's nv_inference_request_failure does not count them",
)
FAILURE_REASONS = ("invalid_argument", "unavailable", "internal")


class RequestMetrics:
    """Publishes one model instance's failed requests (``hps_requests_failed_total``).

    Triton's Python backend counts every response a model returns as a success, errors
    included, so its ``nv_inference_request_failure`` misses the requests a model refuses
    (a malformed request) or fails (a tier that vanished); this counts them.

    Args:
        model: Triton model name.
        instance: instance name.
        device: ``"cpu"`` or ``"gpuN"``.
    """

    def __init__(self, model: str, instance: str, device: str) -> None:
        labels = {"model": model, "device": device, "instance": instance}
        # Kept as long as its metrics (see LookupMetrics).
        self._family = pb_utils.MetricFamily(
            name=_FAILED[0], description=_FAILED[1], kind=pb_utils.MetricFamily.COUNTER
        )
        self._metrics = {
            reason: self._family.Metric(labels={**labels, "reason": reason})
            for reason in FAILURE_REASONS
        }
        self._last = dict.fromkeys(FAILURE_REASONS, 0)

    def report(self, failed: dict[str, int]) -> None:
        """Add the change since the last report.

        Args:
            failed: requests failed so far, by reason.
        """
        _increment(self._metrics, self._last, failed)


_TIER_BYTES = (
    "hps_tier_bytes",
    "Bytes each tier holds per table (host: per machine; gpu_*: per GPU instance)",
)
_GPU_TIERS = ("gpu_cache", "gpu_static", "gpu_index")


class TierBytesMetrics:
    """Publishes the bytes each tier of one model instance holds, once (``hps_tier_bytes``).

    Args:
        model: Triton model name.
        device: ``"cpu"`` or ``"gpuN"``: a CPU instance holds the host tier alone.
        footprint: the model's :class:`~hps_core.footprint.ModelFootprint`.
        gpu_index: whether the instance keeps the host tiers' row index on its GPU (the GPU
            ranking pipeline does).

    Attributes:
        values: ``(labels, bytes)`` of every gauge set.
    """

    def __init__(
        self, model: str, device: str, footprint: ModelFootprint, gpu_index: bool = False
    ) -> None:
        # Kept as long as its metrics (see LookupMetrics).
        self._family = pb_utils.MetricFamily(
            name=_TIER_BYTES[0], description=_TIER_BYTES[1], kind=pb_utils.MetricFamily.GAUGE
        )
        self._metrics: list[Any] = []
        self.values: list[tuple[dict[str, str], int]] = []
        for table in footprint.tables:
            tiers = {"host": table.host}
            if device != "cpu":
                for tier in _GPU_TIERS:
                    if getattr(table, tier) and (gpu_index or tier != "gpu_index"):
                        tiers[tier] = getattr(table, tier)
            for tier, nbytes in tiers.items():
                labels = {
                    "model": model,
                    "table": table.name,
                    "tier": tier,
                    "precision": table.precision,
                    "device": "host" if tier == "host" else device,
                }
                metric = self._family.Metric(labels=labels)
                metric.set(nbytes)
                self._metrics.append(metric)
                self.values.append((labels, nbytes))
