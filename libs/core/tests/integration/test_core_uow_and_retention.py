"""The unit of work on real PostgreSQL: events aggregates record reach the outbox only with their
commit; retention deletes what is older than its rule, by a clock the test controls."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import MetaData, func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from tessera.contracts.base import Message
from tessera.contracts.events import JobFinished
from tessera.core.db.engine import make_engine, make_session_factory
from tessera.core.db.messaging_tables import add_messaging_tables
from tessera.core.db.retention import RetentionRule, purge
from tessera.core.db.uow import UnitOfWork

pytestmark = pytest.mark.integration

metadata = MetaData(schema="shape_test")
outbox, inbox = add_messaging_tables(metadata)


class Job:
    """A stand-in aggregate: it records what it causes and carries its own trace."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.events: list[Message] = []
        self.trace_headers = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}

    def finish(self) -> None:
        self.events.append(
            JobFinished(job_id=self.job_id, state="succeeded", reason="done", at=datetime.now(UTC))
        )


@pytest.fixture
async def db(fresh_database: str) -> AsyncIterator[tuple[AsyncEngine, async_sessionmaker[AsyncSession]]]:
    engine = make_engine(fresh_database)
    async with engine.begin() as conn:
        await conn.execute(text("CREATE SCHEMA shape_test"))
        await conn.run_sync(metadata.create_all)
    try:
        yield engine, make_session_factory(engine)
    finally:
        await engine.dispose()


async def count(engine: AsyncEngine, table: object) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())  # type: ignore[arg-type]


async def test_tracked_aggregates_publish_their_events_on_commit_in_their_own_trace(
    db: tuple[AsyncEngine, async_sessionmaker[AsyncSession]],
) -> None:
    engine, sessions = db
    woken: list[bool] = []
    job = Job("j1")
    async with UnitOfWork(
        sessions, outbox, inbox, "tessera/test", after_commit=lambda: woken.append(True)
    ) as uow:
        uow.track(job)
        job.finish()
        await uow.commit()
    async with engine.connect() as conn:
        rows = (await conn.execute(select(outbox.c.subject, outbox.c.headers))).all()
    assert [r.subject for r in rows] == ["tessera.admission.evt.job_finished"]
    assert rows[0].headers["traceparent"] == job.trace_headers["traceparent"]
    assert job.events == [] and woken == [True]


async def test_events_of_a_rolled_back_unit_never_reach_the_outbox(
    db: tuple[AsyncEngine, async_sessionmaker[AsyncSession]],
) -> None:
    engine, sessions = db
    job = Job("j2")
    async with UnitOfWork(sessions, outbox, inbox, "tessera/test") as uow:
        uow.track(job)
        job.finish()
        await uow.flush_events()
    assert await count(engine, outbox) == 0


async def test_publish_many_writes_every_event_in_one_transaction(
    db: tuple[AsyncEngine, async_sessionmaker[AsyncSession]],
) -> None:
    engine, sessions = db
    now = datetime.now(UTC)
    async with UnitOfWork(sessions, outbox, inbox, "tessera/test") as uow:
        ids = await uow.publish_many(
            JobFinished(job_id=f"j{i}", state="failed", reason="x", at=now) for i in range(50)
        )
        await uow.commit()
    assert len(set(ids)) == 50 and await count(engine, outbox) == 50


async def test_retention_deletes_only_rows_older_than_the_rule_at_the_given_time(
    db: tuple[AsyncEngine, async_sessionmaker[AsyncSession]],
) -> None:
    engine, sessions = db
    async with UnitOfWork(sessions, outbox, inbox, "tessera/test") as uow:
        for i in range(3):
            await uow.seen("c", f"m{i}")
        await uow.commit()
    async with engine.begin() as conn:  # one of them was handled two hours ago
        await conn.execute(
            text(
                "UPDATE shape_test.inbox SET received_at = now() - interval '2 hours' WHERE message_id = 'm0'"
            )
        )
    rules = [RetentionRule(inbox, "received_at", 3600)]
    now = datetime.now(UTC)
    assert await purge(sessions, rules, now) == {"shape_test.inbox": 1}
    assert await count(engine, inbox) == 2
    assert await purge(sessions, rules, now) == {"shape_test.inbox": 0}
    assert await purge(sessions, rules, now + timedelta(hours=2)) == {"shape_test.inbox": 2}
    assert await count(engine, inbox) == 0


async def test_a_new_schema_s_first_migration_creates_its_outbox_its_dead_letters_and_inbox(
    fresh_database: str,
) -> None:
    from alembic.migration import MigrationContext
    from alembic.operations import Operations
    from sqlalchemy import inspect

    from tessera.core.db.messaging_tables import create_messaging_tables, drop_messaging_tables

    def migrate_and_inspect(conn: Any, create: bool) -> set[str]:
        with Operations.context(MigrationContext.configure(conn)):
            (create_messaging_tables if create else drop_messaging_tables)("fresh_service")
        return set(inspect(conn).get_table_names(schema="fresh_service"))

    engine = make_engine(fresh_database)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("CREATE SCHEMA fresh_service"))
            assert await conn.run_sync(migrate_and_inspect, True) == {
                "outbox",
                "outbox_dead_letters",
                "inbox",
            }
            indexes = await conn.run_sync(
                lambda sync: {i["name"] for i in inspect(sync).get_indexes("outbox", schema="fresh_service")}
            )
            assert "ix_outbox_unpublished" in indexes
            assert await conn.run_sync(migrate_and_inspect, False) == set()
    finally:
        await engine.dispose()
