"""Per-pod use as published for slicing: one batch per node per round, a pod's containers summed per
GPU, the split named, and use nobody holds (or bare processes) left out, as is a reading without a
utilisation."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from tessera.contracts.events import PodGpuShare, PodGpuUsage
from tessera.telemetry.domain.attributed import AttributedGpu
from tessera.telemetry.domain.attribution import GpuProcess, Holder, split_reading
from tessera.telemetry.domain.model import Reading
from tessera.telemetry.domain.pod_usage import node_batches

NOW = datetime(2026, 11, 23, 6, 0, tzinfo=UTC)


def reading(node: str, index: int, util: float, *, lost: bool = False) -> Reading:
    return Reading(
        node=node,
        gpu_index=index,
        gpu_uuid=f"{node}-GPU-{index}",
        at=NOW,
        utilization_pct=util,
        memory_used_mib=4096,
        power_w=100.0,
        temperature_c=50.0,
        model="A100-80GB",
        lost=lost,
    )


def test_each_node_gets_one_batch_with_each_pods_share_of_each_gpu() -> None:
    shared = reading("n1", 0, 60.0)
    holders = [
        Holder("ns", "a", "main", shared.gpu_uuid, 250),
        Holder("ns", "a", "side", shared.gpu_uuid, 250),
        Holder("ns", "b", "main", shared.gpu_uuid, 500),
    ]
    alone = reading("n0", 1, 20.0)
    gpus = [
        AttributedGpu(shared, split_reading(60.0, 4096, holders, None, "A100-80GB")),
        AttributedGpu(alone, split_reading(20.0, 4096, [Holder("ns", "c", "main", alone.gpu_uuid)])),
        # a GPU busy with nobody holding it: its use is nobody's to pack
        AttributedGpu(reading("n0", 2, 30.0), split_reading(30.0, 100, [])),
        AttributedGpu(reading("n0", 3, 0.0, lost=True), []),
    ]
    batches = node_batches(gpus)
    assert [b.node for b in batches] == ["n0", "n1"]
    [c] = batches[0].pods
    assert (c.pod, c.gpu_index, c.utilization_pct, c.allocated_milli) == ("c", 1, 20.0, 1000)
    a, b = batches[1].pods
    assert (a.pod, b.pod) == ("a", "b")
    assert round(a.utilization_pct, 6) == 30.0 and a.allocated_milli == 500  # two containers summed
    assert round(b.utilization_pct, 6) == 30.0 and b.split == "requested"


def test_a_memory_split_is_named_and_the_batch_is_a_valid_event() -> None:
    gpu = reading("n0", 0, 50.0)
    holders = [Holder("ns", "a", "main", gpu.gpu_uuid, 500), Holder("ns", "b", "main", gpu.gpu_uuid, 500)]
    processes = (GpuProcess(1, 3000, "ns/a"), GpuProcess(2, 1000, "ns/b"))
    [batch] = node_batches([AttributedGpu(gpu, split_reading(50.0, 4000, holders, processes, "A100-80GB"))])
    assert [(u.pod, u.split, round(u.utilization_pct, 6)) for u in batch.pods] == [
        ("a", "memory", 37.5),
        ("b", "memory", 12.5),
    ]
    event = PodGpuUsage(
        node=batch.node,
        at=NOW,
        interval_s=5.0,
        pods=[
            PodGpuShare(
                namespace=u.namespace,
                pod=u.pod,
                gpu_uuid=u.gpu_uuid,
                gpu_index=u.gpu_index,
                utilization_pct=u.utilization_pct,
                allocated_milli=u.allocated_milli,
                split="memory",
            )
            for u in batch.pods
        ],
    )
    assert event.subject() == "tessera.telemetry.pod_usage.n0"
    assert PodGpuUsage.model_validate(event.model_dump(mode="json")) == event


def test_a_reading_without_a_utilisation_is_left_out_not_published_as_no_use() -> None:
    known, unknown = reading("n0", 0, 40.0), replace(reading("n0", 1, 0.0), utilization_known=False)
    gpus = [
        AttributedGpu(r, split_reading(r.utilization_pct, 4096, [Holder("ns", "a", "main", r.gpu_uuid)]))
        for r in (known, unknown)
    ]
    [batch] = node_batches(gpus)
    assert [(u.pod, u.gpu_index, u.utilization_pct) for u in batch.pods] == [("a", 0, 40.0)]
