"""The scheduler's gauges, read from a cycle's view through the Prometheus exposition."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tessera.scheduler.domain.cache import SchedulerCache
from tessera.scheduler.domain.framework.builders import make_node
from tessera.scheduler.domain.placement import TypicalPod
from tessera.scheduler.domain.snapshot import Allocation
from tessera.scheduler.entrypoints.metrics import CycleView, SchedulerMetrics, fragmented_gpus

WHOLE_GPU = TypicalPod(cpu_milli=1, num_gpu=1, gpu_milli=1000, gpu_models=frozenset(), weight=1.0)


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def half_used_cluster() -> SchedulerCache:
    cache = SchedulerCache.rebuild([make_node("n0").gpus(8).build(), make_node("n1").gpus(8).build()])
    cache.assume(Allocation("half", "g1", "n0", ((0, 500),)))
    cache.assume(Allocation("two", "g2", "n1", ((0, 1000), (1, 1000))))
    return cache


def test_half_a_gpu_left_idle_is_fragmented_for_whole_gpu_pods() -> None:
    snapshot = half_used_cluster().snapshot()
    model = snapshot.node("n0").gpus[0].model
    assert fragmented_gpus(snapshot, (WHOLE_GPU,)) == {model: 0.5}
    half_gpu = TypicalPod(cpu_milli=1, num_gpu=1, gpu_milli=500, gpu_models=frozenset(), weight=1.0)
    assert fragmented_gpus(snapshot, (half_gpu,)) == {model: 0.0}, "half-GPU pods use the rest"
    assert fragmented_gpus(snapshot, ()) == {}, "no typical workload learnt yet: no figure"


def test_the_gauges_read_the_last_cycles_view() -> None:
    registry = CollectorRegistry()
    metrics = SchedulerMetrics(registry)
    before = samples(registry)
    assert not [key for key in before if key[0] == "tessera_scheduler_gpus_capacity"], "no cycle yet"
    snapshot = half_used_cluster().snapshot()
    model = snapshot.node("n0").gpus[0].model
    metrics.collector.view = CycleView(
        snapshot, (WHOLE_GPU,), active=2, backing_off=1, parked=0, pending_pods=7
    )
    metrics.bind_latency.observe(3.0)
    got = samples(registry)
    label = (("model", model),)
    assert got[("tessera_scheduler_gpus_capacity", label)] == 16
    assert got[("tessera_scheduler_gpus_allocated", label)] == 2.5
    assert got[("tessera_scheduler_gpus_unhealthy", label)] == 0
    assert got[("tessera_scheduler_fragmented_gpus", label)] == 0.5
    assert got[("tessera_scheduler_pending_gangs", (("state", "active"),))] == 2
    assert got[("tessera_scheduler_pending_gangs", (("state", "backing_off"),))] == 1
    assert got[("tessera_scheduler_pending_pods", ())] == 7
    assert got[("tessera_scheduler_bind_latency_seconds_count", ())] == 1
    assert got[("tessera_scheduler_bind_latency_seconds_bucket", (("le", "5.0"),))] == 1
    assert got[("tessera_scheduler_bind_latency_seconds_bucket", (("le", "2.5"),))] == 0
