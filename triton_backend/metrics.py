"""Per-table lookup metrics on Triton's metrics endpoint (``pb_utils.MetricFamily``).

Counters mirror :class:`hps_core.lookup.TableCounters`; after each ``execute`` the model
adds what changed since the last report. Labels: ``model``, ``table``, ``device`` (``cpu`` or
``gpuN``) and ``instance``, so instances and GPUs can be told apart.

The tiers of the host side (:mod:`hps_core.tiers.cascade`) add a ``tier`` label:
``hps_tier_hits_total{tier="host"|"redis_cluster"|"rocks_db"|"default"}`` (keys each tier
answered; ``default``: keys no tier holds) and
``hps_tier_errors_total{tier="redis_cluster"|"rocks_db"}``. No label or value carries a
tier's address or credentials.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import triton_python_backend_utils as pb_utils

from hps_core.lookup import TableCounters

# counter field -> (metric name, help)
_COUNTERS = {
    "lookups": ("hps_lookups_total", "Lookup calls per table"),
    "keys": ("hps_lookup_keys_total", "Keys looked up, duplicates included"),
    "unique_keys": ("hps_lookup_unique_keys_total", "Distinct keys per lookup, summed"),
    "cache_hits": ("hps_cache_hits_total", "Unique keys answered by the GPU embedding cache"),
    "cache_misses": ("hps_cache_misses_total", "Unique keys the GPU embedding cache missed"),
    "unknown_keys": ("hps_unknown_keys_total", "Keys the table lacks (default vector answered)"),
    "default_answers": (
        "hps_default_answers_for_known_keys_total",
        "Keys the table holds that were answered with the default vector",
    ),
    "inserted_keys": ("hps_cache_inserted_keys_total", "Keys inserted into the GPU cache"),
    "sync_inserts": ("hps_cache_sync_inserts_total", "Batches whose misses were inserted inline"),
    "async_inserts": ("hps_cache_async_inserts_total", "Batches inserted in the background"),
    "failed_inserts": ("hps_cache_failed_inserts_total", "Background inserts that failed"),
    "evictions": ("hps_cache_evictions_total", "Rows the GPU cache evicted to make room"),
}
# counter field -> (metric name, tier label)
_TIER_COUNTERS = {
    "tier_host_hits": ("hps_tier_hits_total", "host"),
    "tier_redis_cluster_hits": ("hps_tier_hits_total", "redis_cluster"),
    "tier_rocks_db_hits": ("hps_tier_hits_total", "rocks_db"),
    "tier_default_keys": ("hps_tier_hits_total", "default"),
    "tier_redis_cluster_errors": ("hps_tier_errors_total", "redis_cluster"),
    "tier_rocks_db_errors": ("hps_tier_errors_total", "rocks_db"),
    "tier_elevated_keys": ("hps_tier_elevated_keys_total", "redis_cluster"),
    "tier_dropped_elevations": ("hps_tier_dropped_elevations_total", "redis_cluster"),
}
_TIER_HELP = {
    "hps_tier_hits_total": "Keys answered by each host-side tier (default: no tier holds them)",
    "hps_tier_errors_total": "Failed requests to a tier below the shared host tier",
    "hps_tier_elevated_keys_total": "Rows found in RocksDB written to Redis",
    "hps_tier_dropped_elevations_total": "Batches of such rows dropped (too many pending)",
}
_LATENCY = ("hps_lookup_duration_us_total", "Time spent in lookups, microseconds")
_HIT_RATE = ("hps_cache_hit_rate", "Cache hit rate of unique keys since start")


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
                    scale = 1e6 if f.name == "seconds" else 1
                    self._metrics[t][f.name].increment(delta * scale)
            self._hit_rate[t].set(now.hit_rate)
            self._last[t] = now
