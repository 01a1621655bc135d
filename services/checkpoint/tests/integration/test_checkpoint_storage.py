"""The checkpoint schema on real Postgres: the migrations build exactly the tables the repositories use,
one job has one open request however many units race to ask, and old rows leave by the retention rules."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tessera.checkpoint import bootstrap
from tessera.checkpoint.adapters import orm
from tessera.checkpoint.domain.model import Checkpoint, CheckpointRequest, checkpoint_id
from tessera.checkpoint.domain.signals import NodeSignal
from tessera.checkpoint.service_layer.unit_of_work import CheckpointUnitOfWork
from tessera.core.db.engine import async_url, make_session_factory
from tessera.core.runner import RunningService
from tessera.testing.services import running

pytestmark = pytest.mark.integration
T0 = datetime.now(UTC).replace(microsecond=0)


@pytest.fixture
async def engine(stack: Any) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(async_url(stack.db))
    yield engine
    await engine.dispose()


def unit(engine: AsyncEngine) -> CheckpointUnitOfWork:
    return CheckpointUnitOfWork(make_session_factory(engine), orm.outbox, orm.inbox, "tessera/checkpoint")


async def test_the_migrations_build_the_tables_the_repositories_use(engine: AsyncEngine) -> None:
    def diff(connection: Any) -> list[Any]:
        context = MigrationContext.configure(
            connection, opts={"include_schemas": True, "include_name": _in_checkpoint_schema}
        )
        return list(compare_metadata(context, orm.metadata))

    async with engine.connect() as conn:
        assert await conn.run_sync(diff) == []


def _in_checkpoint_schema(name: str | None, kind: str, parent: Any) -> bool:
    if kind == "schema":
        return name == "checkpoint"
    return not (kind == "table" and name == "alembic_version")


async def test_one_open_request_per_job_whoever_asks(engine: AsyncEngine) -> None:
    async def ask(request_id: str) -> bool:
        async with unit(engine) as uow:
            request = CheckpointRequest.ask(
                request_id, "job-1", "spot_interruption", T0 + timedelta(seconds=30), T0
            )
            added = await uow.requests.add(request)
            await asyncio.sleep(0.05)  # hold the row while the others try
            await uow.commit()
            return added

    added = await asyncio.gather(*(ask(f"r{i}") for i in range(5)))
    assert sorted(added) == [False] * 4 + [True]
    async with unit(engine) as uow:
        request = await uow.requests.open_for("job-1")
        assert request is not None and request.request_id == f"r{added.index(True)}"
        request.time_out(None, T0 + timedelta(seconds=30))
        await uow.requests.save(request)
        await uow.commit()
    async with unit(engine) as uow:  # an ended request makes room for the next one
        assert await uow.requests.add(
            CheckpointRequest.ask("r9", "job-1", "preemption", T0 + timedelta(minutes=1), T0)
        )
        assert await uow.requests.next_deadline() == T0 + timedelta(minutes=1)
        await uow.commit()
    async with unit(engine) as uow:
        outbox = (await uow.session.execute(orm.outbox.select())).all()
    assert len(outbox) == 4, "two save commands, one timeout's two events: the losers sent nothing"


async def test_a_signal_counts_once_per_value_and_checkpoints_once_per_uri(engine: AsyncEngine) -> None:
    signal = NodeSignal("n0", "taint:karpenter.sh/disrupted", "", "node_termination", T0, T0)
    async with unit(engine) as uow:
        assert await uow.signals.note(signal) and not await uow.signals.note(signal)
        assert await uow.signals.note(NodeSignal("n0", signal.key, "v2", "node_termination", T0, T0))
        uri = "file:///c/job-1/s1"
        checkpoint = Checkpoint(checkpoint_id("job-1", uri), "job-1", 1, uri, 10, T0)
        assert await uow.checkpoints.add(checkpoint)
        assert not await uow.checkpoints.add(Checkpoint(checkpoint.id, "job-1", 1, uri, 10, T0))
        await uow.commit()


async def test_ended_requests_finished_jobs_and_old_checkpoints_leave(
    stack: Any, engine: AsyncEngine
) -> None:
    settings = stack.settings(history_retention_h=1, checkpoints_retention_h=2)
    async with running(bootstrap.build(settings), settings) as service:
        async with unit(engine) as uow:
            job = await uow.jobs.get("job-1")
            job.placed({"job-1-0": "n0"}, T0)
            job.finish(T0)
            await uow.jobs.save(job)
            await uow.jobs.get("job-2")
            request = CheckpointRequest.ask("r1", "job-1", "preemption", T0 + timedelta(seconds=1), T0)
            await uow.requests.add(request)
            uri = "file:///c/job-1/s1"
            await uow.checkpoints.add(Checkpoint(checkpoint_id("job-1", uri), "job-1", 1, uri, 10, T0))
            await uow.commit()
        assert await purged(service, T0 + timedelta(minutes=59)) == {}
        assert await purged(service, T0 + timedelta(minutes=61)) == {
            "checkpoint.checkpoint_requests": 1,
            "checkpoint.jobs": 1,
        }
        assert await purged(service, T0 + timedelta(minutes=121)) == {"checkpoint.checkpoints": 1}
        async with engine.connect() as conn:
            assert (await conn.execute(orm.job_pods.select())).all() == [], "the pods went with their job"
            assert [r.job_id for r in (await conn.execute(orm.jobs.select())).all()] == ["job-2"]


async def purged(service: RunningService[Any], now: datetime) -> dict[str, int]:
    service.clock = lambda: now
    return {table: n for table, n in (await service.purge()).items() if n and table != "checkpoint.inbox"}
