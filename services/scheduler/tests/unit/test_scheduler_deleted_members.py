"""A pod deleted while it waits for a node leaves its gang. Before, the gang kept it: once capacity
came, the scheduler reserved the deleted pod, its bind failed, and the gang was broken, evicting the
members already running; a lone pod deleted while parked stayed queued (and announced as demand)
for ever."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

from tessera.cluster.builders import gpu_node
from tessera.cluster.domain.requirements import GpuRequest, GpuRequestKind, Pod, PodGroup, PodRequirements
from tessera.cluster.port import EventType, WatchEvent
from tessera.scheduler.config import SchedulerSettings
from tessera.scheduler.domain.framework.cluster_view import node_info
from tessera.scheduler.domain.gang.assembly import assemble
from tessera.scheduler.domain.gang.scheduler import OutcomeKind
from tessera.scheduler.domain.plugins.reserve import BindError
from tessera.scheduler.domain.snapshot import Allocation
from tessera.scheduler.service_layer.engine_state import EngineState
from tessera.scheduler.service_layer.watches import WatchState


class Cluster:
    """The API server as the scheduler's port sees it: binds are recorded; a bind of a pod that is
    gone fails."""

    def __init__(self) -> None:
        self.pods: dict[str, Pod] = {}
        self.groups: dict[str, PodGroup] = {}
        self.bound: list[Allocation] = []
        self.evicted: list[str] = []
        self.cache = SimpleNamespace(
            pods=SimpleNamespace(store=self.pods), pod_groups=SimpleNamespace(store=self.groups)
        )

    def bind(self, allocation: Allocation) -> None:
        pod = self.pods.get(allocation.pod)
        if pod is None:
            raise BindError(f"{allocation.pod}: not found")
        self.pods[allocation.pod] = dataclasses.replace(pod, node_name=allocation.node)
        self.bound.append(allocation)

    def evict(self, allocation: Allocation) -> None:
        self.evicted.append(allocation.pod)

    def add(self, name: str, gpus: int, group: str | None = None) -> Pod:
        gpu = GpuRequest(GpuRequestKind.WHOLE, count=gpus, milli=1000)
        pod = Pod("ns", name, PodRequirements(gpu=gpu), scheduler_name="tessera", pod_group=group)
        self.pods[f"ns/{name}"] = pod
        return pod

    def delete(self, name: str) -> WatchEvent[Any]:
        """The pod leaves the store; its DELETED event carries the deletion mark, as the API's does."""
        gone = self.pods.pop(f"ns/{name}")
        return WatchEvent(EventType.DELETED, dataclasses.replace(gone, deleting=True), "9")


class Repo:
    def __init__(self) -> None:
        self.pending: set[str] = set()

    async def add_pending(self, key: str, *_: Any, **__: Any) -> bool:
        self.pending.add(key)
        return True

    async def remove_pending(self, key: str) -> None:
        self.pending.discard(key)


def world(cluster: Cluster, nodes: int, gpus: int = 8) -> tuple[EngineState, WatchState]:
    infos = {f"gpu-{i}": node_info(gpu_node(f"gpu-{i}", "A100-80GB", gpus)) for i in range(nodes)}
    state = EngineState(assemble(infos.values(), cluster, pipeline=False), {}, {}, {}, infos, cluster)
    return state, WatchState(state, cluster, SchedulerSettings.model_validate({}), now=100.0)


async def test_a_waiting_member_deleted_leaves_the_gang_and_the_running_members_stay() -> None:
    cluster, repo = Cluster(), Repo()
    cluster.groups["ns/pg"] = PodGroup("ns", "pg", 2)
    state, watches = world(cluster, nodes=2)  # room for two of the three members
    for i in range(3):
        await watches.apply(repo, "pod", WatchEvent(EventType.ADDED, cluster.add(f"p{i}", 8, "pg"), "1"))
    scheduler = state.assembly.scheduler
    (placed,) = scheduler.run(now=100.0)
    assert placed.kind is OutcomeKind.PLACED and len(placed.bound) == 2
    (waiting,) = {"ns/p0", "ns/p1", "ns/p2"} - {a.pod for a in placed.bound}
    assert state.assembly.queue.parked() == ("ns/pg",), "the third member waits for room"

    await watches.apply(repo, "pod", cluster.delete(waiting.removeprefix("ns/")))

    members = {m.name for m in state.assembly.registry.spec("ns/pg").members}
    assert members == {a.pod for a in placed.bound}
    assert "ns/pg" not in state.assembly.queue, "nothing of it waits any more"
    await watches.apply(repo, "node", WatchEvent(EventType.ADDED, gpu_node("gpu-9", "A100-80GB", 8), "2"))
    assert scheduler.run(now=10_000.0) == []
    assert cluster.evicted == [], "the running members were not evicted"
    assert "ns/pg" in state.gangs and repo.pending == {"ns/pg"}, "the gang itself lives on"


