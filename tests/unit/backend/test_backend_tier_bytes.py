"""``hps_tier_bytes``: one gauge per table and tier an instance holds, set once at load with
the bytes of :mod:`hps_core.footprint`, under Triton's metric API (a recording stand-in here;
the served metrics are tested in tests/integration)."""

from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path
from typing import Any, ClassVar

import pytest

from hps_core.config import load_ps_config
from hps_core.demo import DEMO_MODELS
from hps_core.footprint import model_footprint
from hps_core.hps import HPS
from hps_core.triton_repo import ServingOptions
from triton_backend.model_settings import ModelSettings


class _Metric:
    def __init__(self, family: _Family, labels: dict[str, str]) -> None:
        self.family, self.labels, self.value = family, labels, None

    def set(self, value: float) -> None:
        self.value = value

    def increment(self, value: float) -> None:
        self.value = (self.value or 0) + value


class _Family:
    """Records every family made and every metric of it (Triton's pb_utils.MetricFamily)."""

    COUNTER, GAUGE = "counter", "gauge"
    made: ClassVar[list[_Family]] = []

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name, self.description, self.kind = name, description, kind
        self.metrics: list[_Metric] = []
        _Family.made.append(self)

    def Metric(self, labels: dict[str, str]) -> _Metric:  # Triton's name
        metric = _Metric(self, labels)
        self.metrics.append(metric)
        return metric


@pytest.fixture
def metrics(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``triton_backend.metrics`` and ``lookup_service`` imported beside the recording
    stand-in (both forgotten after the test)."""
    _Family.made = []
    monkeypatch.setitem(
        sys.modules, "triton_python_backend_utils", types.SimpleNamespace(MetricFamily=_Family)
    )
    for name in ("triton_backend.metrics", "triton_backend.lookup_service"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module("triton_backend.metrics")


def gauges() -> dict[tuple[str, ...], float]:
    """Every ``hps_tier_bytes`` value by (model, table, tier, precision, device)."""
    found = {}
    for family in _Family.made:
        if family.name == "hps_tier_bytes":
            assert family.kind == "gauge"
            for m in family.metrics:
                assert set(m.labels) == {"model", "table", "tier", "precision", "device"}
                key = tuple(m.labels[k] for k in ("model", "table", "tier", "precision", "device"))
                assert key not in found
                found[key] = m.value
    return found


@pytest.fixture
def wdl(tmp_path: Path) -> Path:
    folder = DEMO_MODELS["wdl"](tmp_path, ServingOptions())
    yield folder / "ps.json"
    HPS.close_all()


def test_a_cpu_instance_publishes_its_host_tiers_at_load(
    metrics: Any, wdl: Path, shm_path: Path
) -> None:
    settings = ModelSettings(
        triton_model="wdl_cpu", hps_model="wdl", ps_json=wdl, instance_kind="CPU",
        device_id=0, config={}, instance_name="wdl_cpu_0", miss_policy="default",
    )  # fmt: skip
    service = importlib.import_module("triton_backend.lookup_service").LookupService(settings)
    assert service.tier_bytes is None
    config = load_ps_config(wdl)
    footprint = model_footprint(config, config.models[0])
    service.publish_tier_bytes(footprint)
    assert footprint.host > 0
    assert gauges() == {
        ("wdl_cpu", t.name, "host", "fp32", "host"): t.host for t in footprint.tables
    }
    assert not list(shm_path.glob("*.data"))  # from the files' sizes: no table opened
    service.start()  # the first execute opens the tables: the segments are what was published
    segments = sorted(path.stat().st_size for path in shm_path.glob("*.data"))
    assert segments == sorted(t.host for t in footprint.tables)
    service.close()


def test_a_gpu_instance_adds_its_cache_and_row_index(metrics: Any, wdl: Path) -> None:
    config = load_ps_config(wdl)
    footprint = model_footprint(config, config.models[0])
    metrics.TierBytesMetrics("wdl", "gpu1", footprint, gpu_index=True)
    expected = {}
    for t in footprint.tables:
        assert t.gpu_cache and t.gpu_index and not t.gpu_static
        expected[("wdl", t.name, "host", "fp32", "host")] = t.host
        expected[("wdl", t.name, "gpu_cache", "fp32", "gpu1")] = t.gpu_cache
        expected[("wdl", t.name, "gpu_index", "fp32", "gpu1")] = t.gpu_index
    assert gauges() == expected


def test_without_the_gpu_pipeline_no_row_index_is_published(metrics: Any, wdl: Path) -> None:
    config = load_ps_config(wdl)
    footprint = model_footprint(config, config.models[0])
    published = metrics.TierBytesMetrics("wdl", "gpu0", footprint)
    tiers = {labels["tier"] for labels, _ in published.values}
    assert tiers == {"host", "gpu_cache"}
    assert sum(n for _, n in published.values) == footprint.host + sum(
        t.gpu_cache for t in footprint.tables
    )


def test_each_table_is_labelled_with_its_storage_precision(metrics: Any, wdl: Path) -> None:
    """The deep table stored in int8 and the wide one in fp32 (storage_precision_per_table):
    each gauge carries its table's precision and its bytes in that precision."""
    before = load_ps_config(wdl)
    fp32 = model_footprint(before, before.models[0])
    doc = json.loads(wdl.read_text())
    doc["models"][0]["storage_precision_per_table"] = ["fp32", "int8"]
    wdl.write_text(json.dumps(doc))
    config = load_ps_config(wdl)
    footprint = model_footprint(config, config.models[0])
    metrics.TierBytesMetrics("wdl", "gpu0", footprint)
    wide, deep = footprint.tables
    assert (wide.precision, deep.precision) == ("fp32", "int8")
    assert deep.host < fp32.tables[1].host and deep.gpu_cache < fp32.tables[1].gpu_cache
    assert gauges() == {
        ("wdl", "wide_embedding", "host", "fp32", "host"): wide.host,
        ("wdl", "wide_embedding", "gpu_cache", "fp32", "gpu0"): wide.gpu_cache,
        ("wdl", "deep_embedding", "host", "int8", "host"): deep.host,
        ("wdl", "deep_embedding", "gpu_cache", "int8", "gpu0"): deep.gpu_cache,
    }
