"""The bus's batching on real PostgreSQL: the relay keeps each row's own publish outcome, the consumer
takes a batch's inbox rows with one statement yet lets a failing message roll back alone, and the
engine replaces a connection the server closed while it was pooled."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from nats.js.api import PubAck
from sqlalchemy import MetaData, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from tessera.contracts.events import SubmitJob
from tessera.core.db.engine import PING_IDLE_S, make_engine, make_session_factory
from tessera.core.db.messaging_tables import add_messaging_tables
from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.consumer import ConsumerRunner, ConsumerSpec
from tessera.core.messaging.envelope import Envelope, encode
from tessera.core.messaging.outbox import OutboxRelay
from tessera.core.observability.metrics import Metrics
from tessera.core.settings import ConsumerSettings

pytestmark = pytest.mark.integration

metadata = MetaData(schema="bus_test")
outbox, inbox = add_messaging_tables(metadata)


@pytest.fixture
async def db(fresh_database: str) -> AsyncIterator[tuple[AsyncEngine, async_sessionmaker[AsyncSession]]]:
    engine = make_engine(fresh_database)
    async with engine.begin() as conn:
        await conn.execute(text("CREATE SCHEMA bus_test"))
        await conn.run_sync(metadata.create_all)
    try:
        yield engine, make_session_factory(engine)
    finally:
        await engine.dispose()


def uow_factory(sessions: async_sessionmaker[AsyncSession]) -> UnitOfWork:
    return UnitOfWork(sessions, outbox, inbox, "tessera/test")


async def fill_outbox(sessions: async_sessionmaker[AsyncSession], job_ids: list[str]) -> None:
    async with uow_factory(sessions) as uow:
        for job_id in job_ids:
            await uow.publish(SubmitJob(job_id=job_id, spec={}))
        await uow.commit()


async def outbox_jobs(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as conn:
        rows = (await conn.execute(select(outbox.c.headers).order_by(outbox.c.seq))).all()
    return [row.headers["ce-subject"] for row in rows]


class JetStream:
    """Answers each publish as told by the job id in its headers: ack, error, silence, refusal (the
    connection is closed) or a publish that never returns."""

    def __init__(self, answers: dict[str, str] | None = None) -> None:
        self.answers = answers or {}
        self.sent: list[str] = []
        self.seq = 0

    async def publish_async(
        self, subject: str, body: bytes, headers: dict[str, str], wait_stall: float | None = None
    ) -> asyncio.Future[PubAck]:
        job_id = headers["ce-subject"]
        answer = self.answers.get(job_id, "ack")
        if answer == "refuse":
            raise ConnectionResetError("the connection is closed")
        if answer == "hang":
            await asyncio.Event().wait()
        self.sent.append(job_id)
        future: asyncio.Future[PubAck] = asyncio.get_running_loop().create_future()
        if answer == "ack":
            self.seq += 1
            future.set_result(PubAck(stream="TESSERA_ADMISSION", seq=self.seq))
        elif answer == "error":
            future.set_exception(RuntimeError("the stream refused it"))
        return future  # "silent": never answered, so it times out


def relay(js: JetStream, sessions: async_sessionmaker[AsyncSession]) -> OutboxRelay:
    return OutboxRelay(js, sessions, outbox, Metrics(), asyncio.Event(), ack_timeout_s=0.2)  # type: ignore[arg-type]


async def test_the_relay_deletes_only_acked_rows_and_publishes_a_failed_one_again_alone(
    db: tuple[AsyncEngine, async_sessionmaker[AsyncSession]],
) -> None:
    engine, sessions = db
    await fill_outbox(sessions, ["j1", "j2", "j3", "j4", "j5", "j6"])
    js = JetStream({"j2": "error", "j4": "silent", "j6": "refuse"})

    assert await relay(js, sessions).publish_batch_outcomes() == (3, 3)
    assert js.sent == ["j1", "j2", "j3", "j4", "j5"], "published in outbox order, all in flight at once"
    assert await outbox_jobs(engine) == ["j2", "j4", "j6"], "what failed stays, in order"

    js.answers, js.sent = {}, []
    assert await relay(js, sessions).publish_batch_outcomes() == (3, 0)
    assert js.sent == ["j2", "j4", "j6"], "nothing that was acked is published again"
    assert await outbox_jobs(engine) == []


async def test_a_refused_publish_ends_the_rounds_sending_and_the_rest_stay_for_the_next(
    db: tuple[AsyncEngine, async_sessionmaker[AsyncSession]],
) -> None:
    """The connection is closed under the relay: the rows after it would fail, or pile up in the
    reconnect buffer, alike; they are not sent this round, and count against no row."""
    engine, sessions = db
    await fill_outbox(sessions, ["j1", "j2", "j3", "j4"])
    js = JetStream({"j2": "refuse"})
    r = relay(js, sessions)
    r.max_attempts = 1  # were it counted, one round would move a row to the dead-letter table

    assert await r.publish_batch_outcomes() == (1, 3)
    assert js.sent == ["j1"] and await outbox_jobs(engine) == ["j2", "j3", "j4"]
    js.answers = {}
    assert await r.publish_batch_outcomes() == (3, 0)
    assert js.sent == ["j1", "j2", "j3", "j4"] and await outbox_jobs(engine) == []


async def test_a_publish_that_never_returns_ends_the_round_in_bounded_time(
    db: tuple[AsyncEngine, async_sessionmaker[AsyncSession]],
) -> None:
    """Waiting on nats.py (a pending-ack slot that never comes free, a stuck write) has a deadline:
    the round ends, releasing its rows' locks, and the rows stay."""
    engine, sessions = db
    await fill_outbox(sessions, ["j1", "j2", "j3"])
    js = JetStream({"j2": "hang"})
    r = relay(js, sessions)
    r.max_attempts = 1

    assert await asyncio.wait_for(r.publish_batch_outcomes(), timeout=10) == (1, 2)
    assert js.sent == ["j1"] and await outbox_jobs(engine) == ["j2", "j3"]
    js.answers = {}
    assert await r.publish_batch_outcomes() == (2, 0)
    assert await outbox_jobs(engine) == []


