"""Prometheus gauges of every GPU's latest reading: utilisation, memory, power, temperature and whether a
pod holds it, and a count of readings without a utilisation. The operations dashboard's GPU utilisation
and allocation come from these."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from weakref import WeakKeyDictionary

from prometheus_client import CollectorRegistry, Counter, Gauge

from tessera.telemetry.domain.model import Reading

_LABELS = ["node", "gpu", "model"]


class GpuMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        def gauge(name: str, text: str) -> Gauge:
            return Gauge(name, text, _LABELS, registry=registry)

        self.utilization = gauge("tessera_gpu_utilization_percent", "GPU utilisation at the latest reading")
        self.memory_used = gauge("tessera_gpu_memory_used_mib", "GPU memory in use at the latest reading")
        self.memory_total = gauge("tessera_gpu_memory_total_mib", "GPU memory on the board")
        self.power = gauge("tessera_gpu_power_watts", "Board power draw at the latest reading")
        self.temperature = gauge("tessera_gpu_temperature_celsius", "GPU temperature at the latest reading")
        self.held = gauge(
            "tessera_gpu_held",
            "1 when a pod or process holds the GPU, 0 when none does (absent when the source cannot tell)",
        )
        self.utilization_unknown = Counter(
            "tessera_gpu_utilization_unknown_readings",
            "Readings whose source had no utilisation (dcgm-exporter's NaN): the utilisation gauge is "
            "NaN, and idle detection and usage count them as neither used nor idle",
            _LABELS,
            registry=registry,
        )
        self._gauges = (
            self.utilization,
            self.memory_used,
            self.memory_total,
            self.power,
            self.temperature,
            self.held,
        )
        self._seen: dict[str, set[tuple[str, str, str]]] = {}

    def record(self, readings: Iterable[Reading]) -> None:
        """Set the gauges from one round; a node's GPUs that this round no longer reports are dropped."""
        by_node: dict[str, set[tuple[str, str, str]]] = {}
        for r in readings:
            labels = (r.node, r.gpu_uuid, r.model or "unknown")
            by_node.setdefault(r.node, set()).add(labels)
            if r.lost:
                continue
            if r.utilization_known:
                self.utilization.labels(*labels).set(r.utilization_pct)
            else:
                self.utilization.labels(*labels).set(math.nan)
                self.utilization_unknown.labels(*labels).inc()
            self.memory_used.labels(*labels).set(r.memory_used_mib)
            if r.memory_total_mib:
                self.memory_total.labels(*labels).set(r.memory_total_mib)
            self.power.labels(*labels).set(r.power_w)
            self.temperature.labels(*labels).set(r.temperature_c)
            if r.pods is not None:
                self.held.labels(*labels).set(1 if r.pods else 0)
        for node, now in by_node.items():
            for gone in self._seen.get(node, set()) - now:
                for g in (*self._gauges, self.utilization_unknown):
                    with contextlib.suppress(KeyError):  # never set: the source could not tell
                        g.remove(*gone)
            self._seen[node] = now


_BY_REGISTRY: WeakKeyDictionary[CollectorRegistry, GpuMetrics] = WeakKeyDictionary()


def gpu_metrics(registry: CollectorRegistry) -> GpuMetrics:
    found = _BY_REGISTRY.get(registry)
    if found is None:
        found = _BY_REGISTRY[registry] = GpuMetrics(registry)
    return found
