"""Counters are published by a thread of each started instance, off the requests' path: they
reach the metrics endpoint within a period whether or not more requests come, a failed
publication does not stop the next ones, and closing the instance stops the thread. Triton's
metric API is a recording stand-in here (the served metrics are tested in tests/integration)."""

from __future__ import annotations

import importlib
import logging
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from hps_core.lookup import TableCounters
from triton_backend.model_settings import ModelSettings


class _Metric:
    def __init__(self, name: str, labels: dict[str, str], updates: list[tuple[str, str]]) -> None:
        self.name, self.labels, self.value, self._updates = name, labels, 0.0, updates

    def _sent(self) -> None:
        self._updates.append((self.name, threading.current_thread().name))

    def set(self, value: float) -> None:
        self._sent()
        self.value = value

    def increment(self, value: float) -> None:
        self._sent()
        self.value += value


class _Recorder:
    """Every metric made and every update sent, with the thread that sent it."""

    def __init__(self) -> None:
        self.metrics: list[_Metric] = []
        self.updates: list[tuple[str, str]] = []  # (metric name, thread name)

    def value(self, name: str, table: str) -> float:
        return sum(
            m.value for m in self.metrics if m.name == name and m.labels.get("table") == table
        )


@pytest.fixture
def families(monkeypatch: pytest.MonkeyPatch) -> _Recorder:
    """``triton_backend.metrics`` and ``lookup_service`` imported beside a recording stand-in
    for Triton's ``pb_utils.MetricFamily`` (both forgotten after the test)."""
    recorder = _Recorder()

    class MetricFamily:
        COUNTER, GAUGE = "counter", "gauge"

        def __init__(self, name: str, description: str, kind: str) -> None:
            self.name = name

        def Metric(self, labels: dict[str, str]) -> _Metric:  # Triton's name
            metric = _Metric(self.name, labels, recorder.updates)
            recorder.metrics.append(metric)
            return metric

    monkeypatch.setitem(
        sys.modules, "triton_python_backend_utils", types.SimpleNamespace(MetricFamily=MetricFamily)
    )
    for name in ("triton_backend.metrics", "triton_backend.lookup_service"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return recorder


def _wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.005)


def test_the_publisher_reports_every_period_until_stopped(families: _Recorder) -> None:
    metrics = importlib.import_module("triton_backend.metrics")
    calls: list[str] = []
    publisher = metrics.MetricsPublisher(
        lambda: calls.append(threading.current_thread().name), 0.01, "m 0"
    ).start()
    _wait_for(lambda: len(calls) >= 3)
    publisher.stop()
    stopped_at = len(calls)
    time.sleep(0.05)
    assert len(calls) == stopped_at  # no call after stop returned
    assert set(calls) == {"hps metrics m 0"}  # never the caller's thread


