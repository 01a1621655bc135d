"""A rebuild takes a recorded pod that is leaving (being deleted, or being evicted by the scheduler)
for no bound member of its gang: it holds what it uses until it is gone, and is adopted by none.

Before, the rebuild restored every live recorded pod as bound: a gang found with a member on its
way out counted it toward its quorum (and was not broken as bound below it), and a pod whose
eviction was asked just before the rebuild (the outcome that released its record did not commit)
came back as a placed member, its record kept; once it went, its end was counted against a gang
that had been requeued."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from tessera.cluster.builders import gpu_node
from tessera.cluster.cache import pod_key
from tessera.cluster.domain.allocation import DeviceAssignment, GpuShare
from tessera.cluster.domain.requirements import GpuRequest, Pod, PodGroup, PodPhase, PodRequirements
from tessera.cluster.fake import FakeCluster
from tessera.cluster.port import EventType, WatchEvent
from tessera.scheduler.adapters.cluster_side import ClusterSide
from tessera.scheduler.config import SchedulerSettings
from tessera.scheduler.domain.framework.cluster_view import node_info
from tessera.scheduler.domain.gang.scheduler import OutcomeKind
from tessera.scheduler.service_layer.bound_pods import held_by_others
from tessera.scheduler.service_layer.outcomes import GangInfo
from tessera.scheduler.service_layer.rebuild import adopt_cluster_pods, rebuild
from tessera.scheduler.service_layer.repository_port import PODGROUP, PlacementRow
from tessera.scheduler.service_layer.watches import WatchState

AT = datetime(2026, 11, 25, tzinfo=UTC)
NODES = [gpu_node(f"gpu-{i}", "A100-80GB", 8) for i in range(2)]
SETTINGS = SchedulerSettings()


def member(name: str, node: int | None, **fields: Any) -> Pod:
    """A member of ns/pg asking for a whole node; bound by our bind on ``node`` when given."""
    assignment = None
    if node is not None:
        shares = tuple(GpuShare(gpu.uuid, 1000) for gpu in NODES[node].gpus)
        assignment = DeviceAssignment(NODES[node].name, shares, f"{name}-1")
    return Pod(
        "ns",
        name,
        PodRequirements(gpu=GpuRequest.whole(8)),
        uid=f"{name}-1",
        scheduler_name="tessera",
        pod_group="pg",
        node_name=NODES[node].name if node is not None else None,
        phase=PodPhase.RUNNING if node is not None else PodPhase.PENDING,
        assignment=assignment,
        **fields,
    )


def row(pod: Pod) -> PlacementRow:
    gpus = tuple((i, 1000) for i in range(8))
    return PlacementRow("ns/pg", pod_key(pod), "pg", pod.node_name or "", gpus, 0, 0)


@pytest.fixture
async def fake() -> AsyncIterator[FakeCluster]:
    fake = FakeCluster()
    for node in NODES:
        fake.add_node(node)
    fake.add_pod_group(PodGroup("ns", "pg", 2))
    yield fake


async def world(fake: FakeCluster, uow: Any, p0: Pod) -> ClusterSide:
    """ns/pg, a PodGroup of three with a quorum of two, still pending (p2 waits for a node); p0
    and p1 were placed and recorded."""
    p1, p2 = member("p1", 1), member("p2", None)
    for pod in (p0, p1, p2):
        fake.add_pod(pod)
    async with uow:
        await uow.repo.add_pending("ns/pg", None, AT, source=PODGROUP)
        await uow.repo.record_placements([row(p0), row(p1)])
        await uow.commit()
    side = ClusterSide(fake)
    await side.start(timeout=5)
    return side


async def test_a_recorded_pod_being_deleted_holds_its_gpus_as_no_member_of_its_gang(
    fake: FakeCluster, uow: Any
) -> None:
    side = await world(fake, uow, member("p0", 0, deleting=True))
    try:
        async with uow:
            state = await rebuild(uow.repo, SETTINGS, side, AT.timestamp())
        cache, registry = state.assembly.cache, state.assembly.registry

        held = cache.allocation("ns/p0")
        assert held is not None and held.gpu_indices == tuple(range(8)), "what it was given is held"
        assert held.gang == "ns/pg", "in its gang's name: its end is counted"
        assert "ns/p0" not in registry.bound("ns/pg"), "no bound member of its gang"
        assert [o.kind for o in state.recovered] == [OutcomeKind.BROKEN], "p1 alone: below quorum"
        assert state.gangs["ns/pg"].placed["ns/p0"] is None

        watches = WatchState(state, side, SETTINGS, AT.timestamp())
        gone = await fake.get_pod(member("p0", 0).ref)
        await watches.apply(uow.repo, "pod", WatchEvent(EventType.DELETED, gone, "9"))
        assert cache.allocation("ns/p0") is None, "free once it is gone"
        assert state.gangs["ns/pg"].placed["ns/p0"] == "Deleted", "its end is counted"
    finally:
        await side.stop()


async def test_a_recorded_pod_the_scheduler_is_evicting_is_released_and_held_as_no_member(
    fake: FakeCluster, uow: Any
) -> None:
    side = await world(fake, uow, member("p0", 0))
    try:
        side.evictions.asked("ns/p0")  # accepted just before the rebuild; the watch shows nothing yet
        async with uow:
            state = await rebuild(uow.repo, SETTINGS, side, AT.timestamp())
            await uow.commit()

        cache, registry = state.assembly.cache, state.assembly.registry
        held = cache.allocation("ns/p0")
        assert held is not None and held.gpu_indices == tuple(range(8)), "what it uses is held"
        assert held_by_others(cache, "ns/p0"), "for no gang: one the scheduler let go"
        assert "ns/p0" not in registry.bound("ns/pg")
        assert "ns/p0" not in state.gangs["ns/pg"].placed, "not a placed member whose end counts"
        assert sorted(uow.stored.placements) == ["ns/p1"], "its record is released"
    finally:
        await side.stop()


async def test_a_rebuild_adopts_no_unrecorded_pod_of_ours_being_deleted(fake: FakeCluster) -> None:
    """Before, a member bound by our bind that was being deleted was adopted into its live gang;
    then it was neither adopted nor held, its GPUs free in the cache while it still used them."""
    fake.add_pod(member("p0", 0, deleting=True))
    fake.add_pod(dataclasses.replace(member("q0", 1, deleting=True), pod_group="gone"))  # a gang not kept
    side = ClusterSide(fake)
    await side.start(timeout=5)
    try:
        nodes = {node.name: node_info(node) for node in NODES}
        uuids = {node.name: {gpu.index: gpu.uuid for gpu in node.gpus} for node in NODES}
        gangs = {"ns/pg": GangInfo("ns/pg", PODGROUP)}

        adopted, held, leaving = adopt_cluster_pods(side, nodes, uuids, gangs, set(), {}, "ml")

        assert adopted == [], "not adopted"
        assert [pod.name for pod in held] == ["q0"], "of no gang being rebuilt: held as someone else's"
        assert [(a.pod, a.gang, a.gpu_indices) for a in leaving] == [("ns/p0", "ns/pg", tuple(range(8)))]
    finally:
        await side.stop()


async def test_an_unrecorded_pod_of_ours_being_deleted_holds_its_gpus_until_it_is_gone(
    fake: FakeCluster, uow: Any
) -> None:
    """A bind the scheduler never recorded (it stopped before the commit), the pod being deleted at
    the rebuild: during its grace period its GPUs are held, so no other gang is given them; once it
    is gone they are freed, once, and its end is not counted as a placed member's."""
    p0, p1 = member("p0", 0, deleting=True), member("p1", None)
    for pod in (p0, p1):
        fake.add_pod(pod)
    async with uow:
        await uow.repo.add_pending("ns/pg", None, AT, source=PODGROUP)
        await uow.commit()
    side = ClusterSide(fake)
    await side.start(timeout=5)
    try:
        async with uow:
            state = await rebuild(uow.repo, SETTINGS, side, AT.timestamp())
        cache, registry = state.assembly.cache, state.assembly.registry

        held = cache.allocation("ns/p0")
        assert held is not None and held.gpu_indices == tuple(range(8)), "its GPUs are not free"
        assert held.gang == "ns/pg" and "ns/p0" not in registry.bound("ns/pg"), "held, no member"
        assert [m.name for m in registry.spec("ns/pg").members] == ["ns/p1"]
        assert "ns/p0" not in state.gangs["ns/pg"].placed

        watches = WatchState(state, side, SETTINGS, AT.timestamp())
        gone = WatchEvent(EventType.DELETED, p0, "9")
        await watches.apply(uow.repo, "pod", gone)
        assert cache.allocation("ns/p0") is None, "free once it is gone"
        assert "ns/p0" not in state.gangs["ns/pg"].placed, "never placed: its end is not the gang's"
        await watches.apply(uow.repo, "pod", gone)  # the same end seen again frees nothing more
        free = cache.node("gpu-0")
        assert all(gpu.fully_idle for gpu in free.gpus)
        assert "ns/pg" in state.gangs, "the gang still waits for its member"
    finally:
        await side.stop()
