"""Prometheus metrics of usage and cost, labelled by tenant, queue and flavor."""

from __future__ import annotations

from collections.abc import Mapping
from weakref import WeakKeyDictionary

from prometheus_client import CollectorRegistry, Counter, Gauge

from tessera.telemetry.domain.usage_rows import HOUR_S, AccountingStats

_LABELS = ["tenant", "queue", "flavor"]


class UsageMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.allocated = Counter(
            "tessera_gpu_allocated_hours", "GPU-hours held by pods", _LABELS, registry=registry
        )
        self.used = Counter(
            "tessera_gpu_used_hours", "GPU-hours used (utilisation x time)", _LABELS, registry=registry
        )
        self.idle = Counter(
            "tessera_gpu_idle_hours",
            "GPU-hours held while idle for longer than the idle window",
            _LABELS,
            registry=registry,
        )
        self.cost = Counter(
            "tessera_gpu_cost", "Cost of the GPU-hours held", [*_LABELS, "currency"], registry=registry
        )
        self.unknown = Gauge(
            "tessera_usage_unknown_pod_shares",
            "Attributed readings of pods that no placement names (billed to job 'unknown')",
            registry=registry,
        )
        self.late = Gauge(
            "tessera_usage_late_readings", "Readings of hours already closed", registry=registry
        )
        self.duplicates = Gauge(
            "tessera_usage_duplicate_readings", "Readings counted before (replays)", registry=registry
        )
        self.clamped = Gauge(
            "tessera_usage_clamped_readings", "Readings whose node clock was too far off", registry=registry
        )
        self.skew = Gauge(
            "tessera_usage_clock_skew_seconds",
            "The largest clock skew seen per node (reading minus telemetry's clock)",
            ["node"],
            registry=registry,
        )
        self.fallback = Gauge(
            "tessera_usage_podresources_fallback_nodes",
            "Nodes attributed without the kubelet's PodResources API",
            registry=registry,
        )
        self.unknown_processes = Counter(
            "tessera_usage_unknown_process_lookups",
            "Lookups of a GPU process whose pod could not be named from its cgroup (it stays pid/<n>); "
            "a process still unknown is counted again each sampling round",
            registry=registry,
        )
        self._unknown_seen = 0

    def record(
        self,
        sums: Mapping[tuple[str, str, str], list[float]],
        currency: str,
        stats: AccountingStats,
        fallback: int,
    ) -> None:
        for (tenant, queue, flavor), (allocated, used, idle, cost) in sums.items():
            self.allocated.labels(tenant, queue, flavor).inc(allocated / HOUR_S)
            self.used.labels(tenant, queue, flavor).inc(used / HOUR_S)
            if idle:
                self.idle.labels(tenant, queue, flavor).inc(idle / HOUR_S)
            if cost:
                self.cost.labels(tenant, queue, flavor, currency).inc(cost)
        self.unknown.set(stats.unknown_pod_shares)
        self.late.set(stats.late)
        self.duplicates.set(stats.duplicates)
        self.clamped.set(stats.clamped)
        for node, skew in stats.worst_skew_s.items():
            self.skew.labels(node).set(skew)
        self.fallback.set(fallback)

    def record_processes(self, unknown: int) -> None:
        """``unknown``: the resolver's running count; the counter gains what it gained since."""
        self.unknown_processes.inc(max(0, unknown - self._unknown_seen))
        self._unknown_seen = max(unknown, self._unknown_seen)


_BY_REGISTRY: WeakKeyDictionary[CollectorRegistry, UsageMetrics] = WeakKeyDictionary()


def usage_metrics(registry: CollectorRegistry) -> UsageMetrics:
    found = _BY_REGISTRY.get(registry)
    if found is None:
        found = _BY_REGISTRY[registry] = UsageMetrics(registry)
    return found
