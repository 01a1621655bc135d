"""The binding port on the `Cluster` port, against the in-memory FakeCluster."""

from __future__ import annotations

import asyncio

import pytest

from tessera.cluster.domain.requirements import Pod, PodRef
from tessera.cluster.fake import FakeCluster
from tessera.scheduler.adapters.kube import ClusterBinder, Evictions
from tessera.scheduler.domain.plugins.reserve import BindError
from tessera.scheduler.domain.snapshot import Allocation

UUIDS = {"n1": {0: "GPU-a", 1: "GPU-b"}}


def allocation(pod: str = "default/p0", node: str = "n1") -> Allocation:
    return Allocation(pod, "g", node, ((0, 1000), (1, 500)), 1000, 1024)


def binder(cluster: FakeCluster) -> ClusterBinder:
    return ClusterBinder(cluster, asyncio.get_running_loop(), lambda node: UUIDS.get(node, {}), timeout_s=5)


async def test_a_bind_sets_the_node_and_the_gpu_assignment_by_uuid() -> None:
    cluster = FakeCluster()
    cluster.add_pod(Pod("default", "p0"))
    await asyncio.to_thread(binder(cluster).bind, allocation())

    pod = await cluster.get_pod(PodRef("default", "p0"))
    assert pod.node_name == "n1"
    assert pod.assignment is not None
    assert [(share.gpu_uuid, share.milli) for share in pod.assignment.shares] == [
        ("GPU-a", 1000),
        ("GPU-b", 500),
    ]


@pytest.mark.parametrize(("bound_to", "fails"), [("n1", False), ("n2", True)])
async def test_a_pod_already_bound_is_fine_only_where_we_put_it(bound_to: str, fails: bool) -> None:
    cluster = FakeCluster()
    cluster.add_pod(Pod("default", "p0", node_name=bound_to))
    call = asyncio.to_thread(binder(cluster).bind, allocation())
    if fails:
        with pytest.raises(BindError, match="already assigned"):
            await call
    else:
        await call


async def test_a_missing_pod_fails_the_bind_naming_it() -> None:
    with pytest.raises(BindError, match="default/gone to n1"):
        await asyncio.to_thread(binder(FakeCluster()).bind, allocation("default/gone"))


async def test_evictions_from_the_event_loop_run_in_the_background_and_settle() -> None:
    cluster = FakeCluster()
    cluster.add_pod(Pod("default", "p0", node_name="n1"))
    port = binder(cluster)
    port.evict(allocation())  # on the loop: must not block it
    port.evict(allocation("default/never-existed"))
    await port.settle()
    assert cluster.evictions == [PodRef("default", "p0")]


async def test_a_bind_on_the_event_loop_is_refused_rather_than_deadlocking() -> None:
    cluster = FakeCluster()
    cluster.add_pod(Pod("default", "p0"))
    with pytest.raises(BindError, match="scheduling thread"):
        binder(cluster).bind(allocation())


async def test_a_pod_made_again_under_its_name_is_not_bound_with_the_uid_of_the_one_before() -> None:
    """The watches still show the pod before (uid p0-1); the pod now of that name is another (p0-2,
    made again by its controller): the Binding names the uid it was written for, is refused, and
    the bind fails as any failed bind does, leaving the new pod unbound and unannotated."""
    cluster = FakeCluster()
    cluster.add_pod(Pod("default", "p0", uid="p0-2"))
    port = ClusterBinder(
        cluster,
        asyncio.get_running_loop(),
        lambda node: UUIDS.get(node, {}),
        timeout_s=5,
        evictions=Evictions(uid_of=lambda _: "p0-1"),
    )
    with pytest.raises(BindError, match="Precondition failed"):
        await asyncio.to_thread(port.bind, allocation())
    pod = await cluster.get_pod(PodRef("default", "p0"))
    assert pod.node_name is None and pod.assignment is None
    assert cluster.evictions == [], "nothing was bound: nothing to undo"

    port.evictions = Evictions(uid_of=lambda _: "p0-2")  # the watches caught up
    await asyncio.to_thread(port.bind, allocation())
    pod = await cluster.get_pod(PodRef("default", "p0"))
    assert pod.node_name == "n1" and pod.assignment is not None and pod.assignment.pod_uid == "p0-2"
