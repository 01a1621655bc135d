"""The per-GPU gauges: set from each round's readings, and dropped for GPUs a node stops reporting; a
reading without a utilisation counted, its utilisation NaN rather than 0."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry

from tessera.telemetry.domain.model import Reading
from tessera.telemetry.entrypoints.gpu_metrics import gpu_metrics

NOW = datetime(2026, 11, 23, tzinfo=UTC)


def reading(gpu: str, util: float, pods: tuple[str, ...] | None, node: str = "n0") -> Reading:
    return Reading(
        node=node,
        gpu_index=0,
        gpu_uuid=gpu,
        at=NOW,
        utilization_pct=util,
        memory_used_mib=2048,
        power_w=250.5,
        temperature_c=61.0,
        model="A100-80GB",
        memory_total_mib=81920,
        pods=pods,
    )


def value(registry: CollectorRegistry, name: str, gpu: str, node: str = "n0") -> float | None:
    return registry.get_sample_value(name, {"node": node, "gpu": gpu, "model": "A100-80GB"})


def test_a_round_sets_each_gpus_gauges_and_whether_it_is_held() -> None:
    registry = CollectorRegistry()
    metrics = gpu_metrics(registry)
    assert gpu_metrics(registry) is metrics
    metrics.record(
        [reading("GPU-a", 71.0, ("default/p",)), reading("GPU-b", 0.0, ()), reading("GPU-c", 5, None)]
    )
    assert value(registry, "tessera_gpu_utilization_percent", "GPU-a") == 71.0
    assert value(registry, "tessera_gpu_memory_used_mib", "GPU-a") == 2048
    assert value(registry, "tessera_gpu_memory_total_mib", "GPU-b") == 81920
    assert value(registry, "tessera_gpu_power_watts", "GPU-b") == 250.5
    assert value(registry, "tessera_gpu_temperature_celsius", "GPU-a") == 61.0
    assert value(registry, "tessera_gpu_held", "GPU-a") == 1
    assert value(registry, "tessera_gpu_held", "GPU-b") == 0
    assert value(registry, "tessera_gpu_held", "GPU-c") is None  # the source cannot tell


def test_a_gpu_the_node_no_longer_reports_is_dropped_and_other_nodes_kept() -> None:
    registry = CollectorRegistry()
    metrics = gpu_metrics(registry)
    metrics.record([reading("GPU-a", 10, ()), reading("GPU-b", 20, ()), reading("GPU-x", 30, (), node="n1")])
    metrics.record([reading("GPU-a", 40, ("default/p",))])
    assert value(registry, "tessera_gpu_utilization_percent", "GPU-a") == 40
    assert value(registry, "tessera_gpu_utilization_percent", "GPU-b") is None
    assert value(registry, "tessera_gpu_held", "GPU-b") is None
    assert value(registry, "tessera_gpu_utilization_percent", "GPU-x", node="n1") == 30


def test_a_reading_without_a_utilisation_is_counted_and_its_gauge_is_nan_not_zero() -> None:
    registry = CollectorRegistry()
    metrics = gpu_metrics(registry)
    unknown = replace(reading("GPU-a", 0.0, ("default/p",)), utilization_known=False)
    metrics.record([unknown, reading("GPU-b", 0.0, ())])
    metrics.record([unknown, reading("GPU-b", 0.0, ())])
    assert math.isnan(value(registry, "tessera_gpu_utilization_percent", "GPU-a") or 0.0)
    assert value(registry, "tessera_gpu_utilization_unknown_readings_total", "GPU-a") == 2
    assert value(registry, "tessera_gpu_utilization_percent", "GPU-b") == 0.0
    assert value(registry, "tessera_gpu_utilization_unknown_readings_total", "GPU-b") is None
    assert value(registry, "tessera_gpu_memory_used_mib", "GPU-a") == 2048  # the rest is read
