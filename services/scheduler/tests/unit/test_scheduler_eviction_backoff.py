"""A pod of no live gang whose eviction was refused is asked again after a backoff.

Before, one refusal (a disruption budget, throttling, a 5xx, no answer) marked the pod tried for the
rest of its life, across rebuilds: neither its events nor the rebuilds asked again, and an orphaned
pod held its GPUs for good once a passing error refused its eviction. Now a refused eviction is
asked again once 30 s have passed (doubling at each refusal, up to 5 min), at the pod's next event or
at the next cycle, and not within the backoff, whatever the events."""

from __future__ import annotations

from tessera.cluster.conventions.names import JOB_ID_LABEL
from tessera.cluster.domain.allocation import DeviceAssignment, GpuShare
from tessera.cluster.domain.requirements import GpuRequest, Pod, PodPhase, PodRequirements
from tessera.cluster.port import EventType, WatchEvent
from tessera.scheduler.adapters.kube import Evictions
from tessera.scheduler.domain.snapshot import Allocation
from tessera.scheduler.service_layer.engine_state import EngineState
from tessera.scheduler.service_layer.watches import WatchState

from .test_scheduler_deleted_members import Repo
from .test_scheduler_evicting_pods import Evicting
from .test_scheduler_own_binds import NODES, world


class RefusesOnce(Evicting):
    """A budget that refuses the first eviction of each pod and accepts the next ones."""

    def evict(self, allocation: Allocation) -> None:
        super().evict(allocation)
        self.refuse.discard(allocation.pod)


def orphan(uid: str = "w0-1") -> Pod:
    """A pod bound by our bind on gpu-0 whose job is gone."""
    uuids = [gpu.uuid for gpu in NODES["gpu-0"].gpus]
    return Pod(
        "ns",
        "w0",
        PodRequirements(gpu=GpuRequest.whole(1)),
        uid=uid,
        scheduler_name="tessera",
        labels={JOB_ID_LABEL: "job-gone"},
        node_name="gpu-0",
        phase=PodPhase.RUNNING,
        assignment=DeviceAssignment("gpu-0", (GpuShare(uuids[0], 1000),), uid),
    )


def refusing_world(clock: list[float]) -> tuple[RefusesOnce, Repo, EngineState, WatchState]:
    cluster = RefusesOnce()
    cluster.evictions.clock = lambda: clock[0]
    cluster.refuse = {"ns/w0"}
    state, watches = world(cluster, nodes=1)
    state.evictions = cluster.evictions
    cluster.pods["ns/w0"] = orphan()
    return cluster, Repo(), state, watches


async def test_a_refused_eviction_is_asked_again_at_an_event_after_the_backoff_not_within_it() -> None:
    clock = [1000.0]
    cluster, repo, state, watches = refusing_world(clock)
    state.assembly.cache.remove_node("gpu-0")  # nothing held: each event of the pod lets it go
    pod = cluster.pods["ns/w0"]

    async def event(version: int) -> None:
        await watches.apply(repo, "pod", WatchEvent(EventType.MODIFIED, pod, str(version)))

    await event(1)
    assert cluster.evicted == ["ns/w0"], "asked, refused"
    for version, at in enumerate((1005.0, 1020.0, 1029.9), start=2):  # within the backoff
        clock[0] = at
        await event(version)
    assert cluster.evicted == ["ns/w0"], "not asked again at each event within the backoff"

    clock[0] = 1030.0
    await event(5)
    assert cluster.evicted == ["ns/w0", "ns/w0"], "asked again after the backoff: accepted"
    clock[0] = 2000.0
    await event(6)
    assert cluster.evicted == ["ns/w0", "ns/w0"], "accepted: pending until it is seen going"


