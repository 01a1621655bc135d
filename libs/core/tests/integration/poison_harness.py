"""A consumer on real NATS and PostgreSQL whose handler misbehaves on cue, for the poison tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from tessera.contracts import subjects
from tessera.contracts.events import SubmitJob
from tessera.core.db.engine import make_engine, make_session_factory
from tessera.core.db.messaging_tables import add_messaging_tables
from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.consumer import ConsumerRunner, ConsumerSpec, DeadLetter, PermanentError
from tessera.core.messaging.envelope import Envelope, encode
from tessera.core.messaging.limits import wire_size
from tessera.core.messaging.streams import StreamLimits, ensure_stream
from tessera.core.observability.metrics import Metrics
from tessera.core.settings import ConsumerSettings
from tessera.testing.services import read_messages, reset_jetstream

SCHEMA = "consumer_poison"
CONSUMER = "poison-test"
metadata = MetaData(schema=SCHEMA)
outbox, inbox = add_messaging_tables(metadata)
DLQ = subjects.dead_letter("admission", CONSUMER)
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@dataclass
class Behaviour:
    """The handler's cue: what each job id makes it do, and what it saw."""

    handled: list[str] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=dict)
    letters: list[DeadLetter] = field(default_factory=list)

    async def handle(self, envelope: Envelope, uow: UnitOfWork) -> None:
        job_id = envelope.subject
        self.attempts[job_id] = self.attempts.get(job_id, 0) + 1
        if job_id.startswith("overflow"):
            await uow.session.execute(text("SELECT 2147483648::int4"))  # SQLSTATE 22003, every time
        if job_id.startswith("refused"):
            raise PermanentError("this handler refuses it")
        if job_id.startswith("flaky") and self.attempts[job_id] == 1:
            raise RuntimeError("a transient failure")
        self.handled.append(job_id)

    async def on_dead_letter(self, letter: DeadLetter, uow: UnitOfWork) -> None:
        self.letters.append(letter)


@dataclass
class Bus:
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    nc: NATS
    nats_url: str
    database_url: str

    def uow(self) -> UnitOfWork:
        return UnitOfWork(self.sessions, outbox, inbox, "tessera/test")

    async def publish(
        self,
        job_id: str,
        *,
        padding: int = 0,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
    ) -> int:
        """Publish a submit_job command straight to the stream; its stream sequence."""
        message = SubmitJob(job_id=job_id, spec={"padding": "x" * padding} if padding else {})
        subject, encoded, data = encode(
            message, "tessera/test", event_id=f"evt-{job_id}", trace_headers={"traceparent": TRACEPARENT}
        )
        ack = await self.nc.jetstream().publish(
            subject, data if body is None else body, headers={**encoded, **(headers or {})}
        )
        return ack.seq

    @staticmethod
    def padding_to(job_id: str, total: int) -> int:
        """The padding that makes `job_id`'s message `total` bytes on the wire, headers included."""
        _, headers, body = encode(
            SubmitJob(job_id=job_id, spec={"padding": ""}),
            "tessera/test",
            event_id=f"evt-{job_id}",
            trace_headers={"traceparent": TRACEPARENT},
        )
        return total - wire_size(headers, body)

    async def dead_letters(self) -> list[Msg]:
        return await read_messages(self.nc.jetstream(), DLQ, idle_s=0.3)


@contextlib.asynccontextmanager
async def open_bus(nats_url: str, database_url: str) -> AsyncIterator[Bus]:
    await reset_jetstream(nats_url)
    engine = make_engine(database_url)
    async with engine.begin() as conn:
        await conn.execute(text(f"CREATE SCHEMA {SCHEMA}"))
        await conn.run_sync(metadata.create_all)
    nc = await nats.connect(nats_url)
    await ensure_stream(nc.jetstream(), "admission", StreamLimits())
    try:
        yield Bus(engine, make_session_factory(engine), nc, nats_url, database_url)
    finally:
        await nc.close()
        await engine.dispose()


def spec(behaviour: Behaviour, **settings: object) -> ConsumerSpec[UnitOfWork]:
    delivery = ConsumerSettings.model_validate(
        {"max_deliver": 4, "ack_wait_s": 5.0, "backoff_base_s": 0.05, "backoff_max_s": 0.2, **settings}
    )
    return ConsumerSpec(
        CONSUMER,
        "admission",
        subjects.SUBMIT_JOB,
        behaviour.handle,
        delivery,
        on_dead_letter=behaviour.on_dead_letter,
    )


@contextlib.asynccontextmanager
async def consuming(
    bus: Bus, behaviour: Behaviour, nc: NATS | None = None, metrics: Metrics | None = None, **settings: object
) -> AsyncIterator[ConsumerRunner[UnitOfWork]]:
    connection = nc or bus.nc
    stop = asyncio.Event()
    runner = ConsumerRunner(
        connection.jetstream(),
        spec(behaviour, **settings),
        bus.uow,
        "admission",
        metrics or Metrics(),
        stop,
        max_payload=lambda: connection.max_payload,
    )
    task = asyncio.create_task(runner.run())
    try:
        yield runner
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)
