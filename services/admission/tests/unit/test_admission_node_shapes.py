"""A pod no node shape can hold waits saying so, naming the largest shape (a larger node may still
join); before telemetry's inventory arrives the shape is unknown and nothing is said of it."""

from __future__ import annotations

from typing import Any

from tessera.admission.domain.model import JobState
from tessera.admission.domain.queueing import PodGroup, WaitReason, Workload
from tessera.admission.service_layer.cycle import run_cycle
from tessera.admission.service_layer.handlers import handle_inventory, submit_job
from tessera.admission.service_layer.shape_view import free_shape
from tessera.contracts.events import GpuInventory, InventoryChanged, NodeInventory
from tessera.testing.builders import a_job, an_envelope

SIXTEEN_GPUS = {
    "flavors": [{"name": "a100", "gpu_model": "A100-80GB"}],
    "queues": [{"name": "team-q", "quotas": [{"flavor": "a100", "resources": {"gpu": 16}}]}],
    "tenant_queues": [{"tenant": "team", "queue": "team-q"}],
}
SHAPE = "no node shape holds a pod of 'workers' (16 GPUs): the largest node, gpu-b, has 8 x A100-80GB"


def node(name: str, gpus: int) -> NodeInventory:
    devices = [
        GpuInventory(index=i, uuid=f"{name}-GPU-{i}", model="A100-80GB", memory_mib=81920)
        for i in range(gpus)
    ]
    return NodeInventory(name=name, cpu_milli=64000, memory_mib=512000, gpus=devices)


async def report_nodes(uow: Any, *nodes: NodeInventory) -> None:
    async with uow:
        await handle_inventory(an_envelope(InventoryChanged(source="cluster", nodes=list(nodes))), uow)
        await uow.commit()


async def submit(uow: Any, job_id: str, gpus: int) -> None:
    spec = a_job(job_id).tenant("team").group("workers", gpus=gpus).as_dict()
    async with uow:
        result = await submit_job(spec, uow, job_id)
        await uow.commit()
    assert result.state is JobState.QUEUED, result.errors


async def test_a_pod_larger_than_every_node_waits_naming_the_largest_shape(uow: Any) -> None:
    uow.configure(SIXTEEN_GPUS)
    await report_nodes(uow, node("gpu-a", 4), node("gpu-b", 8))
    await submit(uow, "huge", 16)
    async with uow:
        await run_cycle(uow)
    huge = uow.job("huge")
    assert huge.state is JobState.QUEUED
    assert huge.waiting == (WaitReason.NO_FEASIBLE_PLACEMENT.value, SHAPE)


async def test_a_pod_that_fits_a_node_shape_is_admitted(uow: Any) -> None:
    uow.configure(SIXTEEN_GPUS)
    await report_nodes(uow, node("gpu-a", 4), node("gpu-b", 8))
    await submit(uow, "fits", 8)
    async with uow:
        report = await run_cycle(uow)
    assert report.admitted == ["fits"]


def test_the_shape_is_unknown_without_an_inventory_and_said_only_of_what_cannot_fit() -> None:
    assert free_shape([], {}, {}) is None
    gpus = [{"uuid": f"g{i}", "model": "T4"} for i in range(2)]
    oracle = free_shape([("small", gpus)], {}, {})
    assert oracle is not None
    two = Workload("two", "q", (PodGroup("w", 1, {"gpu": 2}),))
    three = Workload("three", "q", (PodGroup("w", 1, {"gpu": 3}),))
    assert oracle.never_fits(two) is None
    assert (
        oracle.never_fits(three)
        == "no node shape holds a pod of 'w' (3 GPUs): the largest node, small, has 2 x T4"
    )
