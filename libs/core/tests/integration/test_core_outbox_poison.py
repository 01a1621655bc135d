"""An outbox that isolates failures, on real NATS and PostgreSQL: a row that can never be published
moves to the outbox dead-letter table with its reason and holds up nothing behind it; every other row
is published exactly once; a NATS outage counts against no row."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, PubAck
from nats.js.errors import NoStreamResponseError, ServiceUnavailableError
from sqlalchemy import MetaData, insert, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from tessera.contracts import subjects
from tessera.contracts.events import SubmitJob
from tessera.core.db.engine import make_engine, make_session_factory
from tessera.core.db.messaging_tables import add_messaging_tables, outbox_dead_letters_of
from tessera.core.messaging.envelope import encode
from tessera.core.messaging.limits import header_bytes
from tessera.core.messaging.outbox import OutboxRelay
from tessera.core.messaging.streams import StreamLimits, ensure_stream
from tessera.core.observability.metrics import Metrics
from tessera.testing.services import read_stream, reset_jetstream
from tessera.testing.tcp_proxy import cuttable_proxy

pytestmark = pytest.mark.integration

metadata = MetaData(schema="outbox_poison")
outbox, inbox = add_messaging_tables(metadata)
dead_letters = outbox_dead_letters_of(outbox)


@dataclass
class Bus:
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    nc: NATS


@pytest.fixture
async def bus(nats_url: str, fresh_database: str) -> AsyncIterator[Bus]:
    await reset_jetstream(nats_url)
    engine = make_engine(fresh_database)
    async with engine.begin() as conn:
        await conn.execute(text("CREATE SCHEMA outbox_poison"))
        await conn.run_sync(metadata.create_all)
    nc = await nats.connect(nats_url)
    await ensure_stream(nc.jetstream(), "admission", StreamLimits())
    try:
        yield Bus(engine, make_session_factory(engine), nc)
    finally:
        await nc.close()
        await engine.dispose()


def row(job_id: str, *, padding: int = 0, subject: str | None = None) -> dict[str, object]:
    message = SubmitJob(job_id=job_id, spec={"padding": "x" * padding} if padding else {})
    nats_subject, headers, body = encode(message, "tessera/test", event_id=f"evt-{job_id}")
    return {
        "event_id": headers["ce-id"],
        "subject": subject or nats_subject,
        "headers": headers,
        "body": body,
    }


async def fill(bus: Bus, rows: list[dict[str, object]]) -> None:
    async with bus.engine.begin() as conn:
        for r in rows:  # one by one, so `seq` follows the list
            await conn.execute(insert(outbox), [r])


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def drain(relay: OutboxRelay, rounds: int = 12) -> None:
    for _ in range(rounds):
        published, stayed = await relay.publish_batch_outcomes()
        if not published and not stayed:
            return


async def test_an_unpublishable_row_is_dead_lettered_and_every_other_row_is_published_once(bus: Bus) -> None:
    limit = bus.nc.max_payload
    probe = row("edge")
    # a body that passes nats.py's own check (body <= max_payload) but not the server's, which counts
    # the headers too: sent as is, it would make the server close the connection
    edge_padding = limit - len(probe["body"]) - 10  # type: ignore[arg-type]
    assert header_bytes(probe["headers"]) > 10  # type: ignore[arg-type]
    await fill(
        bus,
        [
            row("ok-1"),
            row("edge", padding=edge_padding),
            row("ok-2"),
            row("huge", padding=3 * limit),
            row("ok-3"),
            row("nowhere", subject="tessera.nostream.evt.lost"),  # no stream takes it: refused each time
            row("ok-4"),
        ],
    )
    metrics = Metrics()
    relay = OutboxRelay(
        bus.nc.jetstream(),
        bus.sessions,
        outbox,
        metrics,
        asyncio.Event(),
        max_attempts=3,
        max_payload=lambda: bus.nc.max_payload,
        ack_timeout_s=2.0,
    )
    await drain(relay)

    stored = await read_stream(bus.nc.jetstream(), subjects.SUBMIT_JOB)
    assert Counter(e.id for e in stored) == {f"evt-ok-{i}": 1 for i in range(1, 5)}
    assert bus.nc.is_connected, "no oversized message reached the server"
    async with bus.engine.connect() as conn:
        assert (await conn.execute(select(outbox.c.seq))).all() == []
        moved = {
            r.event_id: r
            for r in (await conn.execute(select(dead_letters).order_by(dead_letters.c.seq))).all()
        }
    assert sorted(moved) == ["evt-edge", "evt-huge", "evt-nowhere"]
    assert "over the limit" in moved["evt-edge"].reason and moved["evt-edge"].attempts == 1
    assert "over the limit" in moved["evt-huge"].reason and len(moved["evt-huge"].body) > 3 * limit
    assert moved["evt-nowhere"].reason.startswith("failed 3 times") and moved["evt-nowhere"].attempts == 3
    assert sample(metrics, "tessera_outbox_dead_lettered_total", reason="too_large") == 2
    assert sample(metrics, "tessera_outbox_dead_lettered_total", reason="exhausted") == 1

    await relay.sample()
    assert sample(metrics, "tessera_outbox_backlog_rows") == 0
    assert sample(metrics, "tessera_outbox_dead_letter_rows") == 3


async def test_a_nats_outage_counts_against_no_row(bus: Bus, nats_url: str) -> None:
    await fill(bus, [row(f"out-{i}") for i in range(5)])
    async with cuttable_proxy(nats_url) as proxy:
        nc = await nats.connect(proxy.url(), max_reconnect_attempts=-1, reconnect_time_wait=0.2)  # type: ignore[arg-type]
        try:
            metrics = Metrics()
            relay = OutboxRelay(
                nc.jetstream(),
                bus.sessions,
                outbox,
                metrics,
                asyncio.Event(),
                max_attempts=1,
                ack_timeout_s=0.5,
            )
            proxy.refusing = True
            await proxy.cut()
            for _ in range(3):  # max_attempts=1: were an outage counted, one round would doom them
                assert await relay.publish_batch_outcomes() == (0, 5)
            await relay.sample()
            assert sample(metrics, "tessera_outbox_backlog_rows") == 5
            assert sample(metrics, "tessera_outbox_oldest_age_seconds") > 0
            async with bus.engine.connect() as conn:
                assert (await conn.execute(select(outbox.c.attempts))).scalars().all() == [0] * 5
            proxy.refusing = False
            for _ in range(100):
                if nc.is_connected:
                    break
                await asyncio.sleep(0.1)
            await drain(relay)
        finally:
            await nc.close()
    stored = await read_stream(bus.nc.jetstream(), subjects.SUBMIT_JOB)
    assert Counter(e.id for e in stored) == {f"evt-out-{i}": 1 for i in range(5)}
    async with bus.engine.connect() as conn:
        assert (await conn.execute(select(dead_letters.c.seq))).all() == []


class Unavailable:
    """JetStream as a rolling NATS restart shows it: the first `failures` publishes fail at once
    the way `error` says, then each goes through to the real stream."""

    def __init__(self, js: JetStreamContext, error: Exception, failures: int) -> None:
        self.js, self.error, self.failures = js, error, failures

    async def publish(self, subject: str, payload: bytes, *, headers: dict[str, str]) -> PubAck:
        if self.failures > 0:
            self.failures -= 1
            raise self.error
        return await self.js.publish(subject, payload, headers=headers)

    async def find_stream_name_by_subject(self, subject: str) -> str:
        if self.failures > 0:  # the JetStream API is away as well
            raise nats.errors.NoRespondersError
        return await self.js.find_stream_name_by_subject(subject)


@pytest.mark.parametrize(
    "error",
    [NoStreamResponseError(), ServiceUnavailableError(code=503, description="JetStream not ready")],
    ids=["no responders", "503"],
)
async def test_jetstream_answering_no_responders_or_503_for_a_while_counts_against_no_row(
    bus: Bus, error: Exception
) -> None:
    await fill(bus, [row(f"restart-{i}") for i in range(3)])
    rounds = 10
    relay = OutboxRelay(
        Unavailable(bus.nc.jetstream(), error, failures=3 * rounds),  # type: ignore[arg-type]
        bus.sessions,
        outbox,
        Metrics(),
        asyncio.Event(),
        max_attempts=3,
    )
    for _ in range(rounds):  # max_attempts=3: were these counted, the third round would doom them
        assert await relay.publish_batch_outcomes() == (0, 3)
    async with bus.engine.connect() as conn:
        assert (await conn.execute(select(outbox.c.attempts))).scalars().all() == [0] * 3
    await drain(relay)

    stored = await read_stream(bus.nc.jetstream(), subjects.SUBMIT_JOB)
    assert Counter(e.id for e in stored) == {f"evt-restart-{i}": 1 for i in range(3)}
    async with bus.engine.connect() as conn:
        assert (await conn.execute(select(dead_letters.c.seq))).all() == []


async def test_a_full_stream_that_discards_new_counts_against_no_row(bus: Bus) -> None:
    # A stream that refuses new messages once full (503, "maximum messages exceeded") takes one more
    # each round, as room comes free: the rows it refuses are not at fault, though others went through.
    js = bus.nc.jetstream()
    stream = subjects.stream_name("admission")
    config = (await js.stream_info(stream)).config
    config.max_msgs, config.discard = 1, DiscardPolicy.NEW
    await js.update_stream(config)
    await fill(bus, [row(f"full-{i}") for i in range(5)])
    relay = OutboxRelay(js, bus.sessions, outbox, Metrics(), asyncio.Event(), max_attempts=3)
    published = []
    for _ in range(5):  # max_attempts=3: were the refusals counted, the third round would doom two rows
        await js.purge_stream(stream)  # room for one more
        published.append(await relay.publish_batch_outcomes())
    assert published == [(1, 4), (1, 3), (1, 2), (1, 1), (1, 0)]
    async with bus.engine.connect() as conn:
        assert (await conn.execute(select(outbox.c.seq))).all() == []
        assert (await conn.execute(select(dead_letters.c.seq))).all() == []