def test_a_failed_publication_is_logged_once_and_the_next_ones_run(
    families: _Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = importlib.import_module("triton_backend.metrics")
    calls = []

    def report() -> None:
        calls.append(1)
        if len(calls) <= 3:
            raise RuntimeError("server gone")

    with caplog.at_level(logging.DEBUG, logger="hps_core"):
        publisher = metrics.MetricsPublisher(report, 0.01, "dlrm dlrm_0").start()
        _wait_for(lambda: len(calls) >= 5)
        publisher.stop()
    lines = [r for r in caplog.records if "not published" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    assert "dlrm dlrm_0" in lines[0].getMessage() and "server gone" in lines[0].getMessage()


@pytest.fixture
def started(families: _Recorder, settings: ModelSettings, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A started LookupService of the W&D instance publishing every 10 ms, and the name of its
    first table."""
    module = importlib.import_module("triton_backend.lookup_service")
    monkeypatch.setattr(module, "METRICS_PERIOD_S", 0.01)
    service = module.LookupService(settings)
    yield service, service.start().model.tables[0].name
    service.close()


def test_a_started_service_publishes_lookups_without_a_later_request(
    families: _Recorder, started: Any
) -> None:
    service, table = started
    for _ in range(3):
        service.lookup.lookup(0, np.array([1, 2, 3], np.int64))
    # No execute follows: the service's own thread publishes what the lookups counted.
    _wait_for(lambda: families.value("hps_lookup_keys_total", table) == 9)
    assert families.value("hps_lookups_total", table) == 3
    assert {thread for _, thread in families.updates} == {"hps metrics wdl wdl_0"}
    (thread,) = [t for t in threading.enumerate() if t.name == "hps metrics wdl wdl_0"]
    service.close()
    assert not thread.is_alive()  # the thread stopped with the service


def test_an_idle_service_sends_no_updates(families: _Recorder, started: Any) -> None:
    service, table = started
    service.lookup.lookup(0, np.array([1, 2], np.int64))
    _wait_for(lambda: families.value("hps_lookup_keys_total", table) == 2)
    time.sleep(0.05)  # several periods
    settled = len(families.updates)
    time.sleep(0.1)  # nothing changed: no increment, no gauge set
    assert len(families.updates) == settled


def test_update_metrics_count_broker_outages_and_say_whether_the_brokers_answer(
    families: _Recorder,
) -> None:
    from hps_core.updates import UpdateStats

    metrics = importlib.import_module("triton_backend.metrics")
    update = metrics.UpdateMetrics("emb", "emb_0", "cpu")
    assert families.value("hps_update_source_reachable", None) == 1  # before any report

    update.report(UpdateStats(messages_applied=2, errors=40, outages=1, reachable=False))
    assert families.value("hps_update_source_outages_total", None) == 1
    assert families.value("hps_update_source_reachable", None) == 0
    assert families.value("hps_update_errors_total", None) == 40
    update.report(UpdateStats(messages_applied=3, errors=41, outages=1, reachable=True))
    assert families.value("hps_update_source_outages_total", None) == 1
    assert families.value("hps_update_source_reachable", None) == 1
    assert families.value("hps_update_messages_total", None) == 3


def test_a_cpu_instance_publishes_every_key_occurrence(families: _Recorder, started: Any) -> None:
    """Keys and unknown keys reach the endpoint per occurrence: a key asked three times in one
    lookup counts three times (the demo tables hold keys 0 .. rows - 1 alone)."""
    service, table = started
    keys = np.array([-7, -7, -7, -8, 0, 0], np.int64)
    service.lookup.lookup(0, keys)
    _wait_for(lambda: families.value("hps_lookup_keys_total", table) == len(keys))
    assert families.value("hps_unknown_keys_total", table) == sum(k < 0 for k in keys.tolist())
    assert families.value("hps_cache_hits_total", table) == 0  # no GPU cache on a CPU


def test_lookup_metrics_are_one_family_per_counter_and_the_hit_rate_per_occurrence(
    families: _Recorder,
) -> None:
    """Every counter of TableCounters is published under its metric, none other (no distinct
    key count, none of the retired per-table engine's insert counters), and the hit rate
    gauge is hits over hits and misses."""
    metrics = importlib.import_module("triton_backend.metrics")
    published = metrics.LookupMetrics("m", "m_0", "gpu0", ["t"])
    counters = TableCounters(lookups=2, keys=10, cache_hits=6, cache_misses=4, unknown_keys=3)
    published.report([counters])
    assert counters.hit_rate == 0.6
    for name, value in (
        ("hps_lookups_total", 2),
        ("hps_lookup_keys_total", 10),
        ("hps_cache_hits_total", 6),
        ("hps_cache_misses_total", 4),
        ("hps_unknown_keys_total", 3),
        ("hps_cache_hit_rate", 0.6),
    ):
        assert families.value(name, "t") == value, name
    names = {m.name for m in families.metrics}
    retired = {
        "hps_lookup_unique_keys_total",
        "hps_default_answers_for_known_keys_total",
        "hps_cache_sync_inserts_total",
        "hps_cache_async_inserts_total",
        "hps_cache_failed_inserts_total",
    }
    assert not names & retired
    lookup_fields = {"lookups", "keys", "cache_hits", "cache_misses", "unknown_keys",
                     "inserted_keys", "evictions", "host_rows"}  # fmt: skip
    assert set(metrics._COUNTERS) == lookup_fields
    for field in ("keys", "cache_hits", "cache_misses", "unknown_keys"):
        doc = metrics._COUNTERS[field][1]
        assert "occurrence" in doc and "nique" not in doc, field
