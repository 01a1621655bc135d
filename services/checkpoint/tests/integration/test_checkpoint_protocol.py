"""The checkpoint protocol on real NATS and Postgres, with a real training loop using the client library:
a preempted job saves before its eviction; one that never answers is let go at its deadline; one that
cannot checkpoint is let go at once; and a restart in the middle (or a SIGKILL) ends each request
exactly once."""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tessera.checkpoint import bootstrap
from tessera.contracts import subjects
from tessera.contracts.events import (
    CheckpointFailed,
    CheckpointSaved,
    PreemptionRequested,
    ReadyForEviction,
    SaveCheckpoint,
)
from tessera.core.runner import create_app
from tessera.testing.services import ServiceProcess, eventually, running

pytestmark = pytest.mark.integration


def preemption(job_id: str, grace_s: float, *, checkpointable: bool = True) -> PreemptionRequested:
    return PreemptionRequested(
        victim_job_id=job_id,
        preemptor_job_id="urgent",
        reason="InCohortReclamation",
        deadline=datetime.now(UTC) + timedelta(seconds=grace_s),
        grace_period_s=grace_s,
        checkpointable=checkpointable,
    )


async def of_job(stack: Any, subject: str, job_id: str) -> list[Any]:
    return [event for event in await stack.events(subject) if event.job_id == job_id]


async def one(stack: Any, subject: str, job_id: str, *, timeout: float = 20.0) -> Any:
    """The first message for `job_id` on `subject`, once there is one."""
    found = await eventually(
        lambda: of_job(stack, subject, job_id), timeout=timeout, what=f"{subject} for {job_id}"
    )
    return found[0]


