"""A pod bound by hand with a copy of the ``tessera.io/gpu-assignment`` annotation of one of our
binds is not taken for one of ours: our bind writes the pod's uid into the annotation, and a copy
names another pod's uid. (An annotation with no uid is the earlier format, still ours when it names
the pod's node: test_scheduler_legacy_assignment.)

Before, the annotation naming the pod's node was the whole mark: a user who copied it onto a pod
of theirs and bound the pod by hand had it adopted by its gang as a placed member (the rebuild did
the same), or, with no live gang, evicted as an orphan of ours."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tessera.cluster.builders import gpu_node
from tessera.cluster.conventions import GPU_ASSIGNMENT_ANNOTATION, decode_assignment, encode_assignment
from tessera.cluster.conventions.names import JOB_ID_LABEL
from tessera.cluster.domain.allocation import DeviceAssignment, GpuShare
from tessera.cluster.domain.requirements import GpuRequest, Pod, PodGroup, PodPhase, PodRef, PodRequirements
from tessera.cluster.fake import FakeCluster
from tessera.cluster.port import EventType, WatchEvent
from tessera.scheduler.adapters.cluster_side import ClusterSide
from tessera.scheduler.config import SchedulerSettings
from tessera.scheduler.domain.framework.cluster_view import node_info
from tessera.scheduler.domain.gang.scheduler import OutcomeKind
from tessera.scheduler.service_layer.bound_pods import our_bind
from tessera.scheduler.service_layer.engine import SchedulingEngine
from tessera.scheduler.service_layer.outcomes import GangInfo
from tessera.scheduler.service_layer.rebuild import adopt_cluster_pods
from tessera.scheduler.service_layer.repository_port import PODGROUP
from tessera.testing.builders import a_job

from .test_scheduler_deleted_members import Repo
from .test_scheduler_own_binds import AT, NODES, Cluster, settle, world

UUIDS = [gpu.uuid for gpu in NODES["gpu-1"].gpus]
# what our bind wrote on ns/src, a pod it placed on gpu-1
OURS = DeviceAssignment("gpu-1", tuple(GpuShare(uuid, 1000) for uuid in UUIDS), "src-1")


def by_hand(name: str, copied: DeviceAssignment, **fields: Any) -> Pod:
    """A pod of ours a user bound to gpu-1 themselves, with a copy of an annotation on it."""
    return Pod(
        "ns",
        name,
        PodRequirements(gpu=GpuRequest.whole(8)),
        uid=f"{name}-1",
        scheduler_name="tessera",
        node_name="gpu-1",
        phase=PodPhase.RUNNING,
        annotations={GPU_ASSIGNMENT_ANNOTATION: encode_assignment(copied)},
        assignment=copied,
        **fields,
    )


async def test_a_member_bound_by_hand_with_a_copied_assignment_leaves_its_gang() -> None:
    cluster, repo = Cluster(), Repo()
    cluster.groups["ns/pg"] = PodGroup("ns", "pg", 2)
    state, watches = world(cluster, nodes=2)
    await watches.apply(repo, "pod", cluster.add("p0", 8, "pg"))
    await watches.apply(repo, "pod", cluster.add("p1", 8, "pg"))
    bound = by_hand("p1", OURS, pod_group="pg")
    cluster.pods["ns/p1"] = bound

    await watches.apply(repo, "pod", WatchEvent(EventType.MODIFIED, bound, "2"))

    assert not our_bind(bound)
    held = state.assembly.cache.allocation("ns/p1")
    assert held is not None and held.gang == "foreign:ns/p1", "held as bound by someone else"
    assert [m.name for m in state.assembly.registry.spec("ns/pg").members] == ["ns/p0"]
    assert "ns/p1" not in state.assembly.registry.bound("ns/pg"), "no placed member of its gang"
    assert cluster.evicted == []


async def test_a_pod_of_no_gang_bound_by_hand_with_a_copied_assignment_is_not_evicted() -> None:
    cluster, repo = Cluster(), Repo()
    state, watches = world(cluster, nodes=2)
    pod = by_hand("w0", OURS, labels={JOB_ID_LABEL: "job-gone"})
    cluster.pods["ns/w0"] = pod

    await watches.apply(repo, "pod", WatchEvent(EventType.ADDED, pod, "1"))
    await watches.apply(repo, "pod", WatchEvent(EventType.MODIFIED, pod, "2"))
    watches.let_go_held()
    watches.retry_evictions()

    held = state.assembly.cache.allocation("ns/w0")
    assert held is not None and held.gang == "foreign:ns/w0", "it holds what it uses"
    assert cluster.evicted == [], "not evicted as an orphan of ours"


async def adopted_and_held(*pods: Pod) -> tuple[list[str], list[str]]:
    """What the rebuild makes of ``pods`` (members of the PodGroup ns/pg) on the test's nodes: the pods
    it adopts as our binds, and those it holds as someone else's."""
    fake = FakeCluster()
    for node in NODES.values():
        fake.add_node(node)
    for pod in pods:
        fake.add_pod(pod)
    side = ClusterSide(fake)
    await side.start(timeout=5)
    try:
        nodes = {name: node_info(node) for name, node in NODES.items()}
        uuids = {name: {gpu.index: gpu.uuid for gpu in node.gpus} for name, node in NODES.items()}
        gangs = {"ns/pg": GangInfo("ns/pg", PODGROUP)}
        adopted, held, _ = adopt_cluster_pods(side, nodes, uuids, gangs, set(), {}, "ml")
        return [a.pod for a in adopted], [pod.name for pod in held]
    finally:
        await side.stop()


