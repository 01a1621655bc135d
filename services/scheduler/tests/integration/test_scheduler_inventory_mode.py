"""The scheduler without a cluster: gangs placed on the inventory telemetry reports, health respected,
and placements kept across a restart. Real Postgres and NATS."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import nats
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tessera.contracts import subjects
from tessera.contracts.base import Message
from tessera.contracts.events import (
    GpuInventory,
    GpuUnhealthy,
    InventoryChanged,
    JobAdmitted,
    JobFinished,
    NodeInventory,
    PreemptionRequested,
)
from tessera.contracts.jobs import JobSpec
from tessera.core.db.engine import async_url
from tessera.core.db.migrations import migrate_all
from tessera.core.messaging.envelope import encode
from tessera.core.messaging.streams import StreamLimits, ensure_stream
from tessera.core.runner import RunningService
from tessera.scheduler import bootstrap
from tessera.scheduler.config import SchedulerSettings
from tessera.scheduler.service_layer.dependencies import SchedulerDeps
from tessera.testing.services import eventually, read_stream, reset_jetstream, running, settings_for

pytestmark = pytest.mark.integration

NODE = NodeInventory(
    name="gpu-node-0",
    cpu_milli=96_000,
    memory_mib=1_048_576,
    gpus=[GpuInventory(index=i, uuid=f"GPU-{i}", model="A100-80GB", memory_mib=81920) for i in range(8)],
)


def job(name: str, gpus: int) -> JobSpec:
    return JobSpec.model_validate(
        {"name": name, "tenant": "t", "pod_groups": [{"name": "w", "replicas": 1, "gpu": {"count": gpus}}]}
    )


@pytest.fixture
async def system(nats_url: str, fresh_database: str) -> AsyncIterator[tuple[str, str]]:
    await reset_jetstream(nats_url)
    await asyncio.to_thread(migrate_all, fresh_database)
    yield nats_url, fresh_database


async def publish(nats_url: str, owner: str, event: Message) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_stream(js, owner, StreamLimits(120.0, 3600.0, 1024**3, 1))
        subject, headers, body = encode(event, f"tessera/{owner}")
        await js.publish(subject, body, headers=headers)
    finally:
        await nc.close()


async def events(nats_url: str, subject: str, job_id: str) -> list[Any]:
    nc = await nats.connect(nats_url)
    try:
        found = await read_stream(nc.jetstream(), subject, idle_s=0.2)
        return [e.parse() for e in found if e.parse().job_id == job_id]  # type: ignore[attr-defined]
    finally:
        await nc.close()


async def rows(db: str, query: str) -> list[tuple[Any, ...]]:
    engine = create_async_engine(async_url(db))
    try:
        async with engine.connect() as conn:
            return [tuple(row) for row in (await conn.execute(text(query))).all()]
    finally:
        await engine.dispose()


async def admit(nats_url: str, job_id: str, spec: JobSpec) -> None:
    await publish(
        nats_url, "admission", JobAdmitted(job_id=job_id, spec=spec, submitted_at=datetime.now(UTC))
    )


async def placed_gpus(nats_url: str, job_id: str) -> set[int]:
    placed = await eventually(lambda: events(nats_url, subjects.GANG_PLACED, job_id), what=f"{job_id} placed")
    return {gpu.index for placement in placed[0].placements for gpu in placement.gpus}


async def test_unhealthy_gpus_are_avoided_and_placements_survive_a_restart(system: tuple[str, str]) -> None:
    nats_url, db = system
    settings = settings_for(SchedulerSettings, nats_url, db, kubeconfig=None, poll_s=0.2)
    whole, half, rest = (str(uuid.uuid4()) for _ in range(3))
    async with running(bootstrap.build(settings), settings):
        await publish(nats_url, "telemetry", InventoryChanged(source="test", nodes=[NODE]))
        await eventually(lambda: rows(db, "SELECT name FROM scheduler.inventory_nodes"), what="inventory")
        unhealthy = GpuUnhealthy(
            node=NODE.name,
            gpu_index=3,
            gpu_uuid="GPU-3",
            faults=["xid"],
            reasons=["XID 79"],
            at=datetime.now(UTC),
        )
        await publish(nats_url, "telemetry", unhealthy)
        await eventually(
            lambda: rows(
                db, "SELECT 1 FROM scheduler.inventory_nodes WHERE data::text LIKE '%\"healthy\": false%'"
            ),
            what="the fault recorded",
        )
        await admit(nats_url, whole, job("whole", 8))
        refused = await eventually(
            lambda: events(nats_url, subjects.GANG_UNSCHEDULABLE, whole), what="whole node refused"
        )
        assert sum(refused[0].rejected_nodes.values()) == 1, refused[0].message
        await admit(nats_url, half, job("half", 4))
        first = await placed_gpus(nats_url, half)
        assert len(first) == 4 and 3 not in first
    async with running(bootstrap.build(settings), settings):
        await admit(nats_url, rest, job("rest", 3))
        second = await placed_gpus(nats_url, rest)
        assert second == set(range(8)) - first - {3}, "the rebuilt state keeps the placement and the fault"
        assert await rows(
            db, f"SELECT reason_code FROM scheduler.pending_gangs WHERE job_id = '{whole}'"
        ) == [("unschedulable",)]


async def test_a_preempted_victim_is_evicted_reported_and_its_gpus_go_to_the_waiting_gang(
    system: tuple[str, str],
) -> None:
    nats_url, db = system
    settings = settings_for(SchedulerSettings, nats_url, db, kubeconfig=None, poll_s=0.2)
    victim, preemptor = str(uuid.uuid4()), str(uuid.uuid4())
    async with running(bootstrap.build(settings), settings):
        await publish(nats_url, "telemetry", InventoryChanged(source="test", nodes=[NODE]))
        await eventually(lambda: rows(db, "SELECT name FROM scheduler.inventory_nodes"), what="inventory")
        await admit(nats_url, victim, job("victim", 8))
        assert len(await placed_gpus(nats_url, victim)) == 8
        await admit(nats_url, preemptor, job("urgent", 8))
        await eventually(
            lambda: events(nats_url, subjects.GANG_UNSCHEDULABLE, preemptor), what="urgent waits"
        )
        request = PreemptionRequested(
            victim_job_id=victim,
            preemptor_job_id=preemptor,
            reason="InQueuePriority",
            deadline=datetime.now(UTC) + timedelta(minutes=5),
            grace_period_s=0,
            checkpointable=False,
        )
        await publish(nats_url, "admission", request)
        evicted = await eventually(
            lambda: events(nats_url, subjects.PODS_EVICTED, victim), what="victim evicted"
        )
        assert evicted[0].reason == "preempted" and len(evicted[0].pods) == 1
        reports = await eventually(
            lambda: events(nats_url, subjects.REPORT_JOB_OUTCOME, victim), what="victim reported released"
        )
        assert reports[0].state == "preempted"
        assert len(await placed_gpus(nats_url, preemptor)) == 8
        assert await rows(db, "SELECT job_id FROM scheduler.placements GROUP BY job_id") == [(preemptor,)]
        assert await rows(db, "SELECT count(*) FROM scheduler.preemptions") == [(0,)]


async def test_two_replicas_never_hand_out_the_same_gpus(system: tuple[str, str]) -> None:
    nats_url, db = system
    settings = settings_for(SchedulerSettings, nats_url, db, kubeconfig=None, poll_s=0.1)
    jobs = [str(uuid.uuid4()) for _ in range(4)]
    async with (
        running(bootstrap.build(settings), settings) as first,
        running(bootstrap.build(settings), settings) as second,
    ):
        await publish(nats_url, "telemetry", InventoryChanged(source="test", nodes=[NODE]))
        await eventually(lambda: rows(db, "SELECT name FROM scheduler.inventory_nodes"), what="inventory")
        for job_id in jobs:
            await admit(nats_url, job_id, job("half", 4))
        decided = "SELECT count(*) FROM scheduler.pending_gangs WHERE attempts > 0"
        await eventually(lambda: _equals(rows(db, decided), [(2,)]), what="two jobs refused")
        # both replicas run more whole cycles, each seeing the refused jobs and the placements
        await asyncio.gather(after_more_cycles(first, 2), after_more_cycles(second, 2))
        gpus = await rows(db, "SELECT g->>'index' FROM scheduler.placements, jsonb_array_elements(gpus) g")
        assert sorted(int(index) for (index,) in gpus) == list(range(8)), "8 GPUs, each handed out once"


async def _equals(probe: Any, expected: Any) -> bool:
    return bool(await probe == expected)


async def after_more_cycles(service: RunningService[SchedulerDeps], cycles: int = 2) -> None:
    """Return once the scheduling loop has run `cycles` whole cycles that began after this call.

    `engine.cycles` counts cycles as they begin and the loop runs one at a time, so once it reaches
    its value now + `cycles` + 1, every one of the `cycles` cycles after now has finished."""
    engine = service.deps.engine
    target = engine.cycles + cycles + 1

    async def advanced() -> bool:
        return engine.cycles >= target

    await eventually(advanced, what=f"{cycles} more scheduling cycles", timeout=20)


async def test_a_job_that_left_admission_is_withdrawn_and_frees_its_gpus(system: tuple[str, str]) -> None:
    nats_url, db = system
    settings = settings_for(SchedulerSettings, nats_url, db, kubeconfig=None, poll_s=0.2)
    cancelled, waiting = str(uuid.uuid4()), str(uuid.uuid4())
    async with running(bootstrap.build(settings), settings):
        await publish(nats_url, "telemetry", InventoryChanged(source="test", nodes=[NODE]))
        await eventually(lambda: rows(db, "SELECT name FROM scheduler.inventory_nodes"), what="inventory")
        await admit(nats_url, cancelled, job("first", 8))
        assert len(await placed_gpus(nats_url, cancelled)) == 8
        await admit(nats_url, waiting, job("second", 8))
        await eventually(lambda: events(nats_url, subjects.GANG_UNSCHEDULABLE, waiting), what="second waits")
        finished = JobFinished(
            job_id=cancelled, state="cancelled", reason="by its owner", at=datetime.now(UTC)
        )
        await publish(nats_url, "admission", finished)
        evicted = await eventually(
            lambda: events(nats_url, subjects.PODS_EVICTED, cancelled), what="withdrawn"
        )
        assert evicted[0].reason == "withdrawn"
        assert len(await placed_gpus(nats_url, waiting)) == 8
        assert await events(nats_url, subjects.REPORT_JOB_OUTCOME, cancelled) == []
