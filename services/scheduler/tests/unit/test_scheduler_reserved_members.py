"""A member reserved while its gang waits for quorum, whose pod then goes, is forgotten by its gang.

Before, the pod watch freed the member's GPUs in the cache while the gang still counted it reserved
and kept its old allocation: another gang took the GPUs, and at quorum the member was bound with
that allocation too (the same GPU handed to two pods), after which confirming the bind raised
CacheConflict out of the cycle."""

from __future__ import annotations

from typing import Any

from tessera.cluster.builders import gpu_node
from tessera.cluster.domain.requirements import PodGroup
from tessera.cluster.port import EventType, WatchEvent
from tessera.scheduler.domain.cache import PodState
from tessera.scheduler.domain.framework.builders import make_gang, make_node, with_members
from tessera.scheduler.domain.framework.cycle_state import CycleState
from tessera.scheduler.domain.framework.status import Code
from tessera.scheduler.domain.gang.assembly import assemble
from tessera.scheduler.domain.gang.scheduler import OutcomeKind
from tessera.scheduler.domain.plugins.reserve import ALLOCATION, DefaultBinder, RecordingBinder
from tessera.scheduler.domain.snapshot import Allocation
from tessera.scheduler.service_layer.outcomes import GangInfo

from .test_scheduler_deleted_members import Cluster as BaseCluster
from .test_scheduler_deleted_members import Repo, world


class Cluster(BaseCluster):
    """The fake API server of test_scheduler_deleted_members, whose `add` hands back the ADDED event."""

    def add(self, name: str, gpus: int, group: str | None = None) -> WatchEvent[Any]:  # type: ignore[override]
        return WatchEvent(EventType.ADDED, super().add(name, gpus, group), "1")


def gpus_bound(allocations: list[Allocation]) -> list[tuple[str, int]]:
    return [(a.node, index) for a in allocations for index in a.gpu_indices]


async def test_a_reserved_member_deleted_leaves_its_gang_and_its_gpus_are_not_bound_twice() -> None:
    cluster, repo = Cluster(), Repo()
    cluster.groups["ns/pg"] = PodGroup("ns", "pg", 2)
    state, watches = world(cluster, nodes=1)
    scheduler, cache, registry = state.assembly.scheduler, state.assembly.cache, state.assembly.registry
    await watches.apply(repo, "pod", cluster.add("p0", 8, "pg"))
    assert [o.kind for o in scheduler.run(now=100.0)] == [OutcomeKind.WAITING]
    assert cache.pod_state("ns/p0") is PodState.ASSUMED

    await watches.apply(repo, "pod", cluster.delete("p0"))

    assert cache.allocation("ns/p0") is None
    assert "ns/pg" not in registry and "ns/pg" not in state.gangs, "its only member left: the gang went"
    assert scheduler.waiting() == {}, "no reserved member waits any more"

    await watches.apply(repo, "pod", cluster.add("x", 8))  # another gang takes the freed GPUs
    assert [(o.gang, o.kind) for o in scheduler.run(now=101.0)] == [("ns/x", OutcomeKind.PLACED)]
    await watches.apply(repo, "node", WatchEvent(EventType.ADDED, gpu_node("gpu-1", "A100-80GB", 8), "2"))
    await watches.apply(repo, "node", WatchEvent(EventType.ADDED, gpu_node("gpu-2", "A100-80GB", 8), "2"))
    await watches.apply(repo, "pod", cluster.add("p0", 8, "pg"))  # made again under its name
    await watches.apply(repo, "pod", cluster.add("p1", 8, "pg"))

    outcomes = scheduler.run(now=200.0)

    assert [(o.gang, o.kind) for o in outcomes] == [("ns/pg", OutcomeKind.PLACED)]
    assert {a.pod for a in outcomes[0].bound} == {"ns/p0", "ns/p1"}
    assert "gpu-0" not in outcomes[0].nodes, "gpu-0's GPUs are x's"
    bound = gpus_bound(cluster.bound)
    assert len(bound) == len(set(bound)) == 24, "no GPU bound to two pods"
    assert cluster.evicted == []


async def test_the_gang_keeps_waiting_for_its_quorum_with_the_members_left() -> None:
    cluster, repo = Cluster(), Repo()
    cluster.groups["ns/pg"] = PodGroup("ns", "pg", 3)
    state, watches = world(cluster, nodes=3)
    scheduler, registry = state.assembly.scheduler, state.assembly.registry
    for name in ("p0", "p1"):
        await watches.apply(repo, "pod", cluster.add(name, 8, "pg"))
    (waiting,) = scheduler.run(now=100.0)
    assert waiting.kind is OutcomeKind.WAITING

    await watches.apply(repo, "pod", cluster.delete("p0"))

    assert registry.held("ns/pg") == {"ns/p1"}
    assert [m.name for m in registry.spec("ns/pg").members] == ["ns/p1"]
    assert scheduler.waiting() == {"ns/pg": waiting.deadline}, "still waiting, its deadline unchanged"
    assert "ns/pg" in state.assembly.queue
    for name in ("p2", "p3"):
        await watches.apply(repo, "pod", cluster.add(name, 8, "pg"))
    (placed,) = scheduler.run(now=101.0)
    assert placed.kind is OutcomeKind.PLACED
    assert {a.pod for a in placed.bound} == {"ns/p1", "ns/p2", "ns/p3"}
    bound = gpus_bound(cluster.bound)
    assert len(bound) == len(set(bound)) == 24


