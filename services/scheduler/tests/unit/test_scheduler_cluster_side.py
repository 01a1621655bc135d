"""The scheduler's side of the cluster: libs/cluster's cache over every pod, changes tagged by kind,
and the rebuild step that finds bound pods the placements table does not know."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tessera.cluster.builders import gpu_node
from tessera.cluster.conventions.names import SCHEDULER_NAME
from tessera.cluster.domain.allocation import DeviceAssignment, GpuShare
from tessera.cluster.domain.requirements import Pod, PodGroup, PodPhase, PodRequirements
from tessera.cluster.fake import FakeCluster
from tessera.cluster.port import WatchEvent
from tessera.scheduler.adapters.cluster_side import ClusterSide
from tessera.scheduler.adapters.kube import JOB_ID_LABEL
from tessera.scheduler.domain.framework.cluster_view import node_info
from tessera.scheduler.service_layer.outcomes import GangInfo
from tessera.scheduler.service_layer.rebuild import adopt_cluster_pods

NODE = gpu_node("gpu-0", "A100-80GB", 2)


def held(
    name: str, scheduler: str = SCHEDULER_NAME, phase: PodPhase = PodPhase.RUNNING, **fields: Any
) -> Pod:
    """A pod bound to gpu-0 holding its first GPU whole."""
    assignment = DeviceAssignment("gpu-0", (GpuShare(NODE.gpus[0].uuid, 1000),))
    return Pod(
        "default",
        name,
        PodRequirements(cpu_milli=1_000, memory_mib=1024),
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

    adopted, foreign = adopt_cluster_pods(cluster, nodes, uuids, gangs, recorded={"default/train-1"})

    assert [(a.pod, a.gang, a.gpu_milli) for a in adopted] == [("default/train-0", "job-1", ((0, 1000),))]
    assert [(a.pod, a.gang) for a in foreign] == [("default/other", "foreign:default/other")]
    unknown_node, _ = adopt_cluster_pods(cluster, {}, uuids, gangs, recorded=set())
    assert unknown_node == []
