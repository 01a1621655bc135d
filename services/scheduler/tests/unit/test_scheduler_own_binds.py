"""A pod of ours found bound where the scheduler's own bind put it (its ``tessera.io/gpu-assignment``
annotation names its node) is one of ours, not one someone else bound: it rejoins its gang as a
placed member, or, its gang gone, holds what it uses and is evicted again.

Before, such a pod counted as bound by someone else: held like a foreign pod and dropped from its
gang for good. A bind that timed out but landed, or a rollback whose eviction was refused, left the
gang short of a member for ever (a PodGroup of two waiting and timing out in turn; a one-pod job's
gang forgotten while the job stayed queued). Pods bound by hand, without the annotation, still
leave their gang (test_scheduler_hand_bound_pods)."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from tessera.cluster.builders import gpu_node
from tessera.cluster.conventions.names import JOB_ID_LABEL
from tessera.cluster.domain.allocation import DeviceAssignment, GpuShare
from tessera.cluster.domain.requirements import GpuRequest, Pod, PodGroup, PodPhase, PodRef, PodRequirements
from tessera.cluster.fake import FakeCluster
from tessera.cluster.port import ClusterError, EventType, WatchEvent
from tessera.contracts.events import GangFinished
from tessera.scheduler.adapters.cluster_side import ClusterSide
from tessera.scheduler.config import SchedulerSettings
from tessera.scheduler.domain.cache import PodState
from tessera.scheduler.domain.framework.cluster_view import node_info
from tessera.scheduler.domain.gang.assembly import assemble
from tessera.scheduler.domain.gang.scheduler import GangOutcome, OutcomeKind
from tessera.scheduler.domain.plugins.reserve import BindError
from tessera.scheduler.domain.snapshot import Allocation
from tessera.scheduler.service_layer.engine import SchedulingEngine
from tessera.scheduler.service_layer.engine_state import EngineState
from tessera.scheduler.service_layer.outcomes import GangInfo
from tessera.scheduler.service_layer.repository_port import JOB
from tessera.scheduler.service_layer.watches import WatchState
from tessera.testing.builders import a_job

from .test_scheduler_deleted_members import Repo

AT = datetime(2026, 11, 25, tzinfo=UTC)
NODES = {f"gpu-{i}": gpu_node(f"gpu-{i}", "A100-80GB", 8) for i in range(3)}


class Cluster:
    """The API server as the scheduler's port sees it. A bind writes the node and the assignment
    annotation in one update (a watch event), as the Binding does; ``refused`` binds fail, ``lost``
    ones land but their answer never comes. Evictions are refused (a PodDisruptionBudget)."""

    def __init__(self) -> None:
        self.pods: dict[str, Pod] = {}
        self.groups: dict[str, PodGroup] = {}
        self.binds: list[str] = []
        self.evicted: list[str] = []
        self.refused: set[str] = set()
        self.lost: set[str] = set()
        self.events: list[WatchEvent[Any]] = []
        self.cache = SimpleNamespace(
            pods=SimpleNamespace(store=self.pods), pod_groups=SimpleNamespace(store=self.groups)
        )

    def bind(self, allocation: Allocation) -> None:
        pod = self.pods[allocation.pod]
        if pod.node_name:
            if pod.node_name == allocation.node:
                return  # AlreadyBound where we put it: the adapter takes it as done
            raise BindError(f"{allocation.pod}: already bound to {pod.node_name}")
        if allocation.pod in self.refused:
            self.refused.discard(allocation.pod)
            raise BindError("refused")
        uuids = [gpu.uuid for gpu in NODES[allocation.node].gpus]
        shares = tuple(GpuShare(uuids[index], milli) for index, milli in allocation.gpu_milli)
        assignment = DeviceAssignment(allocation.node, shares, pod.uid)  # naming the pod's uid
        self.update(pod, node_name=allocation.node, assignment=assignment)
        self.binds.append(allocation.pod)
        if allocation.pod in self.lost:
            self.lost.discard(allocation.pod)
            raise BindError("no answer in 30s")

    def evict(self, allocation: Allocation) -> None:
        self.evicted.append(allocation.pod)

    def update(self, pod: Pod, **fields: Any) -> Pod:
        new = dataclasses.replace(pod, **fields)
        self.pods[f"{pod.namespace}/{pod.name}"] = new
        self.events.append(WatchEvent(EventType.MODIFIED, new, "2"))
        return new

    def add(self, name: str, gpus: int, group: str | None = None, **fields: Any) -> WatchEvent[Pod]:
        fields.setdefault("uid", f"{name}-1")
        pod = Pod(
            "ns",
            name,
            PodRequirements(gpu=GpuRequest.whole(gpus)),
            scheduler_name="tessera",
            pod_group=group,
            **fields,
        )
        self.pods[f"ns/{name}"] = pod
        return WatchEvent(EventType.ADDED, pod, "1")


def world(cluster: Cluster, nodes: int) -> tuple[EngineState, WatchState]:
    infos = {name: node_info(node) for name, node in list(NODES.items())[:nodes]}
    uuids = {name: {gpu.index: gpu.uuid for gpu in NODES[name].gpus} for name in infos}
    state = EngineState(assemble(infos.values(), cluster, pipeline=False), {}, {}, uuids, infos, cluster)
    return state, WatchState(state, cluster, SchedulerSettings.model_validate({}), now=100.0)


async def cycles(state: EngineState, cluster: Cluster, watches: WatchState, n: int = 4) -> list[GangOutcome]:
    """``n`` cycles as the engine runs them: the watch events (whose outcomes are recorded too),
    then an attempt at what is due."""
    outcomes: list[GangOutcome] = []
    repo = Repo()
    for i in range(n):
        while cluster.events:
            outcomes += await watches.apply(repo, "pod", cluster.events.pop(0))
        outcomes += state.assembly.scheduler.run(now=100.0 + 10_000.0 * i)
    return outcomes


def held_for(state: EngineState, gang: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    cache = state.assembly.cache
    return {a.pod: (a.node, a.gpu_indices) for a in cache.allocations(PodState.BOUND) if a.gang == gang}


async def test_a_gang_whose_bind_timed_out_but_landed_is_placed_with_that_member() -> None:
    cluster, repo = Cluster(), Repo()
    cluster.groups["ns/pg"] = PodGroup("ns", "pg", 2)
    state, watches = world(cluster, nodes=2)
    for name in ("p0", "p1"):
        await watches.apply(repo, "pod", cluster.add(name, 8, "pg"))
    cluster.lost = {"ns/p1"}

    outcomes = await cycles(state, cluster, watches)

    kinds = [o.kind for o in outcomes]
    assert kinds == [OutcomeKind.BIND_FAILED, OutcomeKind.PLACED], "placed once both binds are seen"
    assert {a.pod for a in outcomes[-1].bound} == {"ns/p0", "ns/p1"}, "its placement names both"
    pods = cluster.pods
    assert held_for(state, "ns/pg") == {
        "ns/p0": (pods["ns/p0"].node_name or "", tuple(range(8))),
        "ns/p1": (pods["ns/p1"].node_name or "", tuple(range(8))),
    }, "each holds the GPUs its assignment names, for its gang"
    assert sorted(cluster.binds) == ["ns/p0", "ns/p1"], "neither bound twice"
    assert "ns/pg" not in state.assembly.queue


async def test_a_one_pod_job_whose_bind_timed_out_but_landed_is_placed_and_finishes() -> None:
    cluster, repo = Cluster(), Repo()
    state, watches = world(cluster, nodes=1)
    job = "job-1"
    state.gangs[job] = GangInfo(job, JOB)
    state.specs[job] = a_job("j").tenant("ns").group("pods", replicas=1, gpus=2).build()
    await watches.apply(repo, "pod", cluster.add("w0", 2, labels={JOB_ID_LABEL: job}))
    cluster.lost = {"ns/w0"}

    outcomes = await cycles(state, cluster, watches)

    assert [o.kind for o in outcomes] == [OutcomeKind.BIND_FAILED, OutcomeKind.PLACED]
    assert [a.pod for a in outcomes[-1].bound] == ["ns/w0"] and outcomes[-1].gang == job
    assert job in state.assembly.registry and job not in state.assembly.queue, "its gang is placed"
    assert held_for(state, job) == {"ns/w0": ("gpu-0", (0, 1))}

    ended = cluster.update(cluster.pods["ns/w0"], phase=PodPhase.SUCCEEDED)
    await watches.apply(repo, "pod", WatchEvent(EventType.MODIFIED, ended, "3"))
    assert state.gangs[job].placed == {"ns/w0": "Succeeded"}, "its end is counted: the job finishes"
    assert state.assembly.cache.allocation("ns/w0") is None


async def test_a_member_whose_eviction_was_refused_after_a_rollback_is_placed_with_its_gang() -> None:
    cluster, repo = Cluster(), Repo()
    cluster.groups["ns/pg"] = PodGroup("ns", "pg", 2)
    state, watches = world(cluster, nodes=2)
    for name in ("p0", "p1"):
        await watches.apply(repo, "pod", cluster.add(name, 8, "pg"))
    cluster.refused = {"ns/p1"}  # p0 binds, p1 fails: p0's eviction is refused, it keeps running

    outcomes = await cycles(state, cluster, watches)

    assert [o.kind for o in outcomes] == [OutcomeKind.BIND_FAILED, OutcomeKind.PLACED]
    assert cluster.evicted == ["ns/p0"]
    assert {a.pod for a in outcomes[-1].bound} == {"ns/p0", "ns/p1"}, "recorded with the member bound next"
    assert cluster.binds == ["ns/p0", "ns/p1"], "p0 is not bound again"
    assert set(held_for(state, "ns/pg")) == {"ns/p0", "ns/p1"}
    assert "ns/pg" not in state.assembly.queue


async def test_a_member_adopted_whose_pod_goes_before_its_gang_is_placed_leaves_it() -> None:
    cluster, repo = Cluster(), Repo()
    cluster.groups["ns/pg"] = PodGroup("ns", "pg", 2)
    state, watches = world(cluster, nodes=2)
    for name in ("p0", "p1"):
        await watches.apply(repo, "pod", cluster.add(name, 8, "pg"))
    cluster.refused = {"ns/p1"}
    scheduler = state.assembly.scheduler
    assert [o.kind for o in scheduler.run(now=100.0)] == [OutcomeKind.BIND_FAILED]
    bound = cluster.events.pop(0)
    assert await watches.apply(repo, "pod", bound) == []  # p0 adopted: 1 of 2
    assert state.assembly.cache.allocation("ns/p0") is not None

    gone = cluster.pods.pop("ns/p0")
    await watches.apply(
        repo, "pod", WatchEvent(EventType.DELETED, dataclasses.replace(gone, deleting=True), "4")
    )

    assert state.assembly.cache.allocation("ns/p0") is None, "what it held is free"
    assert [m.name for m in state.assembly.registry.spec("ns/pg").members] == ["ns/p1"]
    await watches.apply(repo, "pod", cluster.add("p2", 8, "pg"))
    (placed,) = scheduler.run(now=10_000.0)
    assert placed.kind is OutcomeKind.PLACED
    assert {a.pod for a in placed.bound} == {"ns/p1", "ns/p2"}, "the pod that went is not recorded"


async def test_a_pod_bound_by_our_bind_whose_gang_is_gone_holds_its_gpus_and_is_evicted_once() -> None:
    cluster, repo = Cluster(), Repo()
    state, watches = world(cluster, nodes=1)
    uuids = [gpu.uuid for gpu in NODES["gpu-0"].gpus]
    late = Pod(
        "ns",
        "w0",
        PodRequirements(gpu=GpuRequest.whole(2)),
        uid="w0-1",
        scheduler_name="tessera",
        labels={JOB_ID_LABEL: "job-gone"},  # its job finished: no gang of it is left
        node_name="gpu-0",
        phase=PodPhase.RUNNING,
        assignment=DeviceAssignment("gpu-0", (GpuShare(uuids[6], 1000), GpuShare(uuids[7], 1000)), "w0-1"),
    )
    cluster.pods["ns/w0"] = late

    await watches.apply(repo, "pod", WatchEvent(EventType.ADDED, late, "1"))
    await watches.apply(repo, "pod", WatchEvent(EventType.MODIFIED, late, "2"))

    held = state.assembly.cache.allocation("ns/w0")
    assert held is not None and held.gpu_indices == (6, 7), "what it uses is held"
    assert cluster.evicted == ["ns/w0"], "evicted again, once"


async def test_a_member_bound_by_our_bind_that_its_gang_cannot_take_is_held_and_evicted() -> None:
    cluster, repo = Cluster(), Repo()
    cluster.groups["ns/pg"] = PodGroup("ns", "pg", 2)
    state, watches = world(cluster, nodes=2)
    for name in ("p0", "p1"):
        await watches.apply(repo, "pod", cluster.add(name, 8, "pg"))
    cluster.refused = {"ns/p1"}
    assert [o.kind for o in state.assembly.scheduler.run(now=100.0)] == [OutcomeKind.BIND_FAILED]
    del cluster.groups["ns/pg"]  # its PodGroup is deleted meanwhile: the gang is gone

    await watches.apply(repo, "pod", cluster.events.pop(0))

    held = state.assembly.cache.allocation("ns/p0")
    assert held is not None and held.gpu_indices == tuple(range(8)), "what it uses is held"
    assert cluster.evicted == ["ns/p0", "ns/p0"], "evicted by the rollback, then again"


async def test_a_pod_we_bound_and_evicted_holds_nothing_once_gone_whatever_its_events_say() -> None:
    cluster, repo = Cluster(), Repo()
    cluster.groups["ns/pg"] = PodGroup("ns", "pg", 2)
    state, watches = world(cluster, nodes=2)
    for name in ("p0", "p1"):
        await watches.apply(repo, "pod", cluster.add(name, 8, "pg"))
    cluster.refused = {"ns/p1"}
    assert [o.kind for o in state.assembly.scheduler.run(now=100.0)] == [OutcomeKind.BIND_FAILED]
    stale = cluster.events.pop(0)  # p0 bound; its eviction is taken: the pod is gone since
    gone = cluster.pods.pop("ns/p0")

    await watches.apply(repo, "pod", stale)
    await watches.apply(repo, "pod", WatchEvent(EventType.DELETED, gone, "5"))  # no deletion mark

    assert state.assembly.cache.allocation("ns/p0") is None, "nothing is held for a pod that is gone"
    assert cluster.evicted == ["ns/p0"], "evicted by the rollback only"
    assert [m.name for m in state.assembly.registry.spec("ns/pg").members] == ["ns/p1"]


async def test_a_reserved_member_an_earlier_leader_bound_holds_the_gpus_its_bind_gave_it() -> None:
    cluster, repo = Cluster(), Repo()
    cluster.groups["ns/pg"] = PodGroup("ns", "pg", 2)
    state, watches = world(cluster, nodes=1)
    await watches.apply(repo, "pod", cluster.add("p0", 2, "pg"))
    assert [o.kind for o in state.assembly.scheduler.run(now=100.0)] == [OutcomeKind.WAITING]
    reserved = state.assembly.cache.allocation("ns/p0")
    assert reserved is not None and reserved.gpu_indices != (6, 7)
    uuids = [gpu.uuid for gpu in NODES["gpu-0"].gpus]
    given = DeviceAssignment("gpu-0", (GpuShare(uuids[6], 1000), GpuShare(uuids[7], 1000)), "p0-1")
    cluster.update(cluster.pods["ns/p0"], node_name="gpu-0", assignment=given)  # a late bind
    cluster.events.append(cluster.add("p1", 6, "pg"))

    outcomes = await cycles(state, cluster, watches)

    assert [o.kind for o in outcomes] == [OutcomeKind.PLACED]
    assert held_for(state, "ns/pg") == {"ns/p0": ("gpu-0", (6, 7)), "ns/p1": ("gpu-0", (0, 1, 2, 3, 4, 5))}
    assert cluster.binds == ["ns/p1"]


async def test_a_reserved_member_bound_elsewhere_by_hand_is_not_bound_again() -> None:
    cluster, repo = Cluster(), Repo()
    cluster.groups["ns/pg"] = PodGroup("ns", "pg", 2)
    state, watches = world(cluster, nodes=3)
    await watches.apply(repo, "pod", cluster.add("p0", 8, "pg"))
    scheduler = state.assembly.scheduler
    assert [o.kind for o in scheduler.run(now=100.0)] == [OutcomeKind.WAITING]
    reserved = state.assembly.cache.allocation("ns/p0")
    assert reserved is not None
    other = next(node for node in NODES if node != reserved.node)
    cluster.update(cluster.pods["ns/p0"], node_name=other, phase=PodPhase.RUNNING)  # by hand
    cluster.events.append(cluster.add("p1", 8, "pg"))

    outcomes = await cycles(state, cluster, watches)

    assert OutcomeKind.BIND_FAILED not in [o.kind for o in outcomes], "p0 is never bound again"
    held = state.assembly.cache.allocation("ns/p0")
    assert held is not None and held.node == other and held.gang == "foreign:ns/p0"
    assert [m.name for m in state.assembly.registry.spec("ns/pg").members] == ["ns/p1"]
    assert cluster.binds == []


class AnswerLost(FakeCluster):
    """The API server commits a Binding whose answer never reaches the scheduler (a connection
    reset): the bind fails in the scheduler's eyes, but the pod is bound with our assignment."""

    async def bind(self, ref: PodRef, node: str, assignment: DeviceAssignment | None = None) -> None:
        await super().bind(ref, node, assignment)
        if len(self.bindings) == 1:
            raise ClusterError("connection reset by peer")


