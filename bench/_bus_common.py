"""What `bench.bus` and `bench.bus_stages` share: the bench's event, the servers, a fresh outbox and
inbox with a NATS connection, the bench's stream, the relay and consumer's lifetime, the consumer's
spec and the producers that commit the events."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, ClassVar

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext
from sqlalchemy import MetaData, Table
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from tessera.contracts.base import Message
from tessera.contracts.events import BY_TYPE
from tessera.core.db.engine import async_url, make_engine, make_session_factory
from tessera.core.db.messaging_tables import add_messaging_tables
from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.consumer import ConsumerRunner
from tessera.core.messaging.consumer_spec import ConsumerSpec, Handler
from tessera.core.messaging.outbox import OutboxRelay
from tessera.core.messaging.streams import StreamLimits, ensure_stream
from tessera.core.settings import ConsumerSettings

if TYPE_CHECKING:
    from tessera.testing.infra import ServerHandle

SERVICE = "bench"
#: the relay's poll when no commit wakes it (the services' `outbox_poll_s` is 0.5 s; 0.5 s here cost more
#: CPU per message on a backlog, 370-408 against 323-333 us in one ABBA run, so the bench keeps 10 ms)
RELAY_POLL_S = 0.01


class Ping(Message):
    TYPE: ClassVar[str] = "io.tessera.bench.ping.v1"
    SUBJECT: ClassVar[str] = "tessera.bench.evt.ping"

    n: int
    sent_at: datetime

    def key(self) -> str:
        return str(self.n)


def register_ping() -> None:
    """Make the bench's own event type known, only inside this process."""
    BY_TYPE[Ping.TYPE] = Ping


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def start_servers(nats_url: str | None, database_url: str | None) -> tuple[str, str, list[ServerHandle]]:
    """The NATS and PostgreSQL to use: the URLs given, else embedded ones started here (close the
    handles returned when done)."""
    from tessera.testing.infra import resolve_nats, resolve_postgres

    handles: list[ServerHandle] = []
    if not nats_url:
        handle = resolve_nats()
        handle.start()
        handles.append(handle)
        nats_url = handle.url
    if not database_url:
        pg = resolve_postgres()
        pg.start()
        handles.append(pg)
        database_url = pg.url
    return nats_url, database_url, handles


@dataclass
class Rig:
    """A fresh outbox and inbox in the bench's own schema, an engine on it and a NATS connection;
    `start` runs a relay and a consumer until `close` sets `stop`."""

    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    outbox: Table
    inbox: Table
    nc: Client
    js: JetStreamContext
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def uow(self) -> UnitOfWork:
        return UnitOfWork(self.sessions, self.outbox, self.inbox, "bench")

    async def start(self, relay: OutboxRelay, consumer: ConsumerRunner[UnitOfWork]) -> None:
        """Run the relay and the consumer; back once the consumer has subscribed."""
        self.tasks.extend([asyncio.create_task(relay.run()), asyncio.create_task(consumer.run())])
        await consumer.subscribed.wait()

    async def close(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.nc.close()
        await self.engine.dispose()


async def open_rig(nats_url: str, database_url: str, producers: int) -> Rig:
    """Drop and create the bench's schema, open an engine with room for `producers` and connect."""
    metadata = MetaData(schema=SERVICE)
    outbox, inbox = add_messaging_tables(metadata)
    admin = create_async_engine(async_url(database_url))
    async with admin.begin() as conn:
        await conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {SERVICE} CASCADE")
        await conn.exec_driver_sql(f"CREATE SCHEMA {SERVICE}")
        await conn.run_sync(metadata.create_all)
    await admin.dispose()
    engine = make_engine(database_url, pool_size=producers + 4)
    sessions = make_session_factory(engine)
    nc = await nats.connect(nats_url)
    return Rig(engine, sessions, outbox, inbox, nc, nc.jetstream())


async def ensure_bench_stream(js: JetStreamContext) -> None:
    """The bench's stream (4 GiB at most), emptied: each run consumes only its own messages."""
    await ensure_stream(js, SERVICE, StreamLimits(max_bytes=4 * 1024**3))
    await js.purge_stream("TESSERA_BENCH")


def ping_consumer(handle: Handler[UnitOfWork], replay_safe: bool) -> ConsumerSpec[UnitOfWork]:
    """A consumer of its own (a new durable name each run) of the bench's pings, 256 a batch."""
    return ConsumerSpec(
        f"bench-{uuid.uuid4().hex[:8]}",
        SERVICE,
        Ping.SUBJECT,
        handle,
        ConsumerSettings(batch=256),
        replay_safe=replay_safe,
    )


async def produce_all(
    rig: Rig,
    relay: OutboxRelay,
    messages: int,
    producers: int,
    events_per_commit: int,
    started: float,
    rate_per_s: float | None = None,
    on_commit: Callable[[Sequence[str]], None] | None = None,
) -> None:
    """`producers` concurrent transactions commit `messages` pings, `events_per_commit` at a time,
    flat out or paced at `rate_per_s` from `started`; `on_commit` gets each commit's event ids
    before the relay is woken."""

    async def produce(worker: int) -> None:
        step = producers * events_per_commit
        for first in range(worker * events_per_commit, messages, step):
            if rate_per_s:
                await asyncio.sleep(max(0.0, started + first / rate_per_s - time.perf_counter()))
            async with rig.uow() as unit:
                now = datetime.now(UTC)
                last = min(first + events_per_commit, messages)
                ids = await unit.publish_many([Ping(n=n, sent_at=now) for n in range(first, last)])
                await unit.commit()
            if on_commit is not None:
                on_commit(ids)
            relay.wake()

    await asyncio.gather(*(produce(w) for w in range(producers)))
