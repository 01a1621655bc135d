"""Telemetry's "GPU unhealthy" mark stands over the node records. Before, the cache kept it in the
node's record itself: the next update of the node (a label, anything) replaced the record and the
GPU was healthy again, and in cluster mode a rebuild (from the API's nodes) lost it too."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tessera.cluster.builders import gpu_node
from tessera.cluster.fake import FakeCluster
from tessera.contracts.events import GpuInventory, NodeInventory
from tessera.scheduler.adapters.cluster_side import ClusterSide
from tessera.scheduler.config import SchedulerSettings
from tessera.scheduler.domain.framework.builders import make_gang
from tessera.scheduler.domain.framework.cluster_view import node_info
from tessera.scheduler.domain.gang.assembly import assemble
from tessera.scheduler.domain.gang.scheduler import OutcomeKind
from tessera.scheduler.domain.plugins.reserve import RecordingBinder
from tessera.scheduler.service_layer.engine import SchedulingEngine

FakeUnit = Any  # conftest's FakeSchedulerUnitOfWork


def test_a_mark_outlives_a_later_update_of_the_node() -> None:
    node = gpu_node("n1", "A100-80GB", 1)
    world = assemble([node_info(node)], RecordingBinder())
    world.scheduler.gpu_health_changed("n1", 0, False, now=0.0)

    world.scheduler.node_changed(node_info(dataclasses.replace(node, labels={"team": "a"})), now=1.0)

    assert not world.cache.node("n1").gpus[0].healthy
    world.scheduler.submit(make_gang("job", 1, gpus=1))
    assert [o.kind for o in world.scheduler.run(now=2.0)] == [OutcomeKind.UNSCHEDULABLE]
    world.scheduler.gpu_health_changed("n1", 0, True, now=3.0)  # recovered: the mark is lifted
    assert world.cache.node("n1").gpus[0].healthy and world.cache.health_marks("n1") == frozenset()


def test_a_mark_goes_with_its_node() -> None:
    node = gpu_node("n1", "A100-80GB", 2)
    world = assemble([node_info(node)], RecordingBinder())
    world.scheduler.gpu_health_changed("n1", 1, False, now=0.0)
    world.scheduler.node_lost("n1", now=1.0)
    world.scheduler.node_changed(node_info(node), now=2.0)
    assert all(gpu.healthy for gpu in world.cache.node("n1").gpus)


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[FakeCluster, ClusterSide]]:
    fake = FakeCluster()
    fake.add_node(gpu_node("gpu-0", "A100-80GB", 2))
    side = ClusterSide(fake)
    await side.start(timeout=5)
    yield fake, side
    await side.stop()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def healthy(engine: SchedulingEngine) -> list[bool]:
    assert engine.state is not None
    return [gpu.healthy for gpu in engine.state.assembly.cache.node("gpu-0").gpus]


async def report(uow: FakeUnit, *health: bool) -> None:
    """Telemetry's inventory of gpu-0, with the API node's GPU UUIDs."""
    gpus = [
        GpuInventory(index=gpu.index, uuid=gpu.uuid, model=gpu.model, memory_mib=gpu.memory_mib, healthy=ok)
        for gpu, ok in zip(gpu_node("gpu-0", "A100-80GB", 2).gpus, health, strict=True)
    ]
    async with uow:
        await uow.repo.replace_inventory(
            "t", [NodeInventory(name="gpu-0", cpu_milli=1, memory_mib=1, gpus=gpus)]
        )
        await uow.commit()


async def test_in_cluster_mode_a_mark_outlives_node_updates_and_rebuilds(
    uow: FakeUnit, cluster: tuple[FakeCluster, ClusterSide]
) -> None:
    fake, side = cluster
    engine = SchedulingEngine(lambda: uow, SchedulerSettings(), side)
    engine.deciding = True
    await engine.cycle()
    engine.gpu_unhealthy("gpu-0", 1)
    await engine.cycle()
    assert healthy(engine) == [True, False]

    fake.add_node(dataclasses.replace(gpu_node("gpu-0", "A100-80GB", 2), labels={"team": "a"}))
    await settle()
    await engine.cycle()
    assert healthy(engine) == [True, False], "a node update keeps the mark"

    engine.state = None  # a failed cycle, or another replica's decision: rebuilt from the API
    await engine.cycle()
    assert healthy(engine) == [True, False], "the rebuild lays the mark on again"


async def test_in_cluster_mode_a_node_made_again_with_other_gpus_inherits_no_mark(
    uow: FakeUnit, cluster: tuple[FakeCluster, ClusterSide]
) -> None:
    fake, side = cluster
    engine = SchedulingEngine(lambda: uow, SchedulerSettings(), side)
    engine.deciding = True
    await engine.cycle()
    engine.gpu_unhealthy("gpu-0", 1)
    await engine.cycle()
    assert healthy(engine) == [True, False]

    fake.delete_node("gpu-0")  # repaired: it registers again under the same name, with other GPUs
    await settle()
    await engine.cycle()
    repaired = gpu_node("gpu-0", "A100-80GB", 2)
    other_gpus = tuple(dataclasses.replace(g, uuid=f"{g.uuid}-new") for g in repaired.gpus)
    fake.add_node(dataclasses.replace(repaired, gpus=other_gpus))
    await settle()
    await engine.cycle()
    assert healthy(engine) == [True, True]
    await report(uow, True, True)  # an inventory change (of the old GPUs) syncs the marks again
    await engine.cycle()
    engine.state = None
    await engine.cycle()
    assert healthy(engine) == [True, True], "the old GPU's mark does not land on the new GPU"


async def test_in_cluster_mode_the_stored_inventory_is_telemetry_s_word_on_its_gpus(
    uow: FakeUnit, cluster: tuple[FakeCluster, ClusterSide]
) -> None:
    _, side = cluster
    await report(uow, False, True)
    engine = SchedulingEngine(lambda: uow, SchedulerSettings(), side)  # a fresh process
    engine.deciding = True
    await engine.cycle()
    assert healthy(engine) == [False, True], "the stored mark is restored"

    await report(uow, True, True)
    await engine.cycle()
    assert healthy(engine) == [True, True], "a later report of the GPU healthy lifts it"


async def test_in_inventory_mode_a_later_report_of_the_gpu_healthy_lifts_the_mark(uow: FakeUnit) -> None:
    await report(uow, True, True)
    engine = SchedulingEngine(lambda: uow, SchedulerSettings())
    engine.deciding = True
    await engine.cycle()
    gpu = gpu_node("gpu-0", "A100-80GB", 2).gpus[1]
    async with uow:
        await uow.repo.mark_gpu_unhealthy("gpu-0", gpu.uuid)
        await uow.commit()
    engine.gpu_unhealthy("gpu-0", 1)
    await engine.cycle()
    assert healthy(engine) == [True, False]

    await report(uow, True, True)
    await engine.cycle()
    assert healthy(engine) == [True, True]