async def test_a_held_pod_whose_eviction_was_refused_is_asked_again_by_the_cycle() -> None:
    clock = [1000.0]
    cluster, repo, state, watches = refusing_world(clock)
    pod = cluster.pods["ns/w0"]
    await watches.apply(repo, "pod", WatchEvent(EventType.MODIFIED, pod, "1"))
    held = state.assembly.cache.allocation("ns/w0")
    assert held is not None and cluster.evicted == ["ns/w0"], "held for no gang, asked, refused"

    clock[0] = 1029.0
    watches.retry_evictions()
    await watches.apply(repo, "pod", WatchEvent(EventType.MODIFIED, pod, "2"))
    assert cluster.evicted == ["ns/w0"], "not within the backoff"

    clock[0] = 1031.0
    watches.retry_evictions()  # no event of the pod would ask: it is held
    assert cluster.evicted == ["ns/w0", "ns/w0"], "asked again after the backoff"
    watches.retry_evictions()
    assert cluster.evicted == ["ns/w0", "ns/w0"], "pending: not asked again"


async def test_a_refused_pod_whose_node_left_is_checked_every_five_minutes_not_at_every_cycle() -> None:
    """Before 4125e6b, its node gone, the pod stayed due: each cycle found nothing to evict it on
    and left it there, to be checked again at the next, for ever. Then it was forgotten for good:
    its node registered again while it still ran, and with no event of the pod's, nothing evicted
    it. It is now kept, checked again after the longest backoff, until the pod is gone."""
    clock = [1000.0]
    cluster, repo, state, watches = refusing_world(clock)
    pod = cluster.pods["ns/w0"]
    await watches.apply(repo, "pod", WatchEvent(EventType.MODIFIED, pod, "1"))
    assert cluster.evicted == ["ns/w0"], "asked, refused"
    await watches.apply(repo, "node", WatchEvent(EventType.DELETED, NODES["gpu-0"], "2"))
    assert state.assembly.cache.allocation("ns/w0") is None, "its node is gone: nothing held"

    clock[0] = 1031.0  # past the backoff
    watches.retry_evictions()
    assert cluster.evictions.due() == [], "not checked again at the next cycles"
    assert cluster.evicted == ["ns/w0"], "no eviction asked on a node that is gone"
    clock[0] = 1200.0
    watches.retry_evictions()
    await watches.apply(repo, "node", WatchEvent(EventType.ADDED, NODES["gpu-0"], "3"))
    assert cluster.evicted == ["ns/w0"]

    clock[0] = 1031.0 + 300.0  # the longest backoff after the check that found its node gone
    watches.retry_evictions()  # no event of the pod's since
    assert cluster.evicted == ["ns/w0", "ns/w0"], "its node back: evicted by the check"
    held = state.assembly.cache.allocation("ns/w0")
    assert held is not None and held.gpu_indices == (0,), "it holds what it uses meanwhile"


async def test_a_refused_pod_whose_node_left_is_forgotten_once_it_is_gone() -> None:
    clock = [1000.0]
    cluster, repo, _state, watches = refusing_world(clock)
    pod = cluster.pods["ns/w0"]
    await watches.apply(repo, "pod", WatchEvent(EventType.MODIFIED, pod, "1"))
    await watches.apply(repo, "node", WatchEvent(EventType.DELETED, NODES["gpu-0"], "2"))
    clock[0] = 1031.0
    watches.retry_evictions()

    del cluster.pods["ns/w0"]  # gone with its node; the watch said nothing of it
    clock[0] = 1031.0 + 300.0
    watches.retry_evictions()
    assert cluster.evictions.due() == [] and not cluster.evictions.tried(pod), "forgotten"
    assert cluster.evicted == ["ns/w0"]


def test_the_backoff_doubles_at_each_refusal_up_to_five_minutes() -> None:
    clock = [0.0]
    evictions = Evictions(lambda key: "u1", clock=lambda: clock[0])
    pod = orphan(uid="u1")
    waits: list[float] = []
    for _ in range(6):
        evictions.refused(evictions.asked("ns/w0"))
        start = clock[0]
        while evictions.tried(pod) and clock[0] - start < 1000.0:
            clock[0] += 1.0
        assert evictions.due() == [("ns/w0", "u1")]
        waits.append(clock[0] - start)
    assert waits == [30.0, 60.0, 120.0, 240.0, 300.0, 300.0]
    evictions.gone(pod)
    assert not evictions.tried(pod) and evictions.due() == []
