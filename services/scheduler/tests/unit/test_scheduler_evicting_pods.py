"""A pod the scheduler asked to evict rejoins no gang until it is seen going or its eviction is
refused.

An eviction the API accepted shows on the watch only later: meanwhile the pod still looks bound by
our bind (its ``tessera.io/gpu-assignment`` annotation names its node), not being deleted. Before,
such a pod was adopted back into its gang in the very cycle that evicted it: a rebuild that broke a
gang bound below quorum evicted p0, adopted it again and placed the gang with p0 and p1, and once
the eviction landed the gang ran below quorum for ever."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

from tessera.cluster.builders import gpu_node
from tessera.cluster.conventions.names import JOB_ID_LABEL
from tessera.cluster.domain.allocation import DeviceAssignment, GpuShare
from tessera.cluster.domain.requirements import GpuRequest, Pod, PodGroup, PodPhase, PodRef, PodRequirements
from tessera.cluster.fake import FakeCluster
from tessera.cluster.port import EventType, WatchEvent
from tessera.scheduler.adapters.cluster_side import ClusterSide
from tessera.scheduler.adapters.kube import Evictions
from tessera.scheduler.config import SchedulerSettings
from tessera.scheduler.domain.gang.queue import ClusterEvent
from tessera.scheduler.domain.gang.scheduler import GangOutcome, OutcomeKind
from tessera.scheduler.domain.snapshot import Allocation
from tessera.scheduler.service_layer.engine import SchedulingEngine
from tessera.scheduler.service_layer.engine_state import EngineState
from tessera.scheduler.service_layer.repository_port import PODGROUP
from tessera.scheduler.service_layer.watches import WatchState, hold_foreign

from .test_scheduler_deleted_members import Repo
from .test_scheduler_own_binds import NODES, Cluster, settle, world

AT = datetime(2026, 11, 25, tzinfo=UTC)


class Evicting(Cluster):
    """The port as :class:`~tessera.scheduler.adapters.kube.ClusterBinder` is: each eviction it is
    asked for is noted (accepted by the API, not yet seen on the watch); ``refuse`` ones are refused."""

    def __init__(self) -> None:
        super().__init__()
        # the clock stands still: a refused eviction stays within its backoff unless a test moves it
        self.evictions = Evictions(
            lambda key: self.pods[key].uid if key in self.pods else None, clock=lambda: 0.0
        )
        self.refuse: set[str] = set()

    def evict(self, allocation: Allocation) -> None:
        super().evict(allocation)
        asked = self.evictions.asked(allocation.pod)
        if allocation.pod in self.refuse:
            self.evictions.refused(asked)


def rebuilt_below_quorum(cluster: Evicting, state: EngineState) -> None:
    """As a rebuild finds ns/pg (two members): p0 bound by our bind, p1 waiting."""
    uuids = [gpu.uuid for gpu in NODES["gpu-0"].gpus]
    p0 = cluster.pods["ns/p0"]
    shares = tuple(GpuShare(uuid, 1000) for uuid in uuids)
    cluster.pods["ns/p0"] = dataclasses.replace(
        p0, node_name="gpu-0", assignment=DeviceAssignment("gpu-0", shares, p0.uid)
    )
    cache, registry = state.assembly.cache, state.assembly.registry
    cache.assume(Allocation("ns/p0", "ns/pg", "gpu-0", tuple((i, 1000) for i in range(8)), 0, 0))
    cache.confirm_bound("ns/p0")
    registry.mark_reserved("ns/pg", "ns/p0")
    registry.mark_bound("ns/pg", "ns/p0")


async def evicting_world() -> tuple[Evicting, EngineState, WatchState, Repo]:
    cluster, repo = Evicting(), Repo()
    cluster.groups["ns/pg"] = PodGroup("ns", "pg", 2)
    state, watches = world(cluster, nodes=2)
    state.evictions = cluster.evictions
    for name in ("p0", "p1"):
        await watches.apply(repo, "pod", cluster.add(name, 8, "pg", uid=f"{name}-1"))
    rebuilt_below_quorum(cluster, state)
    return cluster, state, watches, repo


def placed_with(outcomes: list[GangOutcome], pod: str) -> bool:
    return any(o.kind is OutcomeKind.PLACED and pod in {a.pod for a in o.bound} for o in outcomes)


async def test_a_member_a_rebuild_evicts_is_not_adopted_back_before_its_eviction_shows() -> None:
    cluster, state, watches, repo = await evicting_world()
    scheduler = state.assembly.scheduler

    (broken,) = scheduler.recover(100.0)
    assert broken.kind is OutcomeKind.BROKEN and [a.pod for a in broken.evicted] == ["ns/p0"]
    # the eviction is accepted; the watch shows p0 as it was: bound by our bind, not being deleted
    await watches.refresh_native(repo, "ns/pg")
    await watches.apply(repo, "pod", WatchEvent(EventType.MODIFIED, cluster.pods["ns/p0"], "3"))
    outcomes = scheduler.run(now=20_000.0)

    assert not placed_with(outcomes, "ns/p0"), "the gang is not placed with a member being evicted"
    assert state.assembly.cache.allocation("ns/p0") is None, "p0 is adopted by no gang"
    assert [m.name for m in state.assembly.registry.spec("ns/pg").members] == ["ns/p1"]
    assert cluster.binds == []

    # the eviction lands; the controller makes p0 again: the gang is placed with the new pod
    gone = cluster.pods.pop("ns/p0")
    await watches.apply(
        repo, "pod", WatchEvent(EventType.DELETED, dataclasses.replace(gone, deleting=True), "4")
    )
    await watches.apply(repo, "pod", cluster.add("p0", 8, "pg", uid="p0-2"))
    (placed,) = scheduler.run(now=20_001.0)  # before the wait for quorum times out
    assert placed.kind is OutcomeKind.PLACED and {a.pod for a in placed.bound} == {"ns/p0", "ns/p1"}
    assert sorted(cluster.binds) == ["ns/p0", "ns/p1"]


async def test_a_member_whose_eviction_is_refused_rejoins_its_gang() -> None:
    cluster, state, watches, repo = await evicting_world()
    cluster.refuse = {"ns/p0"}  # a disruption budget: p0 keeps running
    scheduler = state.assembly.scheduler

    scheduler.recover(100.0)
    await watches.refresh_native(repo, "ns/pg")
    outcomes = scheduler.run(now=20_000.0)

    assert placed_with(outcomes, "ns/p0"), "adopted again, placed with the member bound next"
    assert cluster.binds == ["ns/p1"]


class EvictionLags(FakeCluster):
    """The API server accepts evictions at once; the pods go (and the watch shows it) on ``land``."""

    def __init__(self) -> None:
        super().__init__()
        self.accepted: list[PodRef] = []

    async def evict(self, ref: PodRef, grace_period_seconds: int | None = None) -> None:
        await self.get_pod(ref)
        self.accepted.append(ref)

    async def land(self) -> None:
        for ref in self.accepted:
            await super().evict(ref)
        self.accepted = []


REQUIREMENTS = PodRequirements(gpu=GpuRequest.whole(8))
MEMBER: dict[str, Any] = {"scheduler_name": "tessera", "pod_group": "pg"}


async def engine_world(fake: FakeCluster, uow: Any) -> tuple[ClusterSide, SchedulingEngine, list[float]]:
    """A PodGroup ns/pg of two pending since before a restart: p0 bound by our bind, p1 waiting."""
    for name in ("gpu-0", "gpu-1"):
        fake.add_node(gpu_node(name, "A100-80GB", 8))
    fake.add_pod_group(PodGroup("ns", "pg", 2))
    uuids = [gpu.uuid for gpu in gpu_node("gpu-0", "A100-80GB", 8).gpus]
    assignment = DeviceAssignment("gpu-0", tuple(GpuShare(uuid, 1000) for uuid in uuids), "p0-1")
    fake.add_pod(
        Pod("ns", "p0", REQUIREMENTS, uid="p0-1", node_name="gpu-0", assignment=assignment, **MEMBER)
    )
    fake.add_pod(Pod("ns", "p1", REQUIREMENTS, uid="p1-1", **MEMBER))
    side = ClusterSide(fake)
    await side.start(timeout=5)
    clock = [AT.timestamp()]
    engine = SchedulingEngine(lambda: uow, SchedulerSettings(), side, clock=lambda: clock[0])
    engine.deciding = True
    async with uow:
        await uow.repo.add_pending("ns/pg", None, AT, source=PODGROUP)
        await uow.commit()
    return side, engine, clock


async def cycles(engine: SchedulingEngine, clock: list[float], n: int) -> list[GangOutcome]:
    """``n`` cycles, 5 s apart (past the backoff, within the wait for quorum)."""
    outcomes: list[GangOutcome] = []
    for _ in range(n):
        outcomes += await engine.cycle()
        await settle()
        clock[0] += 5.0
    return outcomes


async def test_the_engine_does_not_place_a_gang_with_a_member_it_is_evicting(uow: Any) -> None:
    fake = EvictionLags()
    side, engine, clock = await engine_world(fake, uow)
    try:
        # a rebuild: p0 alone is bound, the gang is broken; the eviction is accepted, its watch
        # event does not come
        outcomes = await cycles(engine, clock, 4)

        assert [ref.name for ref in fake.accepted] == ["p0"], "p0 is evicted once"
        assert OutcomeKind.BROKEN in [o.kind for o in outcomes]
        assert not placed_with(outcomes, "ns/p0"), "the gang is not placed with p0"
        assert fake.bindings == []

        await fake.land()
        await settle()
        fake.add_pod(Pod("ns", "p0", REQUIREMENTS, uid="p0-2", **MEMBER))  # its controller's new p0
        await settle()
        (placed,) = [o for o in await engine.cycle() if o.kind is OutcomeKind.PLACED]
        assert {a.pod for a in placed.bound} == {"ns/p0", "ns/p1"}
    finally:
        await side.stop()


async def test_the_engine_adopts_a_member_whose_eviction_a_budget_refused(uow: Any) -> None:
    fake = FakeCluster()
    fake.block_eviction(PodRef("ns", "p0"))
    side, engine, clock = await engine_world(fake, uow)
    try:
        outcomes = await cycles(engine, clock, 4)

        assert fake.evictions == []
        assert placed_with(outcomes, "ns/p0"), "p0 keeps running: the gang is placed with it"
        assert [(ref.name, node) for ref, node in fake.bindings] == [("p1", "gpu-1")]
    finally:
        await side.stop()


async def test_a_pod_of_no_gang_the_cache_cannot_hold_is_evicted_once_whatever_its_events() -> None:
    """Within the backoff of a refused eviction (the clock stands still here)."""
    cluster, repo = Evicting(), Repo()
    state, watches = world(cluster, nodes=1)
    state.evictions = cluster.evictions
    cluster.refuse = {"ns/w0"}  # a disruption budget keeps it running
    uuids = [gpu.uuid for gpu in NODES["gpu-0"].gpus]
    late = Pod(
        "ns",
        "w0",
        PodRequirements(gpu=GpuRequest.whole(1)),
        uid="w0-1",
        scheduler_name="tessera",
        labels={JOB_ID_LABEL: "job-gone"},  # its job finished: no gang of it is left
        node_name="gpu-0",
        phase=PodPhase.RUNNING,
        assignment=DeviceAssignment("gpu-0", (GpuShare(uuids[0], 1000),), "w0-1"),
    )
    cluster.pods["ns/w0"] = late
    state.assembly.cache.remove_node("gpu-0")  # the cache cannot hold what it uses: nothing is held

    for version in range(1, 5):  # its status updates
        await watches.apply(repo, "pod", WatchEvent(EventType.MODIFIED, late, str(version)))

    assert state.assembly.cache.allocation("ns/w0") is None
    assert cluster.evicted == ["ns/w0"], "asked once, not at each of its events"

    # made again under its name (another uid), bound by our bind with its gang gone: evicted too
    assert late.assignment is not None
    rebound = dataclasses.replace(late.assignment, pod_uid="w0-2")  # our bind names the new uid
    again = dataclasses.replace(late, uid="w0-2", assignment=rebound)
    cluster.pods["ns/w0"] = again
    await watches.apply(repo, "pod", WatchEvent(EventType.DELETED, late, "5"))
    await watches.apply(repo, "pod", WatchEvent(EventType.ADDED, again, "6"))
    await watches.apply(repo, "pod", WatchEvent(EventType.MODIFIED, again, "7"))
    assert cluster.evicted == ["ns/w0", "ns/w0"]


class CountsEvictions(FakeCluster):
    """Counts the evictions asked for, refused ones included."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    async def evict(self, ref: PodRef, grace_period_seconds: int | None = None) -> None:
        self.asked.append(ref.name)
        await super().evict(ref, grace_period_seconds)