async def test_the_rebuild_does_not_adopt_a_member_with_a_copied_assignment() -> None:
    adopted, held = await adopted_and_held(
        by_hand("p1", OURS, pod_group="pg"),
        by_hand("p2", dataclasses.replace(OURS, pod_uid="p2-1"), pod_group="pg"),
    )
    assert adopted == ["ns/p2"], "p2's annotation names its own uid: our bind"
    assert held == ["p1"], "p1 holds what it uses, as someone else's"


async def test_our_bind_names_the_pod_s_uid_in_the_annotation(uow: Any) -> None:
    fake = FakeCluster()
    fake.add_node(gpu_node("gpu-0", "A100-80GB", 8))
    side = ClusterSide(fake)
    await side.start(timeout=5)
    try:
        engine = SchedulingEngine(lambda: uow, SchedulerSettings(namespace="ml"), side, clock=AT.timestamp)
        engine.deciding = True
        async with uow:
            await uow.repo.add_pending("train", a_job("train").group("w", replicas=1, gpus=2).build(), AT)
            await uow.commit()
        labels = {JOB_ID_LABEL: "train"}
        requirements = PodRequirements(gpu=GpuRequest.whole(2))
        fake.add_pod(Pod("ml", "train-w-0", requirements, uid="u-7", scheduler_name="tessera", labels=labels))
        await settle()

        (placed,) = await engine.cycle()

        assert placed.kind is OutcomeKind.PLACED
        bound = await fake.get_pod(PodRef("ml", "train-w-0"))
        written = decode_assignment(bound.annotations[GPU_ASSIGNMENT_ANNOTATION])
        assert written.pod_uid == "u-7" and written.node == "gpu-0"
        assert our_bind(bound)
        assert not our_bind(dataclasses.replace(bound, uid="u-8")), "a copy on another pod is not ours"
    finally:
        await side.stop()


def test_the_annotation_keeps_the_uid_and_reads_one_written_without_it() -> None:
    assert decode_assignment(encode_assignment(OURS)) == OURS
    legacy = '{"v":1,"node":"gpu-1","gpus":[{"uuid":"GPU-1","milli":1000}]}'
    assert decode_assignment(legacy).pod_uid is None
    with pytest.raises(ValueError, match="pod_uid"):
        decode_assignment('{"v":1,"node":"gpu-1","pod_uid":7,"gpus":[]}')
