"""Admission's two outcome consumers (the scheduler's events, and outcome reports) each handle a batch
in one transaction, locking its jobs in the order the messages came. Two batches naming the same
jobs in opposite orders must not deadlock: the consumers of job events take turns. On real Postgres.

The service admits the two jobs and is stopped; the batches then run alone, so that no admission
cycle waits between them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tessera.admission.adapters import orm
from tessera.admission.adapters.cycle_records import JOB_EVENTS_LOCK_KEY
from tessera.admission.service_layer.handlers import handle_outcome_command, handle_scheduler_event
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork
from tessera.contracts.events import Message, ReportJobOutcome
from tessera.core.db.engine import make_engine, make_session_factory
from tessera.core.messaging.envelope import Envelope, decode, encode
from tessera.testing.services import eventually

from .conftest import start_api
from .test_admission_outcome_order import admitted_job, placed

pytestmark = pytest.mark.integration


def envelope(message: Message, source: str) -> Envelope:
    return decode(*encode(message, source))


def running(job_id: str) -> Envelope:
    return envelope(ReportJobOutcome(job_id=job_id, state="running", reason="pods running"), "scheduler")


@pytest.fixture
async def two_admitted(admission_db: tuple[str, str]) -> AsyncIterator[tuple[AsyncEngine, str, str]]:
    serving = start_api(*admission_db, auth="disabled")
    api = await anext(serving)
    first, second = await admitted_job(api), await admitted_job(api)
    await serving.aclose()
    engine = make_engine(admission_db[1], pool_size=4)
    yield engine, first, second
    await engine.dispose()


async def waits_for_its_turn(engine: AsyncEngine, pid: int) -> bool:
    """Whether backend ``pid`` waits for the job events' advisory lock."""
    async with engine.connect() as conn:
        found = await conn.execute(
            text(
                "SELECT count(*) FROM pg_locks WHERE pid = :pid AND NOT granted AND locktype = 'advisory'"
                " AND ((classid::bigint << 32) | objid::bigint) = :key"
            ),
            {"pid": pid, "key": JOB_EVENTS_LOCK_KEY},
        )
        return bool(found.scalar_one())


async def test_two_outcome_batches_locking_jobs_in_opposite_orders_both_commit(
    two_admitted: tuple[AsyncEngine, str, str],
) -> None:
    engine, first, second = two_admitted
    sessions = make_session_factory(engine)
    placed_first = asyncio.Event()
    running_second_done = asyncio.Event()
    other_pid: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def uow() -> AdmissionUnitOfWork:
        return AdmissionUnitOfWork(sessions, orm.outbox, orm.inbox, "admission")

    async def scheduler_batch() -> None:  # admission-scheduler-outcomes: [placed first, placed second]
        async with uow() as work:
            await handle_scheduler_event(envelope(placed(first), "tessera/scheduler"), work)
            placed_first.set()
            # the other batch has locked `second`, or waits for its turn: either way, go on
            pid = await other_pid

            async def locked_or_waiting() -> bool:
                return running_second_done.is_set() or await waits_for_its_turn(engine, pid)

            await eventually(locked_or_waiting, what="the other batch to lock `second` or wait")
            await handle_scheduler_event(envelope(placed(second), "tessera/scheduler"), work)
            await work.commit()

    async def outcome_batch() -> None:  # admission-outcomes: [running second, running first]
        await placed_first.wait()
        async with uow() as work:
            other_pid.set_result((await work.session.execute(text("SELECT pg_backend_pid()"))).scalar_one())
            await handle_outcome_command(running(second), work)
            running_second_done.set()
            await handle_outcome_command(running(first), work)
            await work.commit()

    results = await asyncio.gather(scheduler_batch(), outcome_batch(), return_exceptions=True)
    assert [r for r in results if r is not None] == [], "no batch fails (a deadlock aborts one)"
    async with engine.connect() as conn:
        states = await conn.execute(
            text("SELECT id, state FROM admission.jobs WHERE id IN (:a, :b)"), {"a": first, "b": second}
        )
        assert {row.id: row.state for row in states} == {first: "running", second: "running"}