async def test_a_rebuild_evicts_a_pod_of_ours_whose_gang_is_gone_once_per_backoff(uow: Any) -> None:
    fake = CountsEvictions()
    fake.add_node(gpu_node("gpu-0", "A100-80GB", 8))
    uuids = [gpu.uuid for gpu in gpu_node("gpu-0", "A100-80GB", 8).gpus]
    assignment = DeviceAssignment("gpu-0", (GpuShare(uuids[6], 1000), GpuShare(uuids[7], 1000)), "w0-1")
    late = Pod(
        "ml",
        "w0",
        PodRequirements(gpu=GpuRequest.whole(2)),
        uid="w0-1",
        scheduler_name="tessera",
        labels={JOB_ID_LABEL: "job-gone"},  # an earlier leader's bind landing after its job ended
        node_name="gpu-0",
        phase=PodPhase.RUNNING,
        assignment=assignment,
    )
    fake.add_pod(late)
    fake.block_eviction(PodRef("ml", "w0"))  # a disruption budget keeps it running
    side = ClusterSide(fake)
    await side.start(timeout=5)
    clock = [AT.timestamp()]
    try:
        engine = SchedulingEngine(
            lambda: uow, SchedulerSettings(namespace="ml"), side, clock=lambda: clock[0]
        )
        engine.deciding = True
        await cycles(engine, clock, 2)
        assert engine.state is not None
        held = engine.state.assembly.cache.allocation("ml/w0")
        assert held is not None and held.gpu_indices == (6, 7), "what it uses is held"
        assert fake.asked == ["w0"], "the rebuild evicts it"

        engine.state = None  # another rebuild, later events of the pod
        fake.add_pod(dataclasses.replace(late, annotations={"seen": "again"}))
        await settle()
        await cycles(engine, clock, 2)
        assert fake.asked == ["w0"], "once within the backoff (30 s)"

        clock[0] += 30.0  # past the backoff: a cycle asks again, no rebuild or event needed
        await cycles(engine, clock, 1)
        assert fake.asked == ["w0", "w0"], "again after the backoff"
        await cycles(engine, clock, 2)
        assert fake.asked == ["w0", "w0"], "refused again: the backoff doubles"

        fake.block_eviction(PodRef("ml", "w0"), blocked=False)
        rebound = dataclasses.replace(assignment, pod_uid="w0-2")  # our bind names the new uid
        fake.add_pod(dataclasses.replace(late, uid="w0-2", assignment=rebound))  # made again
        await settle()
        engine.state = None
        await cycles(engine, clock, 2)
        assert fake.asked == ["w0", "w0", "w0"] and len(fake.evictions) == 1, "the new pod is evicted too"
    finally:
        await side.stop()


