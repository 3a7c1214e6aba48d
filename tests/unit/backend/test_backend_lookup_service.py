"""One owner per object: a model instance's lookup is made once by its LookupService, with
its options fixed, the ranking session scores through that same object, and closing the
service closes that lookup alone."""

from __future__ import annotations

import dataclasses
import importlib
import sys
import types
from typing import ClassVar

import numpy as np
import pytest

from hps_core.hps import HPS
from hps_core.infer import RankingSession
from hps_core.lookup import LookupOptions
from triton_backend.model_settings import ModelSettings


class _Metrics:
    """Stands for Triton's metric families and metrics, which exist only inside a stub (the
    served metrics are tested in tests/integration)."""

    COUNTER = GAUGE = 0

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __getattr__(self, name: str) -> object:
        return lambda *args, **kwargs: self


@pytest.fixture
def service_type(monkeypatch: pytest.MonkeyPatch) -> type:
    """``LookupService``, imported beside the stand-in for Triton's metrics (both forgotten
    after the test)."""
    stand_in = types.SimpleNamespace(MetricFamily=_Metrics)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", stand_in)
    for name in ("triton_backend.metrics", "triton_backend.lookup_service"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module("triton_backend.lookup_service").LookupService


def test_the_session_scores_through_the_services_lookup(
    settings: ModelSettings, service_type: type
) -> None:
    service = service_type(settings)
    assert service.lookup.options == LookupOptions(share_caches=True)
    session = RankingSession.for_lookup(service.lookup)
    assert session.lookup is service.lookup
    assert service.start() is service.lookup  # opens the tables once
    assert service.start() is service.lookup
    # The process's HPS hands out the same object for the same options, another for others.
    hps = HPS(settings.ps_json)
    assert hps.model("wdl", None, service.lookup.options) is service.lookup
    assert hps.model("wdl") is not service.lookup
    service.close()  # also stops the thread that publishes its metrics


def test_options_are_fixed_when_the_lookup_is_made(
    settings: ModelSettings, service_type: type
) -> None:
    lookup = service_type(settings).lookup
    with pytest.raises(dataclasses.FrozenInstanceError):
        lookup.options.share_caches = False  # type: ignore[misc]


def test_closing_a_service_closes_its_lookup_alone(
    settings: ModelSettings, service_type: type
) -> None:
    service = service_type(settings)
    service.start()
    hps = HPS(settings.ps_json)
    other = hps.model("wdl")  # another instance's lookup in the same process
    keys = np.arange(5, dtype=np.int64)
    before = other.lookup(0, keys)
    service.close()
    np.testing.assert_array_equal(other.lookup(0, keys), before)  # still open
    assert hps.model("wdl", None, service.lookup.options) is not service.lookup  # forgotten


class _Recorded:
    """A stand-in metric family whose metrics record their increments by labels."""

    COUNTER = GAUGE = 0
    seen: ClassVar[dict[tuple, float]] = {}

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def Metric(self, labels: dict[str, str]) -> object:  # Triton's name
        key = tuple(sorted(labels.items()))
        _Recorded.seen.setdefault(key, 0)

        def increment(value: float) -> None:
            _Recorded.seen[key] += value

        return types.SimpleNamespace(increment=increment, set=lambda value: None)


def test_failed_requests_are_published_before_the_tables_open(
    settings: ModelSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model whose tables never open (every request refused, or its start failing) still
    publishes hps_requests_failed_total: at once, while no publisher runs."""
    monkeypatch.setitem(
        sys.modules, "triton_python_backend_utils", types.SimpleNamespace(MetricFamily=_Recorded)
    )
    for name in ("triton_backend.metrics", "triton_backend.lookup_service"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    service = importlib.import_module("triton_backend.lookup_service").LookupService(settings)
    _Recorded.seen.clear()
    try:
        service.count_failed("invalid_argument")
        service.count_failed("invalid_argument")
        service.count_failed("internal")
        service.count_failed("unavailable")
    finally:
        service.close()
    got = {dict(k)["reason"]: v for k, v in _Recorded.seen.items()}
    assert got == {"invalid_argument": 2, "unavailable": 1, "internal": 1}