@pytest.fixture
async def api(stack: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The whole service (its FastAPI app, lifespan included) behind an httpx client sending the admin
    token the service is configured with."""
    settings = stack.settings(admin_token="root-token")
    app = create_app(bootstrap.build(settings), settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": "Bearer root-token"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://checkpoint", headers=headers
        ) as client:
            yield client


async def test_a_preempted_job_saves_before_its_eviction_and_the_restart_finds_it(
    stack: Any, api: httpx.AsyncClient, trainers: Any
) -> None:
    assert (await api.get("/readyz")).json()["ready"] is True
    job = f"train-{uuid.uuid4().hex[:6]}"
    trainer = await trainers(job)
    await stack.publish(preemption(job, grace_s=30))

    command = await one(stack, subjects.save_checkpoint(job), job)
    assert isinstance(command, SaveCheckpoint) and command.reason == "preemption"
    ready = await one(stack, subjects.READY_FOR_EVICTION, job)
    [saved] = await of_job(stack, subjects.CHECKPOINT_SAVED, job)
    assert isinstance(saved, CheckpointSaved) and saved.request_id == command.request_id
    assert saved.uri.startswith("file://") and saved.size_bytes == 40_000 and saved.step > 0
    assert isinstance(ready, ReadyForEviction)
    assert (ready.reason, ready.checkpoint_uri, ready.step, ready.request_id) == (
        "checkpoint_saved",
        saved.uri,
        saved.step,
        command.request_id,
    )
    assert (ready.cause, ready.preemptor_job_id) == ("preemption", "urgent"), "matched to its preemption"
    result = trainer.ckpt.last_result
    assert result is not None and result.ok and result.uri == saved.uri

    listed = (await api.get(f"/v1/jobs/{job}/checkpoints")).json()
    assert (await api.get(f"/v1/jobs/{job}/checkpoints", headers={"Authorization": ""})).status_code == 401
    assert [(c["step"], c["bytes"], c["uri"]) for c in listed] == [(saved.step, saved.size_bytes, saved.uri)]
    assert await stack.rows(f"SELECT state FROM checkpoint.checkpoint_requests WHERE job_id = '{job}'") == [
        ("saved",)
    ]
    assert await stack.events(subjects.dead_letter("checkpoint", ">")) == [], "nothing it read was refused"


async def test_a_victim_that_never_answers_is_let_go_at_the_deadline(stack: Any) -> None:
    job = f"silent-{uuid.uuid4().hex[:6]}"
    settings = stack.settings()
    async with running(bootstrap.build(settings), settings):
        event = preemption(job, grace_s=2)
        await stack.publish(event)
        await one(stack, subjects.save_checkpoint(job), job)
        ready = await one(stack, subjects.READY_FOR_EVICTION, job, timeout=10)
    assert (ready.reason, ready.checkpoint_uri) == ("checkpoint_timeout", None)
    assert ready.at >= event.deadline, "not before the deadline"
    assert ready.at - event.deadline < timedelta(seconds=2), "and soon after it"
    [failed] = await of_job(stack, subjects.CHECKPOINT_FAILED, job)
    assert isinstance(failed, CheckpointFailed) and failed.reason == "checkpoint_timeout"


async def test_a_victim_that_cannot_checkpoint_is_let_go_at_once(stack: Any) -> None:
    job = f"stateless-{uuid.uuid4().hex[:6]}"
    settings = stack.settings()
    async with running(bootstrap.build(settings), settings):
        await stack.publish(preemption(job, grace_s=300, checkpointable=False))
        ready = await one(stack, subjects.READY_FOR_EVICTION, job, timeout=10)
    assert (ready.reason, ready.cause) == ("not_checkpointable", "preemption")
    assert await of_job(stack, subjects.save_checkpoint(job), job) == []


async def test_a_request_made_before_a_restart_times_out_after_it_exactly_once(stack: Any) -> None:
    job = f"restart-{uuid.uuid4().hex[:6]}"
    settings = stack.settings()
    event = preemption(job, grace_s=2)
    async with running(bootstrap.build(settings), settings):
        await stack.publish(event)
        await one(stack, subjects.save_checkpoint(job), job)
    # Stopped mid-request; the deadline passes while nothing runs.
    await asyncio.sleep(max(0.0, (event.deadline - datetime.now(UTC)).total_seconds()) + 0.5)
    assert await of_job(stack, subjects.READY_FOR_EVICTION, job) == []
    async with running(bootstrap.build(settings), settings):
        ready = await one(stack, subjects.READY_FOR_EVICTION, job, timeout=10)
        assert ready.reason == "checkpoint_timeout"
    async with running(bootstrap.build(settings), settings):
        # A third life: once a later request has timed out, its deadline rounds saw the first one too.
        marker = f"marker-{uuid.uuid4().hex[:6]}"
        await stack.publish(preemption(marker, grace_s=0.5))
        assert (await one(stack, subjects.READY_FOR_EVICTION, marker)).reason == "checkpoint_timeout"
    assert len(await of_job(stack, subjects.READY_FOR_EVICTION, job)) == 1
    assert len(await of_job(stack, subjects.save_checkpoint(job), job)) == 1


async def test_a_killed_service_times_the_request_out_after_it_restarts_exactly_once(
    stack: Any, tmp_path: Path
) -> None:
    job = f"killed-{uuid.uuid4().hex[:6]}"
    env = {
        "TESSERA_NATS_URL": stack.nats_url,
        "TESSERA_DATABASE_URL": stack.db,
        "TESSERA_CHECKPOINT_OUTBOX_POLL_S": "0.05",
        "TESSERA_CHECKPOINT_DEADLINE_POLL_S": "0.2",
    }
    service = ServiceProcess("checkpoint", env, tmp_path)
    service.start()
    try:
        await service.wait_ready()
        event = preemption(job, grace_s=3)
        await stack.publish(event)
        await one(stack, subjects.save_checkpoint(job), job)
        assert service.proc is not None
        service.proc.send_signal(signal.SIGKILL)
        assert await service.wait_exit() == -signal.SIGKILL
        await asyncio.sleep(max(0.0, (event.deadline - datetime.now(UTC)).total_seconds()) + 0.5)
        service.start()
        await service.wait_ready()
        assert (await one(stack, subjects.READY_FOR_EVICTION, job)).reason == "checkpoint_timeout"
        marker = f"marker-{uuid.uuid4().hex[:6]}"
        await stack.publish(preemption(marker, grace_s=0.5))
        await one(stack, subjects.READY_FOR_EVICTION, marker)
    finally:
        service.stop()
    assert len(await of_job(stack, subjects.READY_FOR_EVICTION, job)) == 1
    assert len(await of_job(stack, subjects.CHECKPOINT_FAILED, job)) == 1


async def test_a_report_sent_while_the_service_was_down_ends_the_request_after_the_restart(
    stack: Any, trainers: Any
) -> None:
    job = f"resume-{uuid.uuid4().hex[:6]}"
    settings = stack.settings()
    async with running(bootstrap.build(settings), settings):
        trainer = await trainers(job, run=False)  # listening, but not at a safe point yet
        await stack.publish(preemption(job, grace_s=30))
        command = await one(stack, subjects.save_checkpoint(job), job)
        await asyncio.sleep(0.3)  # the command reaches the trainer
    trainer.run()  # it saves and reports while the service is down
    await eventually(lambda: _async(trainer.ckpt.last_result), what="the checkpoint flushed")
    await eventually(
        lambda: of_job(stack, subjects.REPORT_CHECKPOINT, job), what="the report waiting on the stream"
    )
    assert await of_job(stack, subjects.READY_FOR_EVICTION, job) == []
    async with running(bootstrap.build(settings), settings):
        ready = await one(stack, subjects.READY_FOR_EVICTION, job, timeout=10)
    assert (ready.reason, ready.request_id) == ("checkpoint_saved", command.request_id)
    assert len(await of_job(stack, subjects.CHECKPOINT_SAVED, job)) == 1


async def _async(value: Any) -> Any:
    return value
