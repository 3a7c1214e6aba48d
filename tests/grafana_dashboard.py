"""Reading ``docs/grafana/hps-triton.json`` and the metrics its PromQL asks for, and reading a
``/metrics`` page: shared by the dashboard's unit test and its test on a live tritonserver.

The PromQL reader is deliberately small: it knows the dashboard's own style (selectors with
label matchers, aggregations with ``by (...)``, range selectors, ``label_values`` in variable
queries), and names every metric selector with the labels its matchers use.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "docs" / "grafana" / "hps-triton.json"
PROMETHEUS_CONFIG = ROOT / "docs" / "grafana" / "prometheus.yml"

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
"""A histogram or summary family ``x`` is exposed as ``x_bucket``, ``x_sum`` and ``x_count``."""

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
             "and", "or", "unless", "inf", "nan"}  # fmt: skip
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_TOKEN = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)(\s*\{([^}]*)\})?(\s*\()?")
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$")


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    """The dashboard's JSON model."""
    return json.loads(path.read_text())


def all_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those nested in collapsed rows included."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """``(where, PromQL)`` of every panel target and every query variable."""
    found = [
        (f"panel {panel['id']} {panel['title']!r} target {target['refId']}", target["expr"])
        for panel in all_panels(dashboard)
        for target in panel.get("targets", [])
    ]
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable["query"]
            found.append((f"variable ${variable['name']}", query.get("query", query)))
    return found


def selectors(expr: str) -> list[tuple[str, frozenset[str]]]:
    """The metric selectors of ``expr``: each metric name with the label names its matchers use.

    ``label_values(selector, label)`` (a Grafana variable query) counts ``label`` as used.

    Example:
        >>> selectors('sum by (model) (rate(hps_lookups_total{model=~"$model"}[$__rate_interval]))')
        [('hps_lookups_total', frozenset({'model'}))]
    """
    label_query = _LABEL_VALUES.match(expr)
    if label_query:
        inner, label = label_query.groups()
        return [(name, labels | {label}) for name, labels in selectors(inner)]
    text = _STRING.sub('""', expr)
    text = _RANGE.sub("", text)
    text = _GROUPING.sub("", text)
    found = []
    for match in _TOKEN.finditer(text):
        name, _, matchers, call = match.groups()
        if call or name.lower() in _KEYWORDS:
            continue  # a function or aggregation, or a keyword
        found.append((name, frozenset(_MATCHER.findall(matchers or ""))))
    return found


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` reads."""
    return {name for name, _ in selectors(expr)}


def parse_exposition(text: str) -> dict[str, set[str]]:
    """The families of a Prometheus text exposition (``/metrics``), each with the label names
    its samples carry; a histogram's ``_bucket``/``_sum``/``_count`` samples count for it too."""
    families: dict[str, set[str]] = {}
    declared = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name = line.split()[2]
            declared.add(name)
            families.setdefault(name, set())
            continue
        if not line or line.startswith("#"):
            continue
        match = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s", line)
        if not match:
            continue
        name, _, labels = match.groups()
        names = set(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="', labels or ""))
        families.setdefault(name, set()).update(names)
        for suffix in HISTOGRAM_SUFFIXES:
            base = name.removesuffix(suffix)
            if name.endswith(suffix) and base in declared:
                families.setdefault(base, set()).update(names - {"le", "quantile"})
    return families


def family_of(name: str, families: dict[str, set[str]]) -> str | None:
    """The family ``name`` belongs to in ``families``: itself, or the histogram it is the
    ``_bucket``/``_sum``/``_count`` series of; ``None`` when neither is there."""
    if name in families:
        return name
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix) and name.removesuffix(suffix) in families:
            return name.removesuffix(suffix)
    return None
