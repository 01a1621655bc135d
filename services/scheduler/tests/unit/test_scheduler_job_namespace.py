"""A pod joins an admitted job's gang only from the namespace where the job's pods live.

The job-id label is not proof of membership: any user who may create a pod can write it, and a pod
without `tessera.io/queue` never reaches the admission webhook, so nothing gates it. Submitted jobs'
pods are made in the scheduler's `namespace` (admission's job namespace); a user's own Job, JobSet,
LeaderWorkerSet or Pod that admission adopted has its namespace as the job's tenant. A pod labelled
with the job's id anywhere else is no member: it is not placed, it does not count towards the
quorum, and it is logged once.
"""

from __future__ import annotations

import asyncio
import logging
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
from tessera.scheduler.service_layer.gangs import job_gang_of_pods, job_members, job_namespaces
from tessera.scheduler.service_layer.rebuild import read_pending_gangs
from tessera.testing.builders import a_job

FakeUnit = Any  # conftest's FakeSchedulerUnitOfWork
AT = datetime(2026, 11, 25, tzinfo=UTC)
B_JOB = "4c1f0d2e-b-job"
JOBS = "tessera-jobs"  # where admission makes submitted jobs' workloads


def a_pod(namespace: str, name: str, gpus: int, job_id: str = B_JOB) -> Pod:
    return Pod(
        namespace,
        name,
        PodRequirements(cpu_milli=1000, memory_mib=1024, gpu=GpuRequest.whole(gpus)),
        scheduler_name=SCHEDULER_NAME,
        labels={JOB_ID_LABEL: job_id, JOB_POD_GROUP_LABEL: "pods"},
    )


def team_b_job() -> Any:
    return a_job("b").tenant("team-b").group("pods", replicas=1, gpus=1).build()


def test_a_pod_of_another_namespace_with_the_job_s_label_is_no_member() -> None:
    spec = team_b_job()
    legit = a_pod(JOBS, "b-0", 1)
    # made by a user of team-a: no tessera.io/queue label, so the webhook never gated it
    intruder = a_pod("team-a", "steal", 8)
    members = job_members([legit, intruder], B_JOB, job_namespaces(spec, JOBS))
    assert [PodRef(p.namespace, p.name) for p in members] == [PodRef(JOBS, "b-0")]
    gang = job_gang_of_pods(B_JOB, spec, members, 0.0, None)
    assert [(m.name, m.gpu_count) for m in gang.members] == [(f"{JOBS}/b-0", 1)]


def test_an_adopted_workload_s_pods_are_members_in_the_tenant_s_namespace() -> None:
    spec = team_b_job()  # a labelled Job of namespace team-b: its tenant is its namespace
    own = a_pod("team-b", "b-job-0-x7k2p", 1)
    intruder = a_pod("team-a", "steal", 8)
    members = job_members([own, intruder], B_JOB, job_namespaces(spec, JOBS))
    assert [p.name for p in members] == ["b-job-0-x7k2p"]


@pytest.fixture
async def world() -> AsyncIterator[tuple[FakeCluster, ClusterSide]]:
    fake = FakeCluster()
    fake.add_node(gpu_node("gpu-0", "A100-80GB", 8))
    side = ClusterSide(fake)
    await side.start(timeout=5)
    yield fake, side
    await side.stop()


async def admit(uow: FakeUnit, job_id: str = B_JOB) -> None:
    async with uow:
        await uow.repo.add_pending(job_id, team_b_job(), AT)
        await uow.commit()


async def settle() -> None:
    for _ in range(5):  # let the fake's watch events reach the cache
        await asyncio.sleep(0)


async def test_a_pod_in_another_tenant_s_namespace_cannot_join_an_admitted_gang(
    uow: FakeUnit, world: tuple[FakeCluster, ClusterSide], caplog: pytest.LogCaptureFixture
) -> None:
    """The reviewer's scenario: team-a labels an 8-GPU pod with team-b's job id (admitted for 1)."""
    fake, side = world
    engine = SchedulingEngine(lambda: uow, SchedulerSettings(namespace=JOBS), side, clock=AT.timestamp)
    engine.deciding = True
    await admit(uow)
    await engine.cycle()
    with caplog.at_level(logging.WARNING):
        fake.add_pod(a_pod("team-a", "steal", 8))
        await settle()
        await engine.cycle()
        assert fake.bindings == [], "the intruder alone is no member: team-b's gang still waits"

        fake.add_pod(a_pod(JOBS, "b-0", 1))
        await settle()
        await engine.cycle()
    assert fake.bindings == [(PodRef(JOBS, "b-0"), "gpu-0")], "only the job's own pod is placed"
    rows = [row for row in uow.stored.placements.values() if row.job_id == B_JOB]
    assert [row.pod for row in rows] == [f"{JOBS}/b-0"]
    warned = [r for r in caplog.records if getattr(r, "pod", None) == "team-a/steal"]
    assert len(warned) == 1, "a stranger is logged once, however often its job is looked at"


async def test_the_job_s_real_pods_still_form_the_gang(
    uow: FakeUnit, world: tuple[FakeCluster, ClusterSide]
) -> None:
    fake, side = world
    engine = SchedulingEngine(lambda: uow, SchedulerSettings(namespace=JOBS), side, clock=AT.timestamp)
    engine.deciding = True
    await admit(uow)
    fake.add_pod(a_pod(JOBS, "b-0", 1))
    await settle()
    await engine.cycle()
    assert fake.bindings == [(PodRef(JOBS, "b-0"), "gpu-0")]


async def test_an_adopted_job_s_pods_in_its_tenant_s_namespace_are_placed(
    uow: FakeUnit, world: tuple[FakeCluster, ClusterSide]
) -> None:
    fake, side = world
    engine = SchedulingEngine(lambda: uow, SchedulerSettings(namespace=JOBS), side, clock=AT.timestamp)
    engine.deciding = True
    await admit(uow)
    fake.add_pod(a_pod("team-a", "steal", 8))
    fake.add_pod(a_pod("team-b", "b-job-0-x7k2p", 1))
    await settle()
    await engine.cycle()
    assert fake.bindings == [(PodRef("team-b", "b-job-0-x7k2p"), "gpu-0")]


async def test_the_rebuild_leaves_strangers_out_of_a_pending_job_s_gang(
    uow: FakeUnit, world: tuple[FakeCluster, ClusterSide]
) -> None:
    fake, side = world
    await admit(uow)
    fake.add_pod(a_pod("team-a", "steal", 8))
    fake.add_pod(a_pod(JOBS, "b-0", 1))
    await settle()
    async with uow:
        pending = await read_pending_gangs(uow.repo, SchedulerSettings(namespace=JOBS), side)
    assert [[m.name for m in gang.members] for gang in pending.known] == [[f"{JOBS}/b-0"]]
    assert list(pending.gangs[B_JOB].groups) == [f"{JOBS}/b-0"]
