"""The scheduler's repository and unit of work on real Postgres: the shapes of the latest GPU
placements, which the fragmentation score learns its typical workload from; and the rules the
handlers' unit tests rely on in memory (a repeated gang is queued once, a withdrawal forces an
earlier request, after-commit callbacks run on commit only)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from tessera.contracts.events import PreemptionRequested, ReadyForEviction
from tessera.core.db.engine import async_url
from tessera.core.db.migrations import migrate
from tessera.scheduler.adapters import orm
from tessera.scheduler.adapters.repository import SqlSchedulerRepository
from tessera.scheduler.config import WorkloadProfileSettings
from tessera.scheduler.domain.placement import OPENB_TYPICAL_WORKLOAD, PodShape
from tessera.scheduler.service_layer.rebuild import learn_typical_workload
from tessera.scheduler.service_layer.repository_port import PlacementRow
from tessera.scheduler.service_layer.unit_of_work import SchedulerUnitOfWork
from tessera.testing.builders import a_job

pytestmark = pytest.mark.integration


@pytest.fixture
async def sessions(fresh_database: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    await asyncio.to_thread(migrate, "scheduler", fresh_database)
    engine = create_async_engine(async_url(fresh_database))
    try:
        yield async_sessionmaker(engine, expire_on_commit=False)
    finally:
        await engine.dispose()


def row(job: str, pod: str, gpus: tuple[tuple[int, int], ...], cpu_milli: int = 4_000) -> PlacementRow:
    return PlacementRow(job, pod, "workers", "gpu-0", gpus, cpu_milli, 16_384)


async def test_recent_gpu_shapes_are_the_latest_gpu_placements_newest_first(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    async with sessions() as session, session.begin():
        await SqlSchedulerRepository(session).record_placements(
            [
                row("job-a", "default/a-0", ((0, 1000), (1, 1000))),
                row("job-a", "default/a-1", ((2, 1000), (3, 1000))),
                row("job-a", "default/a-cpu", (), cpu_milli=500),  # CPU only (or MIG): no GPU milli
            ]
        )
    async with sessions() as session, session.begin():
        await SqlSchedulerRepository(session).record_placements([row("job-b", "default/b-0", ((4, 250),))])

    async with sessions() as session, session.begin():
        repo = SqlSchedulerRepository(session)
        latest = await repo.recent_gpu_shapes(10)
        only_newest = await repo.recent_gpu_shapes(1)
        learnt = await learn_typical_workload(repo, WorkloadProfileSettings())

    pair = PodShape(4_000, 16_384, 2, 1000)
    assert latest == [PodShape(4_000, 16_384, 1, 250), pair, pair]
    assert only_newest == [PodShape(4_000, 16_384, 1, 250)]
    assert learnt == OPENB_TYPICAL_WORKLOAD, "three GPU pods are too few: the cold-start workload stays"


T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def unit(sessions: async_sessionmaker[AsyncSession]) -> SchedulerUnitOfWork:
    return SchedulerUnitOfWork(sessions, orm.outbox, orm.inbox, "tessera/scheduler")


async def test_after_commit_callbacks_run_on_commit_and_never_on_rollback(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    called: list[str] = []
    async with unit(sessions) as uow:
        uow.after_commit(lambda: called.append("rolled back"))
    async with unit(sessions) as uow:
        uow.after_commit(lambda: called.append("committed"))
        assert called == []
        await uow.commit()

    assert called == ["committed"]


async def test_a_gang_is_queued_once_and_a_withdrawal_forces_an_earlier_request(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    spec = a_job("job-1").build()
    async with unit(sessions) as uow:
        first = await uow.repo.add_pending("job-1", spec, T0)
        again = await uow.repo.add_pending("job-1", spec, T0 + timedelta(hours=1))
        await uow.repo.add_preemption(
            PreemptionRequested(
                victim_job_id="job-1",
                preemptor_job_id="job-9",
                reason="InQueuePriority",
                deadline=T0 + timedelta(days=1),
                grace_period_s=30,
                checkpointable=True,
            )
        )
        await uow.repo.add_withdrawal("job-1", "job cancelled: user asked", T0)
        await uow.commit()

    async with unit(sessions) as uow:
        pending = await uow.repo.pending()
        due = await uow.repo.due_preemptions(T0.timestamp())

    assert (first, again) == (True, False)
    assert [(row.job_id, row.submitted_at) for row in pending] == [("job-1", T0)]
    assert [(p.job_id, p.preemptor_job_id) for p in due] == [("job-1", "job-9")], "forced, preemptor kept"


async def test_a_resumed_gang_keeps_the_checkpoint_it_resumes_from(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    uri = "file:///ckpt/job-1/step-40-ab12"
    async with unit(sessions) as uow:
        await uow.repo.add_pending("job-1", a_job("job-1").build(), T0, resume_from=uri)
        await uow.repo.add_pending("job-2", a_job("job-2").build(), T0)
        await uow.commit()

    async with unit(sessions) as uow:
        pending = await uow.repo.pending()

    assert [(row.job_id, row.resume_from) for row in pending] == [("job-1", uri), ("job-2", None)]


def checkpointable_request(victim: str, preemptor: str, deadline: datetime) -> PreemptionRequested:
    return PreemptionRequested(
        victim_job_id=victim,
        preemptor_job_id=preemptor,
        reason="InQueuePriority",
        deadline=deadline,
        grace_period_s=30,
        checkpointable=True,
    )


async def test_a_checkpointable_victim_is_due_on_the_checkpoint_service_s_answer_to_its_own_preemption(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    now = datetime.now(UTC)
    later = now + timedelta(minutes=10)
    async with sessions() as session, session.begin():
        repo = SqlSchedulerRepository(session)
        await repo.add_preemption(checkpointable_request("victim", "high", later))
        # an answer to another preemption of the same victim releases nothing
        await repo.mark_ready_for_eviction(
            ReadyForEviction(job_id="victim", preemptor_job_id="older", reason="checkpoint_saved", at=now)
        )
    async with sessions() as session, session.begin():
        assert await SqlSchedulerRepository(session).due_preemptions(now.timestamp()) == []

    async with sessions() as session, session.begin():
        await SqlSchedulerRepository(session).mark_ready_for_eviction(
            ReadyForEviction(
                job_id="victim",
                preemptor_job_id="high",
                reason="checkpoint_saved",
                checkpoint_uri="file:///ckpt/victim/step-40",
                step=40,
                at=now,
            )
        )
    async with sessions() as session, session.begin():
        repo = SqlSchedulerRepository(session)
        (due,) = await repo.due_preemptions(now.timestamp())
        assert (due.job_id, due.ready) == (
            "victim",
            "checkpoint_saved at step 40 (file:///ckpt/victim/step-40)",
        )
        await repo.remove_preemption("victim")
    async with sessions() as session, session.begin():  # the answers went with the request
        repo = SqlSchedulerRepository(session)
        await repo.add_preemption(checkpointable_request("victim", "high", later))
        assert await repo.due_preemptions(now.timestamp()) == []


async def test_an_answer_that_arrives_before_its_preemption_request_is_kept_for_it(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    now = datetime.now(UTC)
    async with sessions() as session, session.begin():
        await SqlSchedulerRepository(session).mark_ready_for_eviction(
            ReadyForEviction(job_id="victim", preemptor_job_id="high", reason="checkpoint_timeout", at=now)
        )
    async with sessions() as session, session.begin():
        repo = SqlSchedulerRepository(session)
        await repo.add_preemption(checkpointable_request("victim", "high", now + timedelta(minutes=10)))
        (due,) = await repo.due_preemptions(now.timestamp())
        assert due.ready == "checkpoint_timeout"


async def test_a_decision_cycles_writes_go_together_and_are_read_back_in_order(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    async with sessions() as session, session.begin():
        repo = SqlSchedulerRepository(session)
        for job in ("a", "b", "c", "d"):
            assert await repo.add_pending(job, None, T0, source="podgroup")
        await repo.record_placements([row("old", "default/old-0", ((0, 1000),))])

    statements: list[str] = []
    async with sessions() as session, session.begin():
        repo = SqlSchedulerRepository(session)
        await repo.lock_for_decision()
        event.listen(session.sync_session.get_bind(), "before_cursor_execute", _count(statements))
        # A cycle's record: a gang queued, three placed and gone from the queue, one requeued, one
        # job finished.
        assert await repo.add_pending("f", None, T0, source="podgroup")
        for job in ("a", "b", "c"):
            await repo.record_placements([row(job, f"default/{job}-0", ((1, 1000),))])
            await repo.remove_pending(job)
        await repo.record_requeued("d", 2, "unschedulable", "insufficient GPU", T0.timestamp() + 5)
        await repo.release_job("old")
        assert statements == [], "nothing is sent before the cycle reads or commits"
        # Read back within the cycle: what was held back is sent first, one statement per kind.
        assert await repo.pending_ids() == {"d", "f"}
        # insert placements, release the job, queue, dequeue, requeue, select
        assert len(statements) == 6
        # Changes to one row by two kinds keep their order: placed then released, released then placed.
        await repo.record_placements([row("e", "default/e-0", ((2, 1000),))])
        await repo.release_job("e")
        await repo.release_pod("default/c-0")
        await repo.record_placements([row("c", "default/c-0", ((3, 1000),))])
        placed = {p.pod: p.gpus for p in await repo.placements()}
        requeued, queued = await repo.pending()

    assert placed == {
        "default/a-0": ((1, 1000),),
        "default/b-0": ((1, 1000),),
        "default/c-0": ((3, 1000),),
    }
    assert (requeued.job_id, requeued.attempts, requeued.last_reason) == ("d", 2, "insufficient GPU")
    assert (queued.job_id, queued.source, queued.attempts) == ("f", "podgroup", 0)
    assert requeued.backoff_until == T0 + timedelta(seconds=5)


async def test_a_cycles_held_back_writes_commit_with_the_unit_of_work(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    uow = SchedulerUnitOfWork(sessions, orm.outbox, orm.inbox, "scheduler")
    async with uow:
        await uow.repo.add_pending("a", None, T0, source="podgroup")
        await uow.commit()
    async with uow:
        await uow.repo.lock_for_decision()
        await uow.repo.record_placements([row("a", "default/a-0", ((0, 1000),))])
        await uow.repo.remove_pending("a")
        await uow.commit()
    async with uow:
        await uow.repo.lock_for_decision()
        await uow.repo.release_job("a")  # rolled back: never sent, never committed
    async with uow:
        assert [p.pod for p in await uow.repo.placements()] == ["default/a-0"]
        assert await uow.repo.pending_ids() == set()


def _count(statements: list[str]) -> Callable[..., None]:
    def before_cursor_execute(conn: object, cursor: object, statement: str, *args: object) -> None:
        statements.append(statement)

    return before_cursor_execute