async def test_the_relay_drains_more_rows_than_one_batch_in_order(
    db: tuple[AsyncEngine, async_sessionmaker[AsyncSession]],
) -> None:
    engine, sessions = db
    job_ids = [f"j{i:03d}" for i in range(25)]
    await fill_outbox(sessions, job_ids)
    js = JetStream()
    r = relay(js, sessions)
    r.batch = 10
    assert [await r.publish_batch() for _ in range(4)] == [10, 10, 5, 0]
    assert js.sent == job_ids and await outbox_jobs(engine) == []


async def test_a_round_gives_the_event_loop_a_turn_every_64_rows_it_sends(
    db: tuple[AsyncEngine, async_sessionmaker[AsyncSession]],
) -> None:
    """A publish with a PubAck slot free does not suspend: a full batch must not hold the loop."""
    engine, sessions = db
    await fill_outbox(sessions, [f"j{i:03d}" for i in range(200)])
    js = JetStream()  # answers at once, without suspending, as a free slot does
    seen: list[int] = []
    watching = True

    async def watch() -> None:
        while watching:
            seen.append(len(js.sent))
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    try:
        assert await relay(js, sessions).publish_batch_outcomes() == (200, 0)
    finally:
        watching = False
        await watcher
    gaps = [after - before for before, after in itertools.pairwise(seen)]
    assert max(gaps) <= 64, f"{max(gaps)} rows sent without a turn of the loop"  # before: 200
    assert await outbox_jobs(engine) == []


class CountingRelay(OutboxRelay):
    """Tells how many rows each round published."""

    rounds: asyncio.Queue[int]

    async def publish_batch_outcomes(self) -> tuple[int, int]:
        outcome = await super().publish_batch_outcomes()
        self.rounds.put_nowait(outcome[0])
        return outcome


async def test_commits_that_wake_the_relay_together_go_out_in_one_round(
    db: tuple[AsyncEngine, async_sessionmaker[AsyncSession]],
) -> None:
    engine, sessions = db
    js, stop = JetStream(), asyncio.Event()
    r = CountingRelay(js, sessions, outbox, Metrics(), stop, poll_s=60, linger_s=3.0)  # type: ignore[arg-type]
    r.rounds = asyncio.Queue()
    task = asyncio.create_task(r.run())
    try:
        # the first round finds the outbox empty, then the relay waits for a wake
        assert await asyncio.wait_for(r.rounds.get(), timeout=30) == 0
        await fill_outbox(sessions, ["j1"])
        r.wake()
        await fill_outbox(sessions, ["j2", "j3"])  # committed while the relay lingers
        r.wake()
        published = await asyncio.wait_for(r.rounds.get(), timeout=30)
    finally:
        stop.set()
        r.wake()
        await task
    assert published == 3, "the woken relay waited for the commits of that moment"
    assert js.sent == ["j1", "j2", "j3"] and await outbox_jobs(engine) == []


def test_a_negative_linger_is_refused() -> None:
    with pytest.raises(ValueError, match="linger_s must not be negative"):
        OutboxRelay(JetStream(), None, outbox, Metrics(), asyncio.Event(), linger_s=-1)  # type: ignore[arg-type]


class Msg:
    def __init__(self, job_id: str, event_id: str | None = None) -> None:
        self.subject, self.headers, self.data = encode(SubmitJob(job_id=job_id, spec={}), "test")
        if event_id is not None:
            self.headers = {**self.headers, "ce-id": event_id, "Nats-Msg-Id": event_id}
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


