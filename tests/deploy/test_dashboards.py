"""Every PromQL expression of every shipped Grafana dashboard names only metric families that some
Tessera service really serves: the families are collected by building each service's metrics on a
registry, so a metric renamed in code (or misspelt in a dashboard) fails here."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tessera.admission.entrypoints.metrics import AdmissionMetrics
from tessera.core.observability.metrics import Metrics
from tessera.scheduler.entrypoints.metrics import SchedulerMetrics
from tessera.telemetry.entrypoints.gpu_metrics import gpu_metrics
from tessera.telemetry.entrypoints.metrics import usage_metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "helm" / "tessera" / "dashboards").glob("*.json"))

SERIES_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
    "unknown": ("",),
}
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}
# Label lists and matchers, range selectors and strings hold no metric names.
NOT_NAMES = re.compile(
    r'"(?:[^"\\]|\\.)*"'
    r"|\{[^}]*\}"
    r"|\[[^\]]*\]"
    r"|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"
)
IDENTIFIER = re.compile(r"(?<![\w.])[a-zA-Z_:][a-zA-Z0-9_:]*(?=\s*(\()?)")


def served_series() -> set[str]:
    """Every series name the services' metrics objects export."""
    registry = CollectorRegistry()
    Metrics(registry)  # every service: messaging, outbox, NATS
    gpu_metrics(registry)  # telemetry: per-GPU readings
    usage_metrics(registry)  # telemetry: usage and cost
    SchedulerMetrics(registry)
    AdmissionMetrics(registry)
    return {family.name + suffix for family in registry.collect() for suffix in SERIES_SUFFIXES[family.type]}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions and aggregations left out)."""
    stripped = NOT_NAMES.sub(" ", re.sub(r"\$\{?\w+\}?", " ", expr))
    names = set()
    for match in IDENTIFIER.finditer(stripped):
        if match.group(1) is None and match.group(0).lower() not in KEYWORDS:
            names.add(match.group(0))
    return names


def expressions(dashboard: dict[str, Any]) -> Iterator[str]:
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield target["expr"]
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if variable.get("type") == "query" and isinstance(query, str):
            inner = re.fullmatch(r"label_values\((.*?)(?:,\s*\w+)?\)", query.strip())
            yield inner.group(1) if inner else query


def test_the_extractor_finds_names_and_skips_functions_labels_and_variables() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le) (rate(a_seconds_bucket{queue=~"$queue"}[$__rate_interval])))'
        " / on (node, gpu) b_total and c_rows > 0"
    )
    assert metric_names(expr) == {"a_seconds_bucket", "b_total", "c_rows"}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_every_dashboard_expression_names_only_served_metrics(path: Path) -> None:
    served = served_series()
    dashboard = json.loads(path.read_text())
    queried = {name for expr in expressions(dashboard) for name in metric_names(expr)}
    assert queried, "the dashboard queries no metric"
    assert sorted(queried - served) == []


def test_a_renamed_metric_is_caught() -> None:
    served = served_series()
    assert "tessera_scheduler_bind_latency_seconds_bucket" in served
    renamed = "histogram_quantile(0.99, sum by (le) (rate(tessera_scheduler_bind_seconds_bucket[5m])))"
    assert metric_names(renamed) - served == {"tessera_scheduler_bind_seconds_bucket"}


def test_the_operations_dashboard_shows_what_operators_watch() -> None:
    dashboard = json.loads((ROOT / "helm" / "tessera" / "dashboards" / "tessera-operations.json").read_text())
    queried = {name for expr in expressions(dashboard) for name in metric_names(expr)}
    assert {
        "tessera_gpu_held",
        "tessera_scheduler_gpus_allocated",
        "tessera_scheduler_fragmented_gpus",
        "tessera_admission_pending_jobs",
        "tessera_admission_latency_seconds_bucket",
        "tessera_scheduler_bind_latency_seconds_bucket",
        "tessera_gpu_utilization_percent",
        "tessera_outbox_backlog_rows",
        "tessera_consumer_lag_messages",
    } <= queried
    panel_ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(panel_ids) == len(set(panel_ids)), "panel ids are unique"
