"""The usage metrics telemetry serves, and the Grafana dashboard that reads them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from tessera.telemetry.domain.usage_rows import AccountingStats
from tessera.telemetry.entrypoints.metrics import usage_metrics

DASHBOARD = Path(__file__).parents[4] / "deploy" / "grafana" / "gpu-cost-and-waste.json"


def exposition() -> str:
    registry = CollectorRegistry()
    metrics = usage_metrics(registry)
    assert usage_metrics(registry) is metrics  # one set per registry
    stats = AccountingStats(unknown_pod_shares=3, worst_skew_s={"n0": 42.0})
    metrics.record({("team-a", "research", "a100"): [7200.0, 3600.0, 1800.0, 8.0]}, "USD", stats, 1)
    return generate_latest(registry).decode()


def test_gpu_hours_and_cost_are_counted_by_tenant_queue_and_flavor() -> None:
    text = exposition()
    labels = 'flavor="a100",queue="research",tenant="team-a"'
    assert f"tessera_gpu_allocated_hours_total{{{labels}}} 2.0" in text
    assert f"tessera_gpu_used_hours_total{{{labels}}} 1.0" in text
    assert f"tessera_gpu_idle_hours_total{{{labels}}} 0.5" in text
    assert 'tessera_gpu_cost_total{currency="USD",' + labels + "} 8.0" in text
    assert 'tessera_usage_clock_skew_seconds{node="n0"} 42.0' in text
    assert "tessera_usage_unknown_pod_shares 3.0" in text


def test_the_dashboard_reads_only_metrics_telemetry_serves() -> None:
    served = set(re.findall(r"^(tessera_[a-z_]+?)(?:\{| )", exposition(), re.MULTILINE))
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] == "GPU cost and waste"
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"tessera_[a-z_]+", target["expr"])
    }
    assert queried and queried <= served, queried - served