async def inbox_ids(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as conn:
        return set((await conn.execute(select(inbox.c.message_id))).scalars())


async def test_a_batch_takes_its_inbox_rows_at_once_and_a_failing_message_rolls_back_alone(
    db: tuple[AsyncEngine, async_sessionmaker[AsyncSession]],
) -> None:
    engine, sessions = db
    failing = {"job-bad"}
    handled: list[str] = []

    async def handler(envelope: Envelope, uow: UnitOfWork) -> None:
        # a state change in the handler's savepoint, which must vanish with a failure
        await uow.session.execute(
            text("INSERT INTO bus_test.inbox (consumer, message_id) VALUES ('effects', :id)"),
            {"id": envelope.id},
        )
        if envelope.subject in failing:
            raise RuntimeError("the handler fails")
        handled.append(envelope.subject or "")

    spec = ConsumerSpec("test-consumer", "admission", "s", handler).configured(ConsumerSettings())
    runner: ConsumerRunner[UnitOfWork] = ConsumerRunner(
        None,  # type: ignore[arg-type]
        spec,
        lambda: uow_factory(sessions),
        "admission",
        Metrics(),
        asyncio.Event(),
    )
    before = Msg("job-before")
    await runner.handle_batch([before])  # type: ignore[list-item]
    assert handled == ["job-before"] and before.settled == ["ack"]

    ok, bad, again, twice = Msg("job-ok"), Msg("job-bad"), Msg("job-before", before.headers["ce-id"]), None
    twice = Msg("job-ok", ok.headers["ce-id"])  # the same event twice in one batch
    await runner.handle_batch([ok, bad, again, twice])  # type: ignore[list-item]
    assert handled == ["job-before", "job-ok"], "the redelivery and the repeat had no effect"
    assert [m.settled for m in (ok, bad, again, twice)] == [["ack"], ["nak"], ["ack"], ["ack"]]
    ids = {m.headers["ce-id"] for m in (before, ok, bad)}
    effects = {m.headers["ce-id"] for m in (before, ok)}
    async with engine.connect() as conn:
        rows = (await conn.execute(select(inbox.c.consumer, inbox.c.message_id))).all()
    assert {r.message_id for r in rows if r.consumer == "test-consumer"} == effects
    assert {r.message_id for r in rows if r.consumer == "effects"} == effects, "the failure rolled back alone"
    assert bad.headers["ce-id"] in ids

    failing.clear()
    redelivered = Msg("job-bad", bad.headers["ce-id"])
    await runner.handle_batch([redelivered])  # type: ignore[list-item]
    assert handled[-1] == "job-bad" and redelivered.settled == ["ack"], (
        "a failed message is handled on redelivery"
    )


async def test_seen_many_reports_what_was_recorded_before(
    db: tuple[AsyncEngine, async_sessionmaker[AsyncSession]],
) -> None:
    _, sessions = db
    async with uow_factory(sessions) as uow:
        assert await uow.seen_many("c", ["a", "b", "a"]) == set()
        await uow.commit()
    async with uow_factory(sessions) as uow:
        assert await uow.seen_many("c", ["b", "c"]) == {"b"}
        await uow.unsee("c", ["c"])
        await uow.commit()
    async with uow_factory(sessions) as uow:
        assert await uow.seen_many("c", ["c"]) == set()
        assert await uow.seen_many("other", ["a"]) == set(), "each consumer has its own inbox"
        assert await uow.seen_many("c", []) == set()


async def test_a_pooled_connection_the_server_closed_is_replaced_and_a_busy_one_not_pinged(
    fresh_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(fresh_database, pool_size=1)
    pings: list[Any] = []
    real_ping = engine.dialect.do_ping

    def counting_ping(dbapi_connection: Any) -> bool:
        pings.append(dbapi_connection)
        return bool(real_ping(dbapi_connection))

    monkeypatch.setattr(engine.dialect, "do_ping", counting_ping)
    try:
        async with engine.connect() as conn:
            pid = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        for _ in range(3):  # back to back: no round trip spent on pings
            async with engine.connect() as conn:
                assert (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one() == pid
        assert pings == []

        admin = make_engine(fresh_database, pool_size=1)
        try:
            async with admin.connect() as conn:
                await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        finally:
            await admin.dispose()
        await asyncio.sleep(0.3)  # the event loop reads the server's goodbye
        async with engine.connect() as conn:  # no error: a new connection, not the dead one
            assert (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one() != pid
        assert pings == []
        await asyncio.sleep(PING_IDLE_S + 0.1)
        async with engine.connect() as conn:  # idle long enough for a server to go away unseen
            await conn.execute(text("SELECT 1"))
        assert len(pings) == 1
    finally:
        await engine.dispose()
