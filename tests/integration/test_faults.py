"""Fault tests on real NATS and Postgres: crashes and restarts lose nothing and double nothing."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import nats
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tessera.admission import bootstrap as admission
from tessera.admission.config import AdmissionSettings
from tessera.admission.service_layer.handlers import submit_job
from tessera.contracts import subjects
from tessera.contracts.events import SubmitJob
from tessera.core.db.engine import async_url
from tessera.core.messaging.envelope import encode
from tessera.testing.infra import DatabaseServerHandle, ServerHandle
from tessera.testing.services import (
    ServiceProcess,
    eventually,
    read_messages,
    read_stream,
    running,
    settings_for,
)

pytestmark = pytest.mark.integration

JOB = {
    "name": "train",
    "tenant": "research",
    "pod_groups": [{"name": "worker", "replicas": 1, "gpu": {"count": 1}}],
}


async def count(db: str, query: str) -> int:
    engine = create_async_engine(async_url(db))
    try:
        async with engine.connect() as conn:
            return int((await conn.execute(text(query))).scalar_one())
    finally:
        await engine.dispose()


@pytest.fixture
async def admission_process(system: tuple[str, str], tmp_path: Path) -> AsyncIterator[ServiceProcess]:
    nats_url, db = system
    proc = ServiceProcess(
        "admission",
        {
            "TESSERA_NATS_URL": nats_url,
            "TESSERA_DATABASE_URL": db,
            "TESSERA_ADMISSION_AUTH": "disabled",
            "TESSERA_ADMISSION_OUTBOX_POLL_S": "0.05",
            "TESSERA_ADMISSION_CONSUMER__ACK_WAIT_S": "2",
            "TESSERA_ADMISSION_CONSUMER__BACKOFF_BASE_S": "0.1",
        },
        tmp_path,
    )
    yield proc
    proc.stop()


async def events_about(nats_url: str, subject: str, job_id: str) -> list[str]:
    nc = await nats.connect(nats_url)
    try:
        return [e.id for e in await read_stream(nc.jetstream(), subject) if e.subject == job_id]
    finally:
        await nc.close()


async def test_consumer_killed_after_commit_before_ack_has_no_second_effect(
    system: tuple[str, str], admission_process: ServiceProcess
) -> None:
    nats_url, db = system
    admission_process.start({"TESSERA_FAULTS": "consumer.after_commit"})
    await admission_process.wait_ready()
    nc = await nats.connect(nats_url)
    subject, headers, body = encode(SubmitJob(job_id="job-crash-1", spec=JOB), "test")
    await nc.jetstream().publish(subject, body, headers=headers)

    assert await admission_process.wait_exit() == -signal.SIGKILL
    assert await count(db, "SELECT count(*) FROM admission.jobs WHERE id = 'job-crash-1'") == 1

    admission_process.start()
    await admission_process.wait_ready()

    async def redelivered_and_acked() -> bool:
        info = await nc.jetstream().consumer_info(subjects.stream_name("admission"), "admission-submit")
        return info.num_ack_pending == 0 and info.num_pending == 0 and info.delivered.consumer_seq >= 2

    await eventually(redelivered_and_acked, what="the command to be redelivered and acked")
    await nc.close()
    assert await count(db, "SELECT count(*) FROM admission.jobs WHERE id = 'job-crash-1'") == 1
    assert (
        await count(
            db,
            "SELECT count(*) FROM admission.job_transitions WHERE job_id = 'job-crash-1' "
            "AND state = 'submitted'",
        )
        == 1
    )
    assert len(await events_about(nats_url, subjects.JOB_ACCEPTED, "job-crash-1")) == 1


async def test_relay_killed_between_publish_and_delete_publishes_exactly_once(
    system: tuple[str, str], admission_process: ServiceProcess
) -> None:
    nats_url, db = system
    admission_process.start({"TESSERA_FAULTS": "relay.after_publish"})
    await admission_process.wait_ready()
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{admission_process.url}/v1/jobs", json=JOB)
    assert response.status_code == 201
    job_id = response.json()["id"]
    assert await admission_process.wait_exit() == -signal.SIGKILL
    assert await count(db, "SELECT count(*) FROM admission.outbox") >= 1  # published, not yet deleted

    admission_process.start()
    await admission_process.wait_ready()

    async def outbox_drained() -> bool:
        return await count(db, "SELECT count(*) FROM admission.outbox") == 0

    await eventually(outbox_drained, what="the outbox to drain")
    assert len(await events_about(nats_url, subjects.JOB_ACCEPTED, job_id)) == 1
    assert len(await events_about(nats_url, subjects.JOB_ADMITTED, job_id)) == 1


async def test_malformed_message_goes_to_the_dead_letter_subject_and_the_consumer_keeps_working(
    system: tuple[str, str],
) -> None:
    nats_url, db = system
    settings = settings_for(AdmissionSettings, nats_url, db)
    async with running(admission.build(settings), settings) as service:
        js = service.ctx.js
        await js.publish(subjects.SUBMIT_JOB, b"{not json", headers={"Nats-Msg-Id": "garbage-1"})
        subject, headers, body = encode(SubmitJob(job_id="after-garbage", spec=JOB), "test")
        await js.publish(subject, body, headers=headers)

        async def job_stored() -> int:
            return await count(db, "SELECT count(*) FROM admission.jobs WHERE id = 'after-garbage'")

        await eventually(job_stored, what="the valid command after the malformed one")
        dead = await read_messages(js, subjects.dead_letter("admission", "admission-submit"))
    assert len(dead) == 1
    assert dead[0].data == b"{not json"
    assert "missing CloudEvents headers" in (dead[0].headers or {})["tessera-dlq-reason"]
    assert (dead[0].headers or {})["tessera-dlq-original-subject"] == subjects.SUBMIT_JOB


async def test_nats_restart_while_submitting_loses_no_accepted_job(
    system: tuple[str, str], nats_server: ServerHandle, postgres_server: DatabaseServerHandle
) -> None:
    if not nats_server.can_restart:
        pytest.skip("NATS was given by URL; this test needs a NATS it can restart")
    nats_url, db = system
    settings = settings_for(AdmissionSettings, nats_url, db)
    accepted: list[str] = []
    async with running(admission.build(settings), settings) as service:
        for i in range(30):
            if i == 10:
                await asyncio.to_thread(nats_server.restart)
            async with service.ctx.uow() as uow:
                result = await submit_job({**JOB, "name": f"job-{i}"}, uow)
                await uow.commit()
            accepted.append(result.job_id)
            await asyncio.sleep(0.02)

        async def all_published() -> bool:
            return await count(db, "SELECT count(*) FROM admission.outbox") == 0

        await eventually(all_published, timeout=30, what="the outbox to drain after the restart")
        published = await read_stream(service.ctx.js, subjects.JOB_ACCEPTED)
    ids = [e.subject for e in published]
    assert sorted(ids) == sorted(accepted), "every accepted job is announced exactly once"
    assert await count(db, "SELECT count(*) FROM admission.jobs") == 30
