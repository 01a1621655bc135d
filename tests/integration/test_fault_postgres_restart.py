"""Fault test: PostgreSQL crashes while jobs are being submitted, and comes back.

Admission and the scheduler (inventory mode) run as real processes on a private PostgreSQL. Jobs
arrive both ways at once: by REST, each with an Idempotency-Key and retried until it gets a 2xx, as a
client would, and as NATS commands, which JetStream takes even while the database is down. A quarter
of the way through, the postmaster gets SIGKILL (its backends end as they notice) and stays down for
about as long as a restart takes; then PostgreSQL starts again on the same data directory and port,
through crash recovery. The same two processes, never restarted, must be ready again, take a new job
at once, and have stored, announced, admitted and placed every accepted job exactly once: counted in
their tables and in the streams, with nothing dead-lettered.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import nats
import pytest
from nats.js import JetStreamContext

from tessera.contracts import subjects
from tessera.contracts.events import GpuInventory, InventoryChanged, NodeInventory, SubmitJob
from tessera.core.db.migrations import migrate_all
from tessera.core.messaging.envelope import encode
from tessera.core.messaging.streams import StreamLimits, ensure_stream
from tessera.testing.restartable_postgres import RestartablePostgres
from tessera.testing.services import ServiceProcess, eventually, read_messages, read_stream, reset_jetstream
from tests.integration.test_faults import JOB, count

pytestmark = pytest.mark.integration

JOBS = 24  # submitted each way, one GPU each
CRASH_AFTER = 8  # REST jobs accepted before the crash
DOWN_S = 3.0  # how long PostgreSQL stays down: about what a restart after a crash takes
NODES = [
    NodeInventory(
        name=f"gpu-node-{n}",
        cpu_milli=96_000,
        memory_mib=1_048_576,
        gpus=[
            GpuInventory(index=i, uuid=f"GPU-{n}-{i}", model="A100-80GB", memory_mib=81920) for i in range(8)
        ],
    )
    for n in range(8)  # 64 GPUs: room for every job
]
FAST = {"OUTBOX_POLL_S": "0.05", "CONSUMER__ACK_WAIT_S": "2", "CONSUMER__BACKOFF_BASE_S": "0.1"}


@dataclass
class World:
    nats_url: str
    db: str
    postgres: RestartablePostgres
    admission: ServiceProcess
    scheduler: ServiceProcess

    @property
    def services(self) -> list[ServiceProcess]:
        return [self.admission, self.scheduler]


@pytest.fixture
async def world(
    nats_url: str, restartable_postgres: RestartablePostgres, tmp_path: Path
) -> AsyncIterator[World]:
    await reset_jetstream(nats_url)
    db = restartable_postgres.url
    await asyncio.to_thread(migrate_all, db)
    common = {"TESSERA_NATS_URL": nats_url, "TESSERA_DATABASE_URL": db}
    admission = ServiceProcess(
        "admission",
        {
            **common,
            "TESSERA_ADMISSION_AUTH": "disabled",
            **{f"TESSERA_ADMISSION_{k}": v for k, v in FAST.items()},
        },
        tmp_path,
    )
    scheduler = ServiceProcess(
        "scheduler",
        {
            **common,
            "TESSERA_SCHEDULER_POLL_S": "0.2",
            **{f"TESSERA_SCHEDULER_{k}": v for k, v in FAST.items()},
        },
        tmp_path,
    )
    world = World(nats_url, db, restartable_postgres, admission, scheduler)
    try:
        yield world
    finally:
        for service in world.services:
            service.stop()


@dataclass
class Submissions:
    """What the clients were told: REST jobs answered 2xx, commands acknowledged by JetStream."""

    rest: dict[str, str] = field(default_factory=dict)  # idempotency key -> job id
    commands: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # REST attempts answered without a 2xx, retried
    while_down: int = 0  # commands published while PostgreSQL was down
    crash_now: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def job_ids(self) -> list[str]:
        return sorted([*self.rest.values(), *self.commands])


async def submit_rest(client: httpx.AsyncClient, url: str, key: str, out: Submissions) -> None:
    """POST until a 2xx, always with the same Idempotency-Key, as a well-behaved client does."""
    while True:
        try:
            response = await client.post(
                f"{url}/v1/jobs", json={**JOB, "name": key}, headers={"Idempotency-Key": key}, timeout=10
            )
            if response.is_success:
                out.rest[key] = response.json()["id"]
                return
            out.refused.append(f"{key}: {response.status_code}")
        except httpx.HTTPError as exc:
            out.refused.append(f"{key}: {exc!r}")
        await asyncio.sleep(0.05)


async def submit_command(js: JetStreamContext, job_id: str, out: Submissions) -> None:
    subject, headers, body = encode(SubmitJob(job_id=job_id, spec={**JOB, "name": job_id}), "test")
    await js.publish(subject, body, headers=headers)  # the PubAck: the command is accepted
    out.commands.append(job_id)


async def submit_by_rest(url: str, out: Submissions) -> None:
    async with httpx.AsyncClient() as client:
        for i in range(JOBS):
            if i == CRASH_AFTER:
                out.crash_now.set()
            await submit_rest(client, url, f"rest-{i:03d}", out)
            await asyncio.sleep(0.02)


async def submit_by_command(js: JetStreamContext, out: Submissions, down: asyncio.Event) -> None:
    """Commands go on while PostgreSQL is down: JetStream takes them, the consumer must wait it out."""
    for i in range(JOBS):
        if i == CRASH_AFTER:
            await out.crash_now.wait()
        await submit_command(js, f"cmd-{i:03d}", out)
        if down.is_set():
            out.while_down += 1
        await asyncio.sleep(0.1)


async def ready(service: ServiceProcess) -> None:
    async with httpx.AsyncClient() as client:

        async def answers_ready() -> bool:
            return (await client.get(f"{service.url}/readyz", timeout=5)).status_code == 200

        await eventually(answers_ready, timeout=30, what=f"{service.service} ready again")


async def test_postgres_killed_mid_submission_loses_and_doubles_nothing_and_the_services_recover(
    world: World,
) -> None:
    postgres, admission = world.postgres, world.admission
    nc = await nats.connect(world.nats_url)
    js = nc.jetstream()
    # the GPUs the scheduler places on, as telemetry would announce them
    await ensure_stream(js, "telemetry", StreamLimits(120.0, 3600.0, 1024**3, 1))
    subject, headers, body = encode(InventoryChanged(source="test", nodes=NODES), "tessera/telemetry")
    await js.publish(subject, body, headers=headers)
    for service in world.services:
        service.start()
    for service in world.services:
        await service.wait_ready()
    pids = {service.service: service.proc.pid for service in world.services if service.proc is not None}

    async def inventory_stored() -> bool:
        return await count(world.db, "SELECT count(*) FROM scheduler.inventory_nodes") == len(NODES)

    await eventually(inventory_stored, what="the scheduler to store the inventory")

    out, down = Submissions(), asyncio.Event()
    submitting = [
        asyncio.create_task(submit_by_rest(admission.url, out)),
        asyncio.create_task(submit_by_command(js, out, down)),
    ]
    try:
        await asyncio.wait_for(out.crash_now.wait(), timeout=30)
        postgres_pid = postgres.pid
        down.set()
        await asyncio.to_thread(postgres.kill)  # SIGKILL the postmaster, mid-submission
        await asyncio.sleep(DOWN_S)
        await asyncio.to_thread(postgres.start)  # same data directory and port: crash recovery
        down.clear()
        assert postgres.pid != postgres_pid
        await asyncio.wait_for(asyncio.gather(*submitting), timeout=60)
    finally:
        for task in submitting:
            task.cancel()
    assert out.refused, "REST submissions met the outage"
    assert out.while_down > 0, "commands arrived while PostgreSQL was down"

    # The same processes, never restarted, are ready again and take a new job at once.
    for service in world.services:
        await ready(service)
    async with httpx.AsyncClient() as client:
        after = await client.post(
            f"{admission.url}/v1/jobs",
            json={**JOB, "name": "after"},
            headers={"Idempotency-Key": "after-rest"},
            timeout=10,
        )
    assert after.status_code == 201, after.text
    out.rest["after-rest"] = after.json()["id"]
    await submit_command(js, "after-cmd", out)
    for service in world.services:
        assert service.proc is not None and service.proc.poll() is None, f"{service.service} exited"
        assert service.proc.pid == pids[service.service], f"{service.service} was restarted"

    expected = out.job_ids
    assert len(expected) == 2 * JOBS + 2

    async def dead_letters() -> list[tuple[str, str]]:
        dead = [
            m
            for owner in ("admission", "scheduler")
            for m in await read_messages(js, f"tessera.{owner}.dlq.>")
        ]
        return [(m.subject, (m.headers or {}).get("tessera-dlq-reason", "")) for m in dead]

    async def settled() -> bool:
        # every accepted job placed (as admission records it), or lost to a dead-letter subject
        placed = await count(world.db, "SELECT count(*) FROM admission.jobs WHERE state = 'placed'")
        return placed + len(await dead_letters()) >= len(expected)

    async def outboxes_drained() -> bool:
        queued = [
            await count(world.db, f"SELECT count(*) FROM {s}.outbox") for s in ("admission", "scheduler")
        ]
        return queued == [0, 0]

    await eventually(settled, timeout=40, what="admission to see every accepted job placed")
    assert await dead_letters() == [], "a database outage is no reason to dead-letter a message"
    await eventually(outboxes_drained, timeout=20, what="both outboxes to drain")

    # Rows: each accepted job stored once, with one transition per state, and one placement.
    listed = ", ".join(f"'{job_id}'" for job_id in expected)
    assert await count(world.db, "SELECT count(*) FROM admission.jobs") == len(expected)
    assert await count(world.db, f"SELECT count(*) FROM admission.jobs WHERE id IN ({listed})") == len(
        expected
    )
    for state in ("submitted", "admitted", "placed"):
        once = await count(
            world.db,
            "SELECT count(*) FROM (SELECT job_id FROM admission.job_transitions "
            f"WHERE state = '{state}' GROUP BY job_id HAVING count(*) = 1) AS once",
        )
        total = await count(
            world.db, f"SELECT count(*) FROM admission.job_transitions WHERE state = '{state}'"
        )
        assert (once, total) == (len(expected), len(expected)), state
    assert await count(world.db, "SELECT count(*) FROM scheduler.placements") == len(expected)
    assert await count(world.db, "SELECT count(DISTINCT job_id) FROM scheduler.placements") == len(expected)
    # Events: each accepted job announced, admitted and placed exactly once.
    for subject in (subjects.JOB_ACCEPTED, subjects.JOB_ADMITTED, subjects.GANG_PLACED):
        announced = Counter(e.subject for e in await read_stream(js, subject))
        assert sorted(announced) == expected, subject
        assert set(announced.values()) == {1}, f"{subject} twice: {announced.most_common(3)}"
    for owner, consumer in (
        ("admission", "admission-submit"),
        ("admission", "scheduler-admitted"),
        ("scheduler", "admission-scheduler-outcomes"),
    ):
        info = await js.consumer_info(subjects.stream_name(owner), consumer)
        assert (info.num_pending, info.num_ack_pending) == (0, 0), consumer
    await nc.close()