async def test_a_lone_pod_deleted_while_parked_is_forgotten() -> None:
    cluster, repo = Cluster(), Repo()
    state, watches = world(cluster, nodes=1)
    await watches.apply(repo, "pod", WatchEvent(EventType.ADDED, cluster.add("big", 16), "1"))
    scheduler = state.assembly.scheduler
    (outcome,) = scheduler.run(now=100.0)
    assert outcome.kind is OutcomeKind.UNSCHEDULABLE and repo.pending == {"ns/big"}

    await watches.apply(repo, "pod", cluster.delete("big"))

    assert "ns/big" not in state.assembly.registry and "ns/big" not in state.assembly.queue
    assert "ns/big" not in state.gangs and repo.pending == set()
    await watches.apply(repo, "node", WatchEvent(EventType.ADDED, gpu_node("gpu-9", "A100-80GB", 16), "2"))
    assert scheduler.run(now=10_000.0) == [], "no attempt to bind a pod that is gone"


async def test_a_member_deleted_and_made_again_joins_as_a_new_member() -> None:
    cluster, repo = Cluster(), Repo()
    cluster.groups["ns/pg"] = PodGroup("ns", "pg", 2)
    state, watches = world(cluster, nodes=2)
    await watches.apply(repo, "pod", WatchEvent(EventType.ADDED, cluster.add("a", 16, "pg"), "1"))
    await watches.apply(repo, "pod", WatchEvent(EventType.ADDED, cluster.add("b", 8, "pg"), "1"))
    scheduler = state.assembly.scheduler
    assert [o.kind for o in scheduler.run(now=100.0)] == [OutcomeKind.UNSCHEDULABLE]

    await watches.apply(repo, "pod", cluster.delete("a"))  # too big: its owner makes a smaller one
    await watches.apply(repo, "pod", WatchEvent(EventType.ADDED, cluster.add("c", 8, "pg"), "2"))

    assert {m.name for m in state.assembly.registry.spec("ns/pg").members} == {"ns/b", "ns/c"}
    (placed,) = scheduler.run(now=10_000.0)
    assert placed.kind is OutcomeKind.PLACED and {a.pod for a in placed.bound} == {"ns/b", "ns/c"}


async def test_a_gang_waiting_for_its_quorum_that_loses_a_newcomer_still_times_out_cleanly() -> None:
    cluster, repo = Cluster(), Repo()
    cluster.groups["ns/pg"] = PodGroup("ns", "pg", 3)
    state, watches = world(cluster, nodes=4)
    for i in range(2):
        await watches.apply(repo, "pod", WatchEvent(EventType.ADDED, cluster.add(f"p{i}", 8, "pg"), "1"))
    scheduler = state.assembly.scheduler
    assert [o.kind for o in scheduler.run(now=100.0)] == [OutcomeKind.WAITING]
    await watches.apply(repo, "pod", WatchEvent(EventType.ADDED, cluster.add("p2", 8, "pg"), "2"))
    await watches.apply(repo, "pod", cluster.delete("p2"))  # came and went before it was tried

    outcomes = scheduler.run(now=100_000.0)  # the quorum's wait runs out

    assert outcomes and all(o.kind is not OutcomeKind.PLACED for o in outcomes), outcomes
    assert "ns/pg" in state.assembly.queue, "it goes back to wait for its members"
    assert cluster.evicted == [] and all(
        state.assembly.cache.allocation(f"ns/p{i}") is None for i in range(2)
    )
