"""A pod with ``schedulerName: tessera`` that someone else bound (by hand, or made with its
``nodeName`` set) holds what it uses, and leaves its gang.

Before, the pod watch counted only pods of other schedulers: such a pod of ours held nothing in the
cache, so the scheduler placed other pods on its GPUs; and a pod bound while it waited in the queue
stayed there, to be bound a second time."""

from __future__ import annotations

import dataclasses

from tessera.cluster.builders import gpu_node
from tessera.cluster.conventions.names import JOB_ID_LABEL, SCHEDULER_NAME
from tessera.cluster.domain.allocation import DeviceAssignment, GpuShare
from tessera.cluster.domain.requirements import GpuRequest, Pod, PodGroup, PodPhase, PodRequirements
from tessera.cluster.port import EventType, WatchEvent
from tessera.scheduler.domain.gang.scheduler import OutcomeKind
from tessera.scheduler.service_layer.outcomes import GangInfo
from tessera.scheduler.service_layer.repository_port import JOB
from tessera.testing.builders import a_job

from .test_scheduler_deleted_members import Cluster, Repo, world


def by_hand(cluster: Cluster, name: str, gpus: int, **fields: object) -> WatchEvent[Pod]:
    """A running pod of ours that someone bound to gpu-0 themselves."""
    pod = Pod(
        "ns",
        name,
        PodRequirements(cpu_milli=1_000, gpu=GpuRequest.whole(gpus)),
        scheduler_name=SCHEDULER_NAME,
        node_name="gpu-0",
        phase=PodPhase.RUNNING,
        **fields,  # type: ignore[arg-type]
    )
    cluster.pods[f"ns/{name}"] = pod
    return WatchEvent(EventType.ADDED, pod, "1")


async def test_a_pod_of_ours_bound_by_hand_holds_its_gpus() -> None:
    cluster, repo = Cluster(), Repo()
    state, watches = world(cluster, nodes=1)  # gpu-0 with 8 GPUs
    await watches.apply(repo, "pod", by_hand(cluster, "by-hand", 6))

    held = state.assembly.cache.allocation("ns/by-hand")
    assert held is not None and (held.gang, len(held.gpu_milli), held.cpu_milli) == (
        "foreign:ns/by-hand",
        6,
        1_000,
    )
    assert "ns/by-hand" not in state.assembly.queue and repo.pending == set(), "nothing to place"
    await watches.apply(repo, "pod", WatchEvent(EventType.ADDED, cluster.add("next", 4), "2"))
    (outcome,) = state.assembly.scheduler.run(now=100.0)
    assert outcome.kind is OutcomeKind.UNSCHEDULABLE, "2 GPUs are free, not 4"
    assert cluster.bound == []

    ended = dataclasses.replace(cluster.pods["ns/by-hand"], phase=PodPhase.SUCCEEDED)
    await watches.apply(repo, "pod", WatchEvent(EventType.MODIFIED, ended, "3"))
    assert state.assembly.cache.allocation("ns/by-hand") is None
    (placed,) = state.assembly.scheduler.run(now=10_000.0)
    assert placed.kind is OutcomeKind.PLACED, "its GPUs are free once it ends"


async def test_the_gpus_its_assignment_names_are_those_it_holds() -> None:
    cluster, repo = Cluster(), Repo()
    state, watches = world(cluster, nodes=1)
    node = gpu_node("gpu-0", "A100-80GB", 8)
    state.uuids["gpu-0"] = {gpu.index: gpu.uuid for gpu in node.gpus}
    assignment = DeviceAssignment("gpu-0", tuple(GpuShare(gpu.uuid, 1000) for gpu in node.gpus[6:]))
    await watches.apply(repo, "pod", by_hand(cluster, "by-hand", 2, assignment=assignment))

    held = state.assembly.cache.allocation("ns/by-hand")
    assert held is not None and held.gpu_indices == (6, 7)
    await watches.apply(repo, "pod", WatchEvent(EventType.ADDED, cluster.add("next", 6), "2"))
    (outcome,) = state.assembly.scheduler.run(now=100.0)
    assert outcome.kind is OutcomeKind.PLACED
    assert [a.gpu_indices for a in cluster.bound] == [(0, 1, 2, 3, 4, 5)]


async def test_a_waiting_pod_bound_by_hand_leaves_the_queue_and_is_not_bound_again() -> None:
    cluster, repo = Cluster(), Repo()
    state, watches = world(cluster, nodes=1)
    await watches.apply(repo, "pod", WatchEvent(EventType.ADDED, cluster.add("solo", 4), "1"))
    assert "ns/solo" in state.assembly.queue and repo.pending == {"ns/solo"}

    bound = dataclasses.replace(cluster.pods["ns/solo"], node_name="gpu-0", phase=PodPhase.RUNNING)
    cluster.pods["ns/solo"] = bound
    await watches.apply(repo, "pod", WatchEvent(EventType.MODIFIED, bound, "2"))

    assert "ns/solo" not in state.assembly.queue and repo.pending == set()
    held = state.assembly.cache.allocation("ns/solo")
    assert held is not None and (held.gang, len(held.gpu_milli)) == ("foreign:ns/solo", 4)
    assert state.assembly.scheduler.run(now=10_000.0) == [] and cluster.bound == []


async def test_a_member_bound_by_hand_leaves_its_gang() -> None:
    cluster, repo = Cluster(), Repo()
    cluster.groups["ns/pg"] = PodGroup("ns", "pg", 2)
    state, watches = world(cluster, nodes=1)
    for name in ("p0", "p1"):
        await watches.apply(repo, "pod", WatchEvent(EventType.ADDED, cluster.add(name, 4, "pg"), "1"))
    assert {m.name for m in state.assembly.registry.spec("ns/pg").members} == {"ns/p0", "ns/p1"}

    await watches.apply(repo, "pod", by_hand(cluster, "p1", 4, pod_group="pg"))

    assert [m.name for m in state.assembly.registry.spec("ns/pg").members] == ["ns/p0"]
    outcomes = state.assembly.scheduler.run(now=100.0)
    assert [o.kind for o in outcomes] == [OutcomeKind.WAITING], "p0 waits for a second member"
    assert cluster.bound == []


async def test_a_job_s_member_bound_by_hand_leaves_the_job_s_gang() -> None:
    cluster, repo = Cluster(), Repo()
    state, watches = world(cluster, nodes=1)
    job = "job-1"
    state.gangs[job] = GangInfo(job, JOB)
    state.specs[job] = a_job("j").tenant("ns").group("pods", replicas=2, gpus=2).build()
    labels = {JOB_ID_LABEL: job}
    for name in ("w0", "w1"):
        pod = dataclasses.replace(cluster.add(name, 2), labels=labels)
        cluster.pods[f"ns/{name}"] = pod
        await watches.apply(repo, "pod", WatchEvent(EventType.ADDED, pod, "1"))
    assert len(state.assembly.registry.spec(job).members) == 2

    await watches.apply(repo, "pod", by_hand(cluster, "w1", 2, labels=labels))

    assert [m.name for m in state.assembly.registry.spec(job).members] == ["ns/w0"]
    held = state.assembly.cache.allocation("ns/w1")
    assert held is not None and held.gang == "foreign:ns/w1"
