"""Submissions on a tenant's own subject (`tessera.admission.cmd.submit_job.<tenant>`): the tenant's
job is accepted; a job naming another tenant is dead-lettered with the reason and answered with
`job_rejected`, and the tenant's later submissions are still handled."""

from __future__ import annotations

from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from tessera.contracts import subjects
from tessera.contracts.events import JobAccepted, JobRejected, SubmitJob
from tessera.core.messaging.envelope import encode
from tessera.testing.builders import a_job
from tessera.testing.services import eventually, read_messages, read_stream

from .conftest import start_api

pytestmark = pytest.mark.integration


@pytest.fixture
async def publisher(nats_url: str) -> AsyncIterator[NATS]:
    nc = await nats.connect(nats_url)
    yield nc
    await nc.close()


async def submit(js: JetStreamContext, subject: str, job_id: str, tenant: str) -> None:
    spec = a_job(job_id).tenant(tenant).group("workers", replicas=1, gpus=1).as_dict()
    _, headers, body = encode(SubmitJob(job_id=job_id, spec=spec), "tessera/test")
    await js.publish(subject, body, headers=headers)


async def answer(js: JetStreamContext, job_id: str) -> JobAccepted | JobRejected | None:
    for subject in (subjects.JOB_ACCEPTED, subjects.JOB_REJECTED):
        for envelope in await read_stream(js, subject, idle_s=0.2):
            message = envelope.parse()
            if isinstance(message, JobAccepted | JobRejected) and message.job_id == job_id:
                return message
    return None


async def test_a_tenants_subject_takes_its_jobs_and_refuses_another_tenants(
    admission_db: tuple[str, str], publisher: NATS
) -> None:
    async for api in start_api(*admission_db, auth="disabled"):
        js = publisher.jetstream()
        await submit(js, subjects.tenant_submit_job("team-a"), "own-1", "team-a")
        await submit(js, subjects.tenant_submit_job("team-a"), "other-1", "team-b")
        await submit(js, subjects.tenant_submit_job("team-a"), "own-2", "team-a")
        await submit(js, subjects.SUBMIT_JOB, "internal-1", "team-b")  # the internal subject still works

        answers = {}
        for job_id in ("own-1", "other-1", "own-2", "internal-1"):
            answers[job_id] = await eventually(
                lambda job_id=job_id, js=js: answer(js, job_id), timeout=30, what=f"{job_id} answered"
            )
        assert isinstance(answers["own-1"], JobAccepted) and answers["own-1"].tenant == "team-a"
        assert isinstance(answers["own-2"], JobAccepted)
        assert isinstance(answers["internal-1"], JobAccepted) and answers["internal-1"].tenant == "team-b"
        rejected = answers["other-1"]
        assert isinstance(rejected, JobRejected)
        assert rejected.errors[0].field == "message"
        assert "'team-b' is not 'team-a'" in rejected.errors[0].reason, rejected.errors

        (letter,) = await read_messages(js, subjects.dead_letter("admission", "admission-tenant-submit"))
        assert (
            "rejected by handler: spec.tenant 'team-b' is not 'team-a'"
            in (letter.headers or {})["tessera-dlq-reason"]
        )
        assert await api.scalar("SELECT count(*) FROM admission.jobs WHERE id = 'other-1'") == 1
        assert await api.scalar("SELECT state FROM admission.jobs WHERE id = 'other-1'") == "rejected"
        info = await js.consumer_info("TESSERA_ADMISSION", "admission-tenant-submit")
        assert info.num_ack_pending == 0 and info.num_redelivered == 0


async def test_a_job_id_another_tenant_holds_is_refused_and_that_job_left_alone(
    admission_db: tuple[str, str], publisher: NATS
) -> None:
    js = publisher.jetstream()
    async for api in start_api(*admission_db, auth="disabled"):
        await submit(js, subjects.tenant_submit_job("team-a"), "nightly", "team-a")
        first = await eventually(lambda: answer(js, "nightly"), timeout=30, what="nightly answered")
        assert isinstance(first, JobAccepted) and first.tenant == "team-a"

        await submit(js, subjects.tenant_submit_job("team-b"), "nightly", "team-b")
        await submit(js, subjects.tenant_submit_job("team-a"), "nightly", "team-a")  # its own: idempotent

        async def refused() -> list[str]:
            letters = await read_messages(js, subjects.dead_letter("admission", "admission-tenant-submit"))
            return [(m.headers or {}).get("tessera-dlq-reason", "") for m in letters]

        (reason,) = await eventually(refused, timeout=30, what="team-b's submission dead-lettered")
        assert "job_id 'nightly' is taken by another tenant's job" in reason, reason
        assert await api.scalar("SELECT tenant FROM admission.jobs WHERE id = 'nightly'") == "team-a"
        assert await api.scalar("SELECT state FROM admission.jobs WHERE id = 'nightly'") == "queued"
