"""The scheduler's side of the cluster: libs/cluster's cache over every pod, changes tagged by kind,
and the rebuild step that finds bound pods the placements table does not know."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tessera.cluster.builders import gpu_node
from tessera.cluster.cache import pod_key
from tessera.cluster.conventions.names import SCHEDULER_NAME
from tessera.cluster.domain.allocation import DeviceAssignment, GpuShare
from tessera.cluster.domain.requirements import GpuRequest, Pod, PodGroup, PodPhase, PodRequirements
from tessera.cluster.fake import FakeCluster
from tessera.cluster.port import WatchEvent
from tessera.scheduler.adapters.cluster_side import ClusterSide
from tessera.scheduler.adapters.kube import JOB_ID_LABEL
from tessera.scheduler.domain.cache import SchedulerCache
from tessera.scheduler.domain.framework.cluster_view import node_info
from tessera.scheduler.domain.framework.pod import PodSpec
from tessera.scheduler.domain.gang.spec import GangSpec
from tessera.scheduler.domain.snapshot import Allocation
from tessera.scheduler.service_layer.outcomes import GangInfo
from tessera.scheduler.service_layer.rebuild import adopt_cluster_pods, without_members
from tessera.scheduler.service_layer.watches import hold_bound_pod
from tessera.testing.builders import a_job

NODE = gpu_node("gpu-0", "A100-80GB", 2)
JOBS = "default"  # where admission makes submitted jobs' workloads


def held(
    name: str, scheduler: str = SCHEDULER_NAME, phase: PodPhase = PodPhase.RUNNING, **fields: Any
) -> Pod:
    """A pod bound to gpu-0 holding its first GPU whole (as our bind writes it, naming its uid)."""
    uid = str(fields.pop("uid", f"{name}-1"))
    assignment = DeviceAssignment("gpu-0", (GpuShare(NODE.gpus[0].uuid, 1000),), uid)
    return Pod(
        "default",
        name,
        PodRequirements(cpu_milli=1_000, memory_mib=1024),
        uid=uid,
        scheduler_name=scheduler,
        node_name="gpu-0",
        phase=phase,
        assignment=assignment,
        **fields,
    )


World = tuple[FakeCluster, ClusterSide]


@pytest.fixture
async def side() -> AsyncIterator[World]:
    fake = FakeCluster()
    fake.add_node(NODE)
    fake.add_pod_group(PodGroup("default", "ring", 2))
    fake.add_pod(Pod("default", "waiting", scheduler_name=SCHEDULER_NAME, pod_group="ring"))
    fake.add_pod(held("other", scheduler="default-scheduler"))
    fake.add_pod(held("done", phase=PodPhase.SUCCEEDED))
    side = ClusterSide(fake)
    yield fake, side
    await side.stop()


async def test_every_pod_of_any_scheduler_and_phase_is_cached_and_changes_come_tagged(side: World) -> None:
    _, cluster = side
    seen: list[tuple[str, str]] = []
    cluster.subscribe(lambda kind, event: seen.append((kind, event.type.value)))
    await cluster.start(timeout=5)

    assert sorted(cluster.cache.pods.store) == ["default/done", "default/other", "default/waiting"]
    assert list(cluster.cache.nodes.store) == ["gpu-0"] and list(cluster.cache.pod_groups.store) == [
        "default/ring"
    ]
    assert sorted(seen) == [
        ("node", "ADDED"),
        ("pod", "ADDED"),
        ("pod", "ADDED"),
        ("pod", "ADDED"),
        ("podgroup", "ADDED"),
    ]


async def test_starting_again_after_a_timeout_keeps_one_set_of_watches(side: World) -> None:
    fake, cluster = side
    events: list[WatchEvent[Any]] = []
    cluster.subscribe(lambda kind, event: events.append(event) if kind == "pod" else None)
    with pytest.raises(TimeoutError):
        await cluster.start(timeout=0)
    await cluster.start(timeout=5)
    events.clear()

    fake.add_pod(Pod("default", "late", scheduler_name=SCHEDULER_NAME))
    await cluster.cache.pods.wait_for(lambda store: "default/late" in store, timeout=5)

    assert [event.object.name for event in events] == ["late"], "one watch, one event"


async def test_the_rebuild_adopts_our_unrecorded_bound_pods_and_counts_foreign_ones(side: World) -> None:
    fake, cluster = side
    fake.add_pod(held("train-0", labels={JOB_ID_LABEL: "job-1"}))
    fake.add_pod(held("train-1", labels={JOB_ID_LABEL: "job-1"}))
    fake.add_pod(held("stranger", labels={JOB_ID_LABEL: "job-unknown"}))
    await cluster.start(timeout=5)
    nodes = {"gpu-0": node_info(NODE)}
    uuids = {"gpu-0": {gpu.index: gpu.uuid for gpu in NODE.gpus}}
    gangs = {"job-1": GangInfo("job-1", "job")}

    specs = {"job-1": a_job("j").tenant("team-b").group("pods", replicas=2, gpus=1).build()}

    adopted, held_pods, _ = adopt_cluster_pods(cluster, nodes, uuids, gangs, {"default/train-1"}, specs, JOBS)

    assert [(a.pod, a.gang, a.gpu_milli) for a in adopted] == [("default/train-0", "job-1", ((0, 1000),))]
    # the stranger is ours but of no gang being rebuilt: someone else bound it, so it holds its GPU
    assert sorted(pod_key(pod) for pod in held_pods) == ["default/other", "default/stranger"]
    unknown_node, none_held, _ = adopt_cluster_pods(cluster, {}, uuids, gangs, set(), specs, JOBS)
    assert unknown_node == [] and none_held == []


async def test_the_rebuild_holds_pods_of_ours_bound_by_hand_and_leaves_them_out_of_their_gangs(
    side: World,
) -> None:
    """Before, a pod of ours bound by someone else was adopted only as a member with an assignment:
    without one, or of no gang, it held nothing, and as a member it stayed pending, to be bound
    again."""
    fake, cluster = side
    whole = GpuRequest.whole(1)
    by_hand = Pod(
        "default",
        "by-hand",
        PodRequirements(cpu_milli=2_000, gpu=whole),
        scheduler_name=SCHEDULER_NAME,
        node_name="gpu-0",
        phase=PodPhase.RUNNING,
        pod_group="ring",
    )
    fake.add_pod(by_hand)
    await cluster.start(timeout=5)
    nodes = {"gpu-0": node_info(NODE)}
    uuids = {"gpu-0": {gpu.index: gpu.uuid for gpu in NODE.gpus}}
    gangs = {"default/ring": GangInfo("default/ring", "podgroup")}

    adopted, held_pods, _ = adopt_cluster_pods(cluster, nodes, uuids, gangs, set(), {}, JOBS)

    assert adopted == [] and [pod_key(pod) for pod in held_pods] == ["default/other", "default/by-hand"]
    cache = SchedulerCache.rebuild(nodes.values())
    for pod in held_pods:
        hold_bound_pod(cache, pod, uuids["gpu-0"])
    # other holds GPU 0 by its assignment; by-hand, with none written, the GPU its request takes
    assert [cache.allocation(key) for key in ("default/other", "default/by-hand")] == [
        Allocation("default/other", "foreign:default/other", "gpu-0", ((0, 1000),), 1_000, 1024),
        Allocation("default/by-hand", "foreign:default/by-hand", "gpu-0", ((1, 1000),), 2_000),
    ]
    ring = GangSpec(
        "default/ring",
        (PodSpec("default/waiting", "default/ring"), PodSpec("default/by-hand", "default/ring")),
        2,
    )
    lone = GangSpec("default/by-hand", (PodSpec("default/by-hand", "default/by-hand"),), 1)
    kept = without_members([ring, lone], {pod_key(pod) for pod in held_pods})
    assert [(g.name, [m.name for m in g.members]) for g in kept] == [("default/ring", ["default/waiting"])]


async def test_the_rebuild_adopts_a_job_s_pod_only_from_the_job_s_namespaces(side: World) -> None:
    """Before, any bound pod of ours that carried a pending job's id was adopted as its member,
    whatever its namespace (the label proves nothing); on the watches such a pod is no member."""
    fake, cluster = side
    labels = {JOB_ID_LABEL: "job-1"}
    fake.add_pod(held("in-jobs", labels=labels))
    fake.add_pod(dataclasses.replace(held("in-tenant", labels=labels), namespace="team-b"))
    fake.add_pod(dataclasses.replace(held("intruder", labels=labels), namespace="team-a"))
    await cluster.start(timeout=5)
    nodes = {"gpu-0": node_info(NODE)}
    uuids = {"gpu-0": {gpu.index: gpu.uuid for gpu in NODE.gpus}}
    gangs = {"job-1": GangInfo("job-1", "job")}
    specs = {"job-1": a_job("j").tenant("team-b").group("pods", replicas=2, gpus=1).build()}

    adopted, held_pods, _ = adopt_cluster_pods(cluster, nodes, uuids, gangs, set(), specs, JOBS)

    assert sorted(a.pod for a in adopted) == ["default/in-jobs", "team-b/in-tenant"]
    assert sorted(pod_key(pod) for pod in held_pods) == ["default/other", "team-a/intruder"], (
        "no member: it holds its GPU as someone else's pod"
    )
    no_spec, _, _ = adopt_cluster_pods(cluster, nodes, uuids, gangs, set(), {}, JOBS)
    assert no_spec == [], "a job's membership is known from its pending spec alone"