async def test_a_member_adopted_without_its_gpus_is_not_taken_for_moved_at_each_event() -> None:
    cluster, repo = Cluster(), Repo()
    cluster.groups["ns/pg"] = PodGroup("ns", "pg", 2)
    state, watches = world(cluster, nodes=1)
    cache, queue = state.assembly.cache, state.assembly.queue
    other = Allocation("x/y", "foreign:x/y", "gpu-0", tuple((i, 1000) for i in range(8)), 0, 0)
    hold_foreign(cache, other)  # what p0's bind gave it is taken in the cache's books
    for name in ("p0", "p1"):
        await watches.apply(repo, "pod", cluster.add(name, 8, "pg"))
    uuids = [gpu.uuid for gpu in NODES["gpu-0"].gpus]
    bound = cluster.update(
        cluster.pods["ns/p0"],
        node_name="gpu-0",
        assignment=DeviceAssignment(
            "gpu-0", tuple(GpuShare(uuid, 1000) for uuid in uuids), cluster.pods["ns/p0"].uid
        ),
    )
    await watches.apply(repo, "pod", WatchEvent(EventType.MODIFIED, bound, "2"))
    adopted = cache.allocation("ns/p0")
    assert adopted is not None and adopted.gang == "ns/pg" and adopted.gpu_milli == (), "held without GPUs"

    heard: list[ClusterEvent] = []
    on_event = queue.on_event

    def hear(event: ClusterEvent, now: float) -> int:
        heard.append(event)
        return on_event(event, now)

    queue.on_event = hear  # type: ignore[method-assign]
    for version in range(3, 6):  # its status updates
        await watches.apply(repo, "pod", WatchEvent(EventType.MODIFIED, bound, str(version)))

    assert cache.allocation("ns/p0") is adopted, "still adopted as it was"
    assert ClusterEvent.CAPACITY_FREED not in heard, "no capacity is freed at each event"