async def test_a_job_whose_bind_answer_was_lost_is_recorded_placed_and_finishes(uow: Any) -> None:
    fake = AnswerLost()
    fake.add_node(gpu_node("gpu-0", "A100-80GB", 8))
    side = ClusterSide(fake)
    await side.start(timeout=5)
    try:
        engine = SchedulingEngine(lambda: uow, SchedulerSettings(namespace="ml"), side, clock=AT.timestamp)
        engine.deciding = True
        async with uow:
            spec = a_job("train").group("worker", replicas=1, gpus=4).build()
            await uow.repo.add_pending("train", spec, AT)
            await uow.commit()
        pod = Pod(
            "ml",
            "train-worker-0",
            PodRequirements(gpu=GpuRequest.whole(4)),
            scheduler_name="tessera",
            labels={JOB_ID_LABEL: "train"},
        )
        fake.add_pod(pod)
        await settle()
        assert [o.kind for o in await engine.cycle()] == [OutcomeKind.BIND_FAILED]
        await settle()

        (placed,) = await engine.cycle()

        assert placed.kind is OutcomeKind.PLACED and placed.gang == "train"
        assert [row.pod for row in uow.stored.placements.values()] == ["ml/train-worker-0"]
        assert "train" not in uow.stored.pending, "admission is told it is placed, not queued"
        assert len(fake.bindings) == 1 and fake.evictions == []
        bound = await fake.get_pod(PodRef("ml", "train-worker-0"))
        fake.add_pod(dataclasses.replace(bound, phase=PodPhase.SUCCEEDED))
        await settle()
        await engine.cycle()
        finished = [m for m in uow.outbox if isinstance(m, GangFinished)]
        assert [(m.job_id, m.succeeded) for m in finished] == [("train", True)], "its end finishes the job"
    finally:
        await side.stop()


async def settle() -> None:
    for _ in range(5):  # let the fake's watch events reach the cache
        await asyncio.sleep(0)
