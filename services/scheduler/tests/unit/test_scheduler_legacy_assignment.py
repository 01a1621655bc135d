"""A pod an earlier version of the scheduler bound, whose ``tessera.io/gpu-assignment`` names its node
but no ``pod_uid`` (the format before the uid was written), is still one of ours.

During a rolling upgrade the old leader may stop between a Binding and the commit recording it: the
pod is bound with the old annotation and recorded nowhere. When a missing uid counted as a copy, the
rebuild held such a pod as someone else's, the watches dropped it from its gang (which then waited
below its quorum for ever while the pod kept its GPUs), and one of no live gang was never evicted.
A uid that differs from the pod's is still a copy (test_scheduler_copied_assignment)."""

from __future__ import annotations

import dataclasses

from tessera.cluster.conventions.names import JOB_ID_LABEL
from tessera.cluster.domain.allocation import DeviceAssignment, GpuShare
from tessera.cluster.domain.requirements import PodGroup
from tessera.cluster.port import EventType, WatchEvent
from tessera.scheduler.service_layer.bound_pods import our_bind

from .test_scheduler_copied_assignment import UUIDS, adopted_and_held, by_hand
from .test_scheduler_deleted_members import Repo
from .test_scheduler_own_binds import Cluster, world

# what a bind of the earlier version wrote on a pod it placed on gpu-1: no uid
LEGACY = DeviceAssignment("gpu-1", tuple(GpuShare(uuid, 1000) for uuid in UUIDS))


def test_an_annotation_without_a_uid_is_ours_where_it_names_the_pod_s_node() -> None:
    assert our_bind(by_hand("p1", LEGACY))
    assert not our_bind(by_hand("p1", dataclasses.replace(LEGACY, node="gpu-0"))), "another node"
    assert not our_bind(by_hand("p1", dataclasses.replace(LEGACY, pod_uid="src-1"))), "a copy"


async def test_a_member_an_earlier_version_bound_stays_in_its_gang() -> None:
    cluster, repo = Cluster(), Repo()
    cluster.groups["ns/pg"] = PodGroup("ns", "pg", 2)
    state, watches = world(cluster, nodes=2)
    await watches.apply(repo, "pod", cluster.add("p0", 8, "pg"))
    await watches.apply(repo, "pod", cluster.add("p1", 8, "pg"))
    bound = by_hand("p1", LEGACY, pod_group="pg")
    cluster.pods["ns/p1"] = bound

    await watches.apply(repo, "pod", WatchEvent(EventType.MODIFIED, bound, "2"))

    held = state.assembly.cache.allocation("ns/p1")
    assert held is not None and held.gang == "ns/pg", "held in its gang's name, not as someone else's"
    assert sorted(m.name for m in state.assembly.registry.spec("ns/pg").members) == ["ns/p0", "ns/p1"]
    assert "ns/p1" in state.assembly.registry.bound("ns/pg"), "a placed member toward the quorum"
    assert cluster.evicted == []


async def test_a_pod_of_no_gang_an_earlier_version_bound_is_evicted() -> None:
    cluster, repo = Cluster(), Repo()
    state, watches = world(cluster, nodes=2)
    pod = by_hand("w0", LEGACY, labels={JOB_ID_LABEL: "job-gone"})
    cluster.pods["ns/w0"] = pod

    await watches.apply(repo, "pod", WatchEvent(EventType.MODIFIED, pod, "2"))

    assert cluster.evicted == ["ns/w0"], "an orphan of ours"
    held = state.assembly.cache.allocation("ns/w0")
    assert held is not None and held.gpu_indices == tuple(range(8)), "it holds what it uses meanwhile"


async def test_the_rebuild_adopts_a_member_an_earlier_version_bound() -> None:
    adopted, held = await adopted_and_held(
        by_hand("p1", LEGACY, pod_group="pg"),
        by_hand("p2", dataclasses.replace(LEGACY, node="gpu-0"), pod_group="pg"),
    )
    assert adopted == ["ns/p1"], "bound by the earlier version, never recorded"
    assert held == ["p2"], "its annotation names another node: not our bind"
