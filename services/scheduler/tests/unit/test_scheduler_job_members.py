"""An admitted job's gang is made of the pods its workloads' controllers create (labelled with its
id): the scheduler creates no pod, and places and binds those it finds, all-or-nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from tessera.cluster.builders import gpu_node
from tessera.cluster.conventions.names import JOB_ID_LABEL, JOB_POD_GROUP_LABEL, SCHEDULER_NAME
from tessera.cluster.domain.requirements import GpuRequest, Pod, PodRef, PodRequirements
from tessera.cluster.fake import FakeCluster
from tessera.scheduler.adapters.cluster_side import ClusterSide
from tessera.scheduler.config import SchedulerSettings
from tessera.scheduler.service_layer.engine import SchedulingEngine
from tessera.testing.builders import a_job

FakeUnit = Any  # conftest's FakeSchedulerUnitOfWork
AT = datetime(2026, 11, 25, tzinfo=UTC)


def member(job_id: str, index: int, gpus: int = 4) -> Pod:
    """A pod as the Job controller makes it from admission's template."""
    return Pod(
        "ml",
        f"{job_id}-worker-{index}-x7k2p",
        PodRequirements(cpu_milli=1000, memory_mib=1024, gpu=GpuRequest.whole(gpus)),
        scheduler_name=SCHEDULER_NAME,
        labels={JOB_ID_LABEL: job_id, JOB_POD_GROUP_LABEL: "worker"},
    )


@pytest.fixture
async def world() -> AsyncIterator[tuple[FakeCluster, ClusterSide]]:
    fake = FakeCluster()
    fake.add_node(gpu_node("gpu-0", "A100-80GB", 8))
    side = ClusterSide(fake)
    await side.start(timeout=5)
    yield fake, side
    await side.stop()


async def admit(uow: FakeUnit, job_id: str, replicas: int = 2) -> None:
    async with uow:
        await uow.repo.add_pending(
            job_id, a_job(job_id).group("worker", replicas=replicas, gpus=4).build(), AT
        )
        await uow.commit()


async def settle() -> None:
    for _ in range(5):  # let the fake's watch events reach the cache
        await asyncio.sleep(0)


async def test_the_pods_a_controller_creates_are_bound_as_one_gang(
    uow: FakeUnit, world: tuple[FakeCluster, ClusterSide]
) -> None:
    fake, side = world
    engine = SchedulingEngine(lambda: uow, SchedulerSettings(namespace="ml"), side, clock=AT.timestamp)
    engine.deciding = True
    await admit(uow, "train")
    await engine.cycle()
    assert fake.bindings == [], "no pod exists yet: the scheduler makes none"

    fake.add_pod(member("train", 0))
    await settle()
    await engine.cycle()
    assert fake.bindings == [], "one of two members: the gang waits for its quorum"

    fake.add_pod(member("train", 1))
    await settle()
    await engine.cycle()
    assert sorted((str(ref), node) for ref, node in fake.bindings) == [
        ("ml/train-worker-0-x7k2p", "gpu-0"),
        ("ml/train-worker-1-x7k2p", "gpu-0"),
    ]
    rows = [row for row in uow.stored.placements.values() if row.job_id == "train"]
    assert sorted(row.pod for row in rows) == ["ml/train-worker-0-x7k2p", "ml/train-worker-1-x7k2p"]
    assert {row.pod_group for row in rows} == {"worker"}, "each placement names the pod's group"


async def test_pods_of_a_job_not_admitted_wait(uow: FakeUnit, world: tuple[FakeCluster, ClusterSide]) -> None:
    fake, side = world
    engine = SchedulingEngine(lambda: uow, SchedulerSettings(namespace="ml"), side, clock=AT.timestamp)
    engine.deciding = True
    fake.add_pod(member("early", 0))
    fake.add_pod(member("early", 1))
    await settle()
    await engine.cycle()
    assert fake.bindings == []
    await admit(uow, "early")  # admitted after its pods appeared: the rebuild or the sync finds them
    await engine.cycle()
    assert {ref for ref, _ in fake.bindings} == {
        PodRef("ml", "early-worker-0-x7k2p"),
        PodRef("ml", "early-worker-1-x7k2p"),
    }
