"""The consumer's savepoints on real PostgreSQL: a batch takes none on its happy path when its handlers
are replay-safe and one per message after the first otherwise; whatever fails, a failing message rolls
back alone, nothing is lost or recorded twice, and a handler that is not replay-safe never runs twice."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import MetaData, event, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from tessera.contracts.events import SubmitJob
from tessera.core.db.engine import make_engine, make_session_factory
from tessera.core.db.messaging_tables import add_messaging_tables
from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.consumer import ConsumerRunner, ConsumerSpec
from tessera.core.messaging.envelope import Envelope, encode
from tessera.core.observability.metrics import Metrics
from tessera.core.settings import ConsumerSettings

pytestmark = pytest.mark.integration

SCHEMA = "savepoint_test"
metadata = MetaData(schema=SCHEMA)
outbox, inbox = add_messaging_tables(metadata)


@pytest.fixture
async def db(fresh_database: str) -> AsyncIterator[tuple[AsyncEngine, async_sessionmaker[AsyncSession]]]:
    engine = make_engine(fresh_database)
    async with engine.begin() as conn:
        await conn.execute(text(f"CREATE SCHEMA {SCHEMA}"))
        await conn.run_sync(metadata.create_all)
        await conn.execute(text(f"CREATE TABLE {SCHEMA}.effects (job TEXT PRIMARY KEY)"))
    try:
        yield engine, make_session_factory(engine)
    finally:
        await engine.dispose()


class Msg:
    def __init__(self, job_id: str) -> None:
        self.subject, self.headers, self.data = encode(SubmitJob(job_id=job_id, spec={}), "test")
        self.metadata = SimpleNamespace(num_delivered=1, sequence=SimpleNamespace(stream=1))
        self.settled: list[str] = []

    async def ack(self) -> None:
        self.settled.append("ack")

    async def nak(self, delay: float | None = None) -> None:
        self.settled.append("nak")

    async def term(self) -> None:
        self.settled.append("term")

    async def in_progress(self) -> None:
        return None


class Handler:
    """Writes the job into `effects`; `raising` jobs raise after writing, `clashing` ones make the
    database refuse a statement (the transaction is then aborted until rolled back)."""

    def __init__(self, raising: Iterable[str] = (), clashing: Iterable[str] = ()) -> None:
        self.raising, self.clashing = set(raising), set(clashing)
        self.runs: Counter[str] = Counter()

    async def __call__(self, envelope: Envelope, uow: UnitOfWork) -> None:
        job = envelope.subject or ""
        self.runs[job] += 1
        await uow.session.execute(text(f"INSERT INTO {SCHEMA}.effects (job) VALUES (:job)"), {"job": job})
        if job in self.clashing:  # the same key again: a unique violation aborts the transaction
            await uow.session.execute(text(f"INSERT INTO {SCHEMA}.effects (job) VALUES (:job)"), {"job": job})
        if job in self.raising:
            raise RuntimeError(f"{job} fails")


def consumer(
    sessions: async_sessionmaker[AsyncSession], handler: Handler, *, replay_safe: bool
) -> ConsumerRunner[UnitOfWork]:
    spec = ConsumerSpec("sp", "admission", "s", handler, replay_safe=replay_safe).configured(
        ConsumerSettings()
    )
    return ConsumerRunner(
        None,  # type: ignore[arg-type]
        spec,
        lambda: UnitOfWork(sessions, outbox, inbox, "tessera/test"),
        "admission",
        Metrics(),
        asyncio.Event(),
    )


@contextmanager
def statements(engine: AsyncEngine) -> Iterator[list[str]]:
    """The SQL statements the engine sends meanwhile."""
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)


def savepoints(sent: list[str]) -> int:
    return sum(1 for statement in sent if statement.lstrip().upper().startswith("SAVEPOINT"))


async def recorded(engine: AsyncEngine) -> tuple[list[str], int]:
    """The jobs in `effects`, and how many inbox rows the consumer holds."""
    async with engine.connect() as conn:
        effects = sorted((await conn.execute(text(f"SELECT job FROM {SCHEMA}.effects"))).scalars())
        rows = len((await conn.execute(select(inbox.c.message_id).where(inbox.c.consumer == "sp"))).all())
    return effects, rows


@pytest.mark.parametrize(("replay_safe", "expected_savepoints"), [(True, 0), (False, 3)])
async def test_a_batch_that_succeeds_takes_no_savepoint_when_replay_safe_and_one_per_later_message_else(
    db: tuple[AsyncEngine, async_sessionmaker[AsyncSession]], replay_safe: bool, expected_savepoints: int
) -> None:
    engine, sessions = db
    handler = Handler()
    msgs = [Msg(f"job-{i}") for i in range(4)]
    with statements(engine) as sent:
        await consumer(sessions, handler, replay_safe=replay_safe).handle_batch(msgs)  # type: ignore[arg-type]
    assert savepoints(sent) == expected_savepoints
    assert sum(1 for statement in sent if "RELEASE" in statement.upper()) == expected_savepoints
    assert [m.settled for m in msgs] == [["ack"]] * 4
    assert handler.runs == Counter({f"job-{i}": 1 for i in range(4)})
    assert await recorded(engine) == ([f"job-{i}" for i in range(4)], 4)


@pytest.mark.parametrize("replay_safe", [True, False])
@pytest.mark.parametrize("failure", ["raising", "clashing"])
@pytest.mark.parametrize("culprit", [0, 2])
async def test_a_failing_message_rolls_back_alone_and_nothing_is_lost_or_recorded_twice(
    db: tuple[AsyncEngine, async_sessionmaker[AsyncSession]], replay_safe: bool, failure: str, culprit: int
) -> None:
    engine, sessions = db
    jobs = [f"job-{i}" for i in range(4)]
    bad = jobs[culprit]
    handler = Handler(**{failure: {bad}})
    msgs = [Msg(job) for job in jobs]
    runner = consumer(sessions, handler, replay_safe=replay_safe)
    await runner.handle_batch(msgs)  # type: ignore[arg-type]

    assert [m.settled for m in msgs] == [["nak"] if job == bad else ["ack"] for job in jobs]
    good = [job for job in jobs if job != bad]
    assert await recorded(engine) == (good, 3), "the others took effect once, the culprit not at all"
    assert handler.runs[bad] == 1, "the failing message is not run again in the same delivery"
    if replay_safe:  # those before the culprit ran again after the rollback, the rest once
        assert [handler.runs[job] for job in good] == [2 if job < bad else 1 for job in good]
    else:
        assert all(handler.runs[job] == 1 for job in good), "a handler that succeeded never runs twice"

    handler.raising.clear()
    handler.clashing.clear()
    again = Msg(bad)
    again.headers = msgs[culprit].headers  # its redelivery
    repeat = Msg(jobs[-1])
    repeat.headers = msgs[-1].headers  # a redelivery of one handled already
    await runner.handle_batch([again, repeat])  # type: ignore[list-item]
    assert (again.settled, repeat.settled) == (["ack"], ["ack"])
    assert await recorded(engine) == (jobs, 4)
    assert handler.runs[jobs[-1]] == 1, "the repeat is a duplicate"


@pytest.mark.parametrize(
    ("replay_safe", "jobs"),
    [
        (False, ["dup", "dup", "job-1"]),  # the first handled message: no savepoint, the batch restarts
        (True, ["job-1", "dup", "dup"]),  # replay-safe: no savepoint either, the batch restarts
        (False, ["job-1", "dup", "dup"]),  # after a success: a savepoint rolls the failure back alone
    ],
)
async def test_a_failing_event_delivered_twice_in_one_batch_is_handled_on_redelivery(
    db: tuple[AsyncEngine, async_sessionmaker[AsyncSession]], replay_safe: bool, jobs: list[str]
) -> None:
    """Two copies of one event (the same ce-id) in one batch, the first failing transiently: no copy
    may be acked until the event took effect, so a redelivery of the failed copy is handled."""
    engine, sessions = db
    handler = Handler(raising={"dup"})
    msgs = [Msg(job) for job in jobs]
    first = jobs.index("dup")
    msgs[first + 1].headers, msgs[first + 1].data = msgs[first].headers, msgs[first].data
    runner = consumer(sessions, handler, replay_safe=replay_safe)
    await runner.handle_batch(msgs)  # type: ignore[arg-type]
    assert handler.runs["dup"] == 1
    assert msgs[first].settled == ["nak"]

    handler.raising.clear()
    redelivered = []
    for msg in msgs:
        if msg.settled == ["nak"]:
            again = Msg("dup")
            again.headers, again.data = msg.headers, msg.data
            redelivered.append(again)
    await runner.handle_batch(redelivered)  # type: ignore[arg-type]
    assert await recorded(engine) == (["dup", "job-1"], 2), "the event took effect, once"
    assert handler.runs["dup"] == 2
    assert all(again.settled == ["ack"] for again in redelivered)
