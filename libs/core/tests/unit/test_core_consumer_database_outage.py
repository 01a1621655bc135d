"""The consumer holds a batch while the database is down, instead of spending its deliveries."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

from tessera.contracts.events import SubmitJob
from tessera.core.messaging.consumer import ConsumerRunner, ConsumerSpec
from tessera.core.messaging.envelope import Envelope, encode
from tessera.core.observability.metrics import Metrics
from tessera.core.settings import ConsumerSettings


class Database:
    """Down until it has been probed `down_for_probes` times; an inbox of handled message ids."""

    def __init__(self, down_for_probes: int) -> None:
        self.down = down_for_probes > 0
        self.probes_left = down_for_probes
        self.inbox: set[tuple[str, str]] = set()
        """(consumer, message id)"""
        self.handled: list[str] = []

    def check(self) -> None:
        if self.down:
            raise ConnectionRefusedError(111, "Connect call failed")


class UnitOfWork:
    """Just what the consumer uses of a unit of work, on the fake database."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.pending: set[tuple[str, str]] = set()

    async def __aenter__(self) -> UnitOfWork:
        return self

    async def __aexit__(self, *_: object) -> None:
        self.pending = set()

    @property
    def session(self) -> UnitOfWork:
        return self

    @asynccontextmanager
    async def begin_nested(self) -> AsyncIterator[None]:
        self.db.check()
        yield

    async def execute(self, _: object) -> None:  # the consumer's probe, SELECT 1
        if self.db.down:
            self.db.probes_left -= 1
            self.db.down = self.db.probes_left > 0
            raise ConnectionRefusedError(111, "Connect call failed")

    async def seen(self, consumer: str, message_id: str) -> bool:
        return bool(await self.seen_many(consumer, [message_id]))

    async def seen_many(self, consumer: str, message_ids: list[str]) -> set[str]:
        self.db.check()
        duplicates = {m for m in message_ids if (consumer, m) in self.db.inbox}
        self.pending |= {(consumer, m) for m in message_ids} - self.db.inbox
        return duplicates

    async def unsee(self, consumer: str, message_ids: list[str]) -> None:
        self.db.check()
        self.pending -= {(consumer, m) for m in message_ids}

    async def flush_events(self) -> None:
        self.db.check()

    def forget_events(self) -> None:
        return None

    async def commit(self) -> None:
        self.db.check()
        self.db.inbox |= self.pending


class Msg:
    def __init__(self, job_id: str) -> None:
        self.subject, self.headers, self.data = encode(SubmitJob(job_id=job_id, spec={}), "test")
        self.metadata = SimpleNamespace(num_delivered=1, sequence=SimpleNamespace(stream=1))
        self.settled: list[str] = []
        self.in_progress_calls = 0
        self.held = asyncio.Event()

    async def ack(self) -> None:
        self.settled.append("ack")

    async def nak(self, delay: float | None = None) -> None:
        self.settled.append("nak")

    async def term(self) -> None:
        self.settled.append("term")

    async def in_progress(self) -> None:
        self.in_progress_calls += 1
        self.held.set()


class JetStream:
    def __init__(self) -> None:
        self.published: list[str] = []

    async def publish(self, subject: str, *_: Any, **__: Any) -> None:
        self.published.append(subject)


def runner(db: Database, js: JetStream, fail_handler: bool = False) -> ConsumerRunner[Any]:
    async def handler(envelope: Envelope, uow: Any) -> None:
        if fail_handler:
            raise RuntimeError("the handler fails, the database is fine")
        db.handled.append(envelope.subject)

    settings = ConsumerSettings(backoff_base_s=0.01, backoff_max_s=0.05, ack_wait_s=1.0)
    spec = ConsumerSpec("admission-submit", "admission", "s", handler).configured(settings)
    return ConsumerRunner(js, spec, lambda: UnitOfWork(db), "admission", Metrics(), asyncio.Event())  # type: ignore[arg-type, return-value]


async def test_a_batch_met_by_a_database_outage_is_held_then_handled_once() -> None:
    db, js = Database(down_for_probes=3), JetStream()
    msgs = [Msg("job-1"), Msg("job-2")]
    await runner(db, js).handle_batch(msgs)  # type: ignore[arg-type]
    assert db.handled == ["job-1", "job-2"]
    assert [m.settled for m in msgs] == [["ack"], ["ack"]], "no delivery spent, nothing dead-lettered"
    assert js.published == []
    assert all(m.in_progress_calls >= 1 for m in msgs), "their ack deadline was extended meanwhile"


async def test_a_handler_failing_while_the_database_answers_is_retried_by_nak() -> None:
    db, js = Database(down_for_probes=0), JetStream()
    msg = Msg("job-1")
    await runner(db, js, fail_handler=True).handle_batch([msg])  # type: ignore[list-item]
    assert (msg.settled, msg.in_progress_calls) == (["nak"], 0)


async def test_stopping_while_the_database_is_down_leaves_the_batch_unsettled() -> None:
    db, js = Database(down_for_probes=1000), JetStream()
    consumer = runner(db, js)
    msg = Msg("job-1")
    handling = asyncio.create_task(consumer.handle_batch([msg]))  # type: ignore[list-item]
    await asyncio.wait_for(msg.held.wait(), timeout=5)
    consumer.stop.set()
    await asyncio.wait_for(handling, timeout=5)
    assert (msg.settled, js.published, db.handled) == ([], [], [])


class FlakyAckMsg(Msg):
    """The connection drops while this message is acked."""

    async def ack(self) -> None:
        raise ConnectionResetError("nats connection lost")


class Subscription:
    """Hands out the given batches, then stops the consumer."""

    def __init__(self, batches: list[list[Msg]], stop: asyncio.Event) -> None:
        self.batches = batches
        self.stop = stop
        self.lingering = False

    async def fetch(self, batch: int, **__: Any) -> list[Msg]:
        if self.lingering:  # the linger pull after a batch: nothing more arrives
            self.lingering = False
            raise TimeoutError
        self.lingering = True
        if not self.batches:
            self.stop.set()
            raise TimeoutError
        return self.batches.pop(0)

    async def unsubscribe(self) -> None:
        return None


async def test_a_batch_whose_ack_fails_does_not_end_the_consumer() -> None:
    db, js = Database(down_for_probes=0), JetStream()
    consumer = runner(db, js)
    later = Msg("job-2")
    sub = Subscription([[FlakyAckMsg("job-1")], [later]], consumer.stop)

    async def subscribed() -> Subscription:
        return sub

    consumer._subscribe = subscribed  # type: ignore[method-assign, assignment]
    await asyncio.wait_for(consumer.run(), timeout=10)
    assert db.handled == ["job-1", "job-2"] and later.settled == ["ack"]