async def test_a_reserved_job_member_that_ended_before_its_bind_is_not_recorded_as_placed() -> None:
    state, watches = world(Cluster(), nodes=1)
    scheduler = state.assembly.scheduler
    scheduler.submit(make_gang("job", 1, gpus=1, min_available=2))
    scheduler.run(now=100.0)
    state.gangs["job"] = GangInfo("job", "job")

    watches.pod_ended("job-0", "Deleted")

    assert state.gangs["job"].placed == {}, "a reservation is no placement: the gang has not ended"
    assert state.assembly.registry.held("job") == frozenset()
    assert state.assembly.cache.allocation("job-0") is None


def test_a_reservation_gone_is_placed_afresh_when_its_gang_reaches_quorum() -> None:
    binder = RecordingBinder()
    world = assemble([make_node("n0").gpus(1).build()], binder)
    spec = make_gang("job", 1, gpus=1, min_available=2)
    world.scheduler.submit(spec)
    world.scheduler.run(now=0.0)
    assert world.scheduler.reservation_gone("job-0", now=0.5) is not None
    assert world.scheduler.reservation_gone("job-0", now=0.5) is None, "idempotent"
    world.scheduler.submit(make_gang("x", 1, gpus=1))
    assert [o.kind for o in world.scheduler.run(now=1.0)] == [OutcomeKind.PLACED]
    world.scheduler.node_changed(make_node("n1").gpus(1).build(), now=2.0)
    world.scheduler.node_changed(make_node("n2").gpus(1).build(), now=2.0)
    world.scheduler.submit(with_members(spec, 1))

    (placed,) = world.scheduler.run(now=3.0)

    assert placed.kind is OutcomeKind.PLACED
    bound = gpus_bound(binder.bound)
    assert len(bound) == len(set(bound)) == 3, binder.bound


def test_a_reservation_dropped_from_the_cache_behind_the_gangs_back_is_never_bound() -> None:
    """Whatever frees a reservation without its gang knowing, the bind does not go out and nothing
    escapes the cycle: the gang is rolled back and tried again."""
    binder = RecordingBinder()
    world = assemble([make_node("n0").gpus(1).build()], binder)
    spec = make_gang("job", 1, gpus=1, min_available=2)
    world.scheduler.submit(spec)
    world.scheduler.run(now=0.0)
    world.cache.remove_pod("job-0")
    world.scheduler.submit(with_members(spec, 1))
    world.scheduler.node_changed(make_node("n1").gpus(1).build(), now=0.5)

    outcomes = world.scheduler.run(now=1.0)

    assert OutcomeKind.BIND_FAILED in [o.kind for o in outcomes]
    assert "job-0" not in [a.pod for a in binder.bound]
    assert world.cache.allocations() == ()


def test_the_default_binder_does_not_bind_a_reservation_the_cache_no_longer_holds() -> None:
    binder = RecordingBinder()
    world = assemble([make_node("n0").gpus(1).build()], binder)
    allocation = Allocation("p", "g", "n0", ((0, 1000),))
    state = CycleState()
    state.write(ALLOCATION, allocation)
    pod = make_gang("g", 1, gpus=1).members[0]

    status = DefaultBinder(world.cache, binder).bind(state, pod, "n0")

    assert status.code is Code.ERROR and binder.bound == []


async def test_a_reserved_member_made_again_before_its_deletion_is_seen_is_placed_afresh() -> None:
    """The store may already hold the new pod of the same name when the old one's DELETED comes."""
    cluster, repo = Cluster(), Repo()
    cluster.groups["ns/pg"] = PodGroup("ns", "pg", 2)
    state, watches = world(cluster, nodes=1)
    scheduler, registry = state.assembly.scheduler, state.assembly.registry
    await watches.apply(repo, "pod", cluster.add("p0", 8, "pg"))
    scheduler.run(now=100.0)
    deleted = cluster.delete("p0")
    made_again = cluster.add("p0", 8, "pg")

    await watches.apply(repo, "pod", deleted)

    assert registry.held("ns/pg") == frozenset() and state.assembly.cache.allocation("ns/p0") is None
    assert [m.name for m in registry.pending("ns/pg")] == ["ns/p0"], "the new pod waits in its place"
    await watches.apply(repo, "pod", cluster.add("x", 8))
    await watches.apply(repo, "pod", made_again)
    await watches.apply(repo, "node", WatchEvent(EventType.ADDED, gpu_node("gpu-1", "A100-80GB", 8), "2"))
    await watches.apply(repo, "pod", cluster.add("p1", 8, "pg"))
    scheduler.run(now=200.0)
    bound = gpus_bound(cluster.bound)
    assert len(bound) == len(set(bound)), "no GPU bound to two pods"
