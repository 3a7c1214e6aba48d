"""``docs/grafana/hps-triton.json`` is a Grafana dashboard that imports as it is: panels with
Prometheus targets through a datasource variable, unique ids, a grid that fits, every variable
it uses defined, every metric it reads one the server publishes (hps_* from triton_backend,
Triton's own nv_*), and the questions of issue 48 covered. ``docs/grafana/prometheus.yml``
scrapes Triton's metrics port. (Whether every metric exists on a live server:
tests/integration/test_dashboard_metrics.py.)"""

from __future__ import annotations

import re

import pytest
import yaml
from grafana_dashboard import (
    DASHBOARD,
    PROMETHEUS_CONFIG,
    ROOT,
    all_panels,
    expressions,
    load_dashboard,
    metric_names,
    parse_exposition,
    selectors,
)

DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
BUILTIN_VARIABLES = {"__rate_interval", "__interval", "__range"}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return load_dashboard()


def test_it_is_a_dashboard_model(dashboard: dict) -> None:
    assert dashboard["title"] == "hps-triton" and dashboard["uid"] == "hps-triton"
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert "id" not in dashboard or dashboard["id"] is None  # an id would clash on import
    panels = list(all_panels(dashboard))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"repeated panel ids: {sorted(ids)}"
    assert sum(p["type"] != "row" for p in panels) >= 20
    for panel in panels:
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in ("h", "w", "x", "y")), panel["title"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["title"] and panel.get("description"), panel["id"]
        assert panel["datasource"] == DATASOURCE, panel["title"]
        targets = panel["targets"]
        assert targets, f"panel {panel['title']!r} has no targets"
        refs = [t["refId"] for t in targets]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in targets:
            assert target["expr"].strip() and target["datasource"] == DATASOURCE, panel["title"]


def test_panels_do_not_overlap(dashboard: dict) -> None:
    cells = {}
    for panel in all_panels(dashboard):
        g = panel["gridPos"]
        for y in range(g["y"], g["y"] + g["h"]):
            for x in range(g["x"], g["x"] + g["w"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[x, y]!r}"
                cells[x, y] = panel["title"]


def test_the_datasource_is_a_variable_and_every_variable_is_defined(dashboard: dict) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    source = variables["DS_PROMETHEUS"]
    assert source["type"] == "datasource" and source["query"] == "prometheus"
    for name in ("model", "table"):
        assert variables[name]["type"] == "query" and variables[name]["datasource"] == DATASOURCE
        assert variables[name]["multi"] and variables[name]["includeAll"]
    json_text = DASHBOARD.read_text()
    used = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", json_text))
    assert used - BUILTIN_VARIABLES <= set(variables), used - set(variables)
    assert '"uid": "${DS_PROMETHEUS}"' in json_text


def test_the_promql_reader() -> None:
    expr = (
        'sum by (model, table) (rate(hps_cache_hits_total{model=~"$model", table=~"$table"}'
        "[$__rate_interval])) / (sum(rate(nv_inference_queue_duration_us[5m])) or vector(0))"
    )
    assert sorted(selectors(expr)) == [
        ("hps_cache_hits_total", frozenset({"model", "table"})),
        ("nv_inference_queue_duration_us", frozenset()),
    ]
    assert metric_names('max by (model, instance) (up{job="a,b}"})') == {"up"}
    assert selectors('label_values(hps_lookups_total{model=~"$model"}, table)') == [
        ("hps_lookups_total", frozenset({"model", "table"}))
    ]
    families = parse_exposition(
        "# HELP x_seconds a\n# TYPE x_seconds histogram\n"
        'x_seconds_bucket{model="m",le="1"} 2\nx_seconds_sum{model="m"} 1\n'
        'x_seconds_count{model="m"} 2\nplain 3\n'
    )
    assert families["x_seconds"] == {"model"} and families["plain"] == set()


def test_every_metric_is_one_the_server_publishes(dashboard: dict) -> None:
    """hps_* names appear in the backend's code that publishes them; the rest are Triton's."""
    published = "\n".join(p.read_text() for p in (ROOT / "triton_backend").glob("*.py"))
    names = {name for _, expr in expressions(dashboard) for name in metric_names(expr)}
    for name in sorted(names):
        if name.startswith("hps_"):
            assert f'"{name}"' in published, f"{name} is not published by triton_backend"
        else:
            assert name.startswith("nv_"), f"{name} is neither hps-triton's nor Triton's"


def test_it_answers_the_questions_of_issue_48(dashboard: dict) -> None:
    """Hit rates per table, tier latency and hits, failed requests by reason, Kafka updates,
    memory per tier, request latency and throughput."""
    names = {name for _, expr in expressions(dashboard) for name in metric_names(expr)}
    for name in (
        "hps_cache_hits_total",
        "hps_cache_misses_total",
        "hps_lookup_duration_us_total",
        "hps_tier_hits_total",
        "hps_tier_duration_us_total",
        "hps_tier_lookups_total",
        "hps_requests_failed_total",
        "hps_update_consumer_lag",
        "hps_update_keys_total",
        "hps_update_source_reachable",
        "hps_tier_bytes",
        "nv_inference_request_duration_us",
        "nv_inference_request_success",
    ):
        assert name in names, name
    failed = [e for _, e in expressions(dashboard) if "hps_requests_failed_total" in e]
    assert any("reason" in e for e in failed)


def test_the_prometheus_config_scrapes_tritons_metrics_port() -> None:
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    targets = [t for group in job["static_configs"] for t in group["targets"]]
    assert targets and all(t.endswith(":8002") for t in targets)
