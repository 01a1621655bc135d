"""`GET /v1/queues/{name}/status` for a queue that several tenants share: a tenant's token lists only
its own tenant's job ids, the counts stay the whole queue's, and the admin lists every job."""

from __future__ import annotations

from typing import Any

from tessera.admission.domain.model import JobState
from tessera.admission.entrypoints.queue_status import queue_status
from tessera.admission.service_layer.cycle import run_cycle
from tessera.admission.service_layer.handlers import submit_job
from tessera.testing.builders import a_job

SHARED = {
    "flavors": [{"name": "a100"}],
    "queues": [{"name": "shared", "quotas": [{"flavor": "a100", "resources": {"gpu": 4}}]}],
    "tenant_queues": [{"tenant": "team-a", "queue": "shared"}, {"tenant": "team-b", "queue": "shared"}],
}


async def submit(uow: Any, job_id: str, tenant: str, gpus: int) -> None:
    spec = a_job(job_id).tenant(tenant).group(gpus=gpus).as_dict()
    async with uow:
        result = await submit_job(spec, uow, job_id)
        await uow.commit()
    assert result.state is JobState.QUEUED, result.errors


async def shared_queue(uow: Any) -> None:
    """team-a and team-b each hold quota with one job and wait with another."""
    uow.configure(SHARED)
    await submit(uow, "a-runs", "team-a", 2)
    await submit(uow, "b-runs", "team-b", 2)
    async with uow:
        await run_cycle(uow)
    await submit(uow, "a-waits", "team-a", 2)
    await submit(uow, "b-waits", "team-b", 2)


async def test_a_tenant_lists_only_its_own_jobs_of_a_shared_queue_but_counts_them_all(uow: Any) -> None:
    await shared_queue(uow)
    async with uow:
        seen = await queue_status(uow, "shared", tenant="team-a")
    assert seen is not None
    assert [j.id for j in seen.pending_jobs] == ["a-waits"]
    assert seen.admitted_jobs == ["a-runs"]
    assert (seen.pending, seen.admitted) == (2, 2), "the counts are the whole queue's"
    assert [(r.resource, r.usage) for r in seen.resources] == [("gpu", 4)]


async def test_the_admin_lists_every_tenants_jobs(uow: Any) -> None:
    await shared_queue(uow)
    async with uow:
        seen = await queue_status(uow, "shared")
    assert seen is not None
    assert sorted(j.id for j in seen.pending_jobs) == ["a-waits", "b-waits"]
    assert sorted(seen.admitted_jobs) == ["a-runs", "b-runs"]


async def test_a_tenant_with_no_job_in_the_queue_lists_none(uow: Any) -> None:
    await shared_queue(uow)
    async with uow:
        seen = await queue_status(uow, "shared", tenant="team-c")
    assert seen is not None
    assert (seen.pending_jobs, seen.admitted_jobs, seen.pending, seen.admitted) == ([], [], 2, 2)
