"""The outbox relay through a NATS outage long enough to fill nats.py's reconnect buffer, on real NATS
and PostgreSQL: the relay sends nothing while the connection is down, leaks no pending-PubAck slot of
nats.py's `publish_async` (4000 of them, after which it would wait for ever), never hangs a round, and
once NATS is back publishes every row of the backlog exactly once."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NATS
from sqlalchemy import MetaData, insert, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from tessera.contracts import subjects
from tessera.contracts.events import SubmitJob
from tessera.core.db.engine import make_engine, make_session_factory
from tessera.core.db.messaging_tables import add_messaging_tables, outbox_dead_letters_of
from tessera.core.messaging.envelope import encode
from tessera.core.messaging.outbox import OutboxRelay
from tessera.core.messaging.publish_async import publish_async
from tessera.core.messaging.streams import StreamLimits, ensure_stream
from tessera.core.observability.metrics import Metrics
from tessera.testing.services import eventually, read_stream, reset_jetstream
from tessera.testing.tcp_proxy import CuttableProxy, cuttable_proxy

pytestmark = pytest.mark.integration

metadata = MetaData(schema="outbox_outage")
outbox, inbox = add_messaging_tables(metadata)
dead_letters = outbox_dead_letters_of(outbox)

#: nats.py's default number of `publish_async` PubAcks in flight at once, per JetStream context
NATS_PY_PENDING_SLOTS = 4000
BATCH = 512
BACKLOG = 600
PADDING = 16 * 1024  # 600 rows of 16 KiB: several times nats.py's 2 MiB reconnect buffer


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
        await conn.execute(text("CREATE SCHEMA outbox_outage"))
        await conn.run_sync(metadata.create_all)
    nc = await nats.connect(nats_url)
    await ensure_stream(nc.jetstream(), "admission", StreamLimits())
    try:
        yield Bus(engine, make_session_factory(engine), nc)
    finally:
        await nc.close()
        await engine.dispose()


def row(job_id: str) -> dict[str, object]:
    message = SubmitJob(job_id=job_id, spec={"padding": "x" * PADDING})
    nats_subject, headers, body = encode(message, "tessera/test", event_id=f"evt-{job_id}")
    return {"event_id": headers["ce-id"], "subject": nats_subject, "headers": headers, "body": body}


async def through_proxy(proxy: CuttableProxy, **options: object) -> NATS:
    return await nats.connect(
        proxy.url(),
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.2,
        **options,  # type: ignore[arg-type]
    )


async def outage(proxy: CuttableProxy, nc: NATS) -> None:
    proxy.refusing = True
    await proxy.cut()

    async def down() -> bool:
        return not nc.is_connected

    await eventually(down, timeout=10, interval=0.02, what="the client to see the connection drop")


async def back(proxy: CuttableProxy, nc: NATS) -> None:
    proxy.refusing = False

    async def up() -> bool:
        return nc.is_connected

    await eventually(up, timeout=20, interval=0.05, what="the client to reconnect")


async def test_after_an_outage_that_overflows_the_reconnect_buffer_every_row_is_published_once(
    bus: Bus, nats_url: str
) -> None:
    async with bus.engine.begin() as conn:
        for i in range(BACKLOG):  # one by one, so `seq` follows the job ids
            await conn.execute(insert(outbox), [row(f"bk-{i:04d}")])
    async with cuttable_proxy(nats_url) as proxy:
        nc = await through_proxy(proxy)
        try:
            js = nc.jetstream()  # nats.py's defaults, as the service runner has them
            relay = OutboxRelay(
                js, bus.sessions, outbox, Metrics(), asyncio.Event(), batch=BATCH, ack_timeout_s=0.5
            )
            await outage(proxy, nc)
            # more rounds than it takes a relay that leaks a slot per row refused to use all of them
            for _ in range(NATS_PY_PENDING_SLOTS // BATCH + 2):
                published, stayed = await asyncio.wait_for(relay.publish_batch_outcomes(), timeout=20)
                assert (published, stayed) == (0, BATCH), "nothing is sent and nothing is lost"
            await asyncio.sleep(0)  # let the done callbacks of cancelled futures run
            assert js.publish_async_pending() == 0, "no PubAck future is left behind"

            await back(proxy, nc)
            for _ in range(20):
                published, stayed = await asyncio.wait_for(relay.publish_batch_outcomes(), timeout=20)
                if not published and not stayed:
                    break
                if stayed:
                    await asyncio.sleep(0.2)
        finally:
            proxy.refusing = False  # a failed test leaves no client reconnecting for ever
            await nc.close()
    stored = await read_stream(bus.nc.jetstream(), subjects.SUBMIT_JOB)
    assert Counter(e.id for e in stored) == {f"evt-bk-{i:04d}": 1 for i in range(BACKLOG)}
    async with bus.engine.connect() as conn:
        assert (await conn.execute(select(outbox.c.seq))).all() == []
        assert (await conn.execute(select(dead_letters.c.seq))).all() == []


async def test_the_relay_sends_no_more_of_a_round_once_the_connection_drops_mid_batch(
    bus: Bus, nats_url: str
) -> None:
    """The connection drops while the relay's first publishes are on their way: the rest of the
    batch is not queued into the reconnect buffer, and everything goes out once NATS is back."""
    async with bus.engine.begin() as conn:
        for i in range(40):
            await conn.execute(insert(outbox), [row(f"mid-{i:02d}")])
    async with cuttable_proxy(nats_url) as proxy:
        nc = await through_proxy(proxy, pending_size=64 * 1024)  # room for three rows at most
        try:
            js = nc.jetstream()
            relay = OutboxRelay(js, bus.sessions, outbox, Metrics(), asyncio.Event(), ack_timeout_s=0.5)
            real_publish = nc.publish
            calls = 0

            async def cut_before_the_fifth(*args: object, **kwargs: object) -> None:
                nonlocal calls
                calls += 1
                if calls == 5:  # the connection is lost under the relay
                    await outage(proxy, nc)
                await real_publish(*args, **kwargs)  # type: ignore[arg-type]

            nc.publish = cut_before_the_fifth  # type: ignore[method-assign]
            try:
                published, stayed = await asyncio.wait_for(relay.publish_batch_outcomes(), timeout=20)
            finally:
                nc.publish = real_publish  # type: ignore[method-assign]
            assert stayed == 40 - published and published <= 4
            assert calls < 10, f"the relay stopped sending once the connection was gone ({calls} sent)"
            await asyncio.sleep(0)
            assert js.publish_async_pending() == 0
            await back(proxy, nc)
            for _ in range(10):
                published, stayed = await asyncio.wait_for(relay.publish_batch_outcomes(), timeout=20)
                if not published and not stayed:
                    break
                if stayed:
                    await asyncio.sleep(0.2)
        finally:
            proxy.refusing = False  # a failed test leaves no client reconnecting for ever
            await nc.close()
    stored = await read_stream(bus.nc.jetstream(), subjects.SUBMIT_JOB)
    assert Counter(e.id for e in stored) == {f"evt-mid-{i:02d}": 1 for i in range(40)}


async def test_a_publish_the_connection_refuses_leaves_no_pending_slot_behind(nats_url: str) -> None:
    """nats.py's `publish_async` takes a slot and registers its PubAck future before it publishes;
    when the publish raises (reconnect buffer full) both are released, so a few slots are enough for
    any number of refusals, and the next publish after the outage is answered."""
    await reset_jetstream(nats_url)
    async with cuttable_proxy(nats_url) as proxy:
        nc = await through_proxy(proxy, pending_size=1024)
        try:
            await ensure_stream(nc.jetstream(), "admission", StreamLimits())
            js = nc.jetstream(publish_async_max_pending=3)
            _, headers, body = encode(SubmitJob(job_id="slot", spec={"padding": "x" * 4096}), "t")
            await outage(proxy, nc)
            for _ in range(10):
                with pytest.raises(nats.errors.OutboundBufferLimitError):
                    await publish_async(js, subjects.SUBMIT_JOB, body, dict(headers), wait_stall=1.0)
            await asyncio.sleep(0)
            assert js.publish_async_pending() == 0
            await back(proxy, nc)
            future = await publish_async(js, subjects.SUBMIT_JOB, body, dict(headers), wait_stall=1.0)
            ack = await asyncio.wait_for(future, timeout=10)
            assert ack.stream == subjects.stream_name("admission")
        finally:
            proxy.refusing = False  # a failed test leaves no client reconnecting for ever
            await nc.close()
