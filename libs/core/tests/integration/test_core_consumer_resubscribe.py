"""A consumer whose durable consumer or stream vanishes (deleted, or NATS restored without its
JetStream data) subscribes again and goes on, on real NATS and PostgreSQL: it does not fetch from
nothing for ever, re-reads nothing it handled, and skips nothing published since."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client as NATS

from tessera.contracts import subjects
from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.consumer import ConsumerRunner
from tessera.core.messaging.streams import StreamLimits, ensure_stream
from tessera.core.observability.metrics import Metrics
from tessera.testing.services import eventually
from tessera.testing.tcp_proxy import cuttable_proxy

from .poison_harness import CONSUMER, Behaviour, Bus, open_bus, spec

pytestmark = pytest.mark.integration

STREAM = subjects.stream_name("admission")


@pytest.fixture
async def bus(nats_url: str, fresh_database: str) -> AsyncIterator[Bus]:
    async with open_bus(nats_url, fresh_database) as b:
        yield b


async def handled(behaviour: Behaviour, *jobs: str) -> bool:
    return all(job in behaviour.handled for job in jobs)


async def true(value: bool) -> bool:
    return value


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, {"consumer": CONSUMER, **labels}) or 0.0


def running(
    bus: Bus,
    behaviour: Behaviour,
    metrics: Metrics,
    *,
    owns_stream: bool,
    nc: NATS | None = None,
    **settings: object,
) -> ConsumerRunner[UnitOfWork]:
    async def ensure() -> None:
        await ensure_stream(bus.nc.jetstream(), "admission", StreamLimits())

    return ConsumerRunner(
        (nc or bus.nc).jetstream(),
        spec(behaviour, **settings),
        bus.uow,
        "admission",
        metrics,
        asyncio.Event(),
        ensure_stream=ensure if owns_stream else None,
    )


async def test_a_deleted_durable_consumer_is_created_again_where_it_left_off(bus: Bus) -> None:
    behaviour, metrics = Behaviour(), Metrics()
    runner = running(bus, behaviour, metrics, owns_stream=False)
    task = asyncio.create_task(runner.run())
    try:
        await bus.publish("before")
        await eventually(lambda: handled(behaviour, "before"), timeout=20, what="the first message handled")
        await eventually(  # read on the next idle fetch: the durable consumer settled sequence 1
            lambda: true(runner._resume_from == 2), timeout=20, what="the ack floor read"
        )
        await bus.nc.jetstream().delete_consumer(STREAM, CONSUMER)
        await bus.publish("after")
        await eventually(lambda: handled(behaviour, "after"), timeout=30, what="a message published since")
    finally:
        runner.stop.set()
        await asyncio.wait_for(task, timeout=10)
    assert behaviour.handled == ["before", "after"]
    assert sample(metrics, "tessera_consumer_resubscribes_total") >= 1
    assert sample(metrics, "tessera_messages_handled_total", outcome="duplicate") == 0, (
        "the consumer created again starts after what was handled: nothing is delivered twice"
    )


async def test_a_stream_lost_with_its_data_is_created_again_and_read_from_its_start(bus: Bus) -> None:
    behaviour, metrics = Behaviour(), Metrics()
    runner = running(bus, behaviour, metrics, owns_stream=True)
    task = asyncio.create_task(runner.run())
    try:
        for job in ("one", "two"):
            await bus.publish(job)
        await eventually(lambda: handled(behaviour, "one", "two"), timeout=20, what="the first messages")
        await bus.nc.jetstream().delete_stream(STREAM)  # as NATS restored without its JetStream data

        async def recreated() -> bool:
            try:
                await bus.nc.jetstream().consumer_info(STREAM, CONSUMER)
            except Exception:
                return False
            return True

        await eventually(recreated, timeout=30, what="the stream and its durable consumer created again")
        await bus.publish("three")  # the first message of the new stream: sequence 1
        await eventually(lambda: handled(behaviour, "three"), timeout=30, what="the new stream's message")
    finally:
        runner.stop.set()
        await asyncio.wait_for(task, timeout=10)
    assert behaviour.handled == ["one", "two", "three"]


async def test_a_stream_created_anew_by_its_owner_is_read_from_its_start_however_long(bus: Bus) -> None:
    """The stream is another service's: the consumer waits for it, and by the time it is back it
    holds more messages than the old one did, so only its creation time tells it is another."""
    behaviour, metrics = Behaviour(), Metrics()
    runner = running(bus, behaviour, metrics, owns_stream=False)
    task = asyncio.create_task(runner.run())
    try:
        for job in ("one", "two"):
            await bus.publish(job)
        await eventually(lambda: handled(behaviour, "one", "two"), timeout=20, what="the first messages")
        await bus.nc.jetstream().delete_stream(STREAM)

        async def waiting() -> bool:
            return not runner.subscribed.is_set()

        await eventually(waiting, timeout=30, what="the consumer waiting for its stream")
        await ensure_stream(bus.nc.jetstream(), "admission", StreamLimits())  # its owner, restarted
        for job in ("three", "four", "five", "six"):
            await bus.publish(job)
        await eventually(
            lambda: handled(behaviour, "three", "four", "five", "six"), timeout=30, what="the new stream read"
        )
    finally:
        runner.stop.set()
        await asyncio.wait_for(task, timeout=10)
    assert behaviour.handled == ["one", "two", "three", "four", "five", "six"]


async def test_a_durable_consumer_created_again_skips_no_message_another_replica_left_unsettled(
    bus: Bus,
) -> None:
    """Replica A naks a message with a long delay, then stops (scaled down); replica B, on the same
    durable consumer, handles the later messages. The durable consumer is deleted: B creates it
    again at the durable consumer's ack floor, below the message A nak'd, not above what B saw."""
    behaviour = Behaviour()  # "flaky" fails its first attempt
    slow_retry = {"backoff_base_s": 60.0, "backoff_max_s": 60.0}
    a = running(bus, behaviour, Metrics(), owns_stream=False, **slow_retry)
    task_a = asyncio.create_task(a.run())
    await bus.publish("flaky")
    await eventually(lambda: true(behaviour.attempts.get("flaky") == 1), timeout=20, what="the first attempt")
    a.stop.set()
    await asyncio.wait_for(task_a, timeout=10)

    b = running(bus, behaviour, Metrics(), owns_stream=False, **slow_retry)
    task_b = asyncio.create_task(b.run())
    try:
        for job in ("one", "two", "three"):
            await bus.publish(job)
        await eventually(lambda: handled(behaviour, "one", "two", "three"), timeout=20, what="B handling")
        await bus.nc.jetstream().delete_consumer(STREAM, CONSUMER)
        await eventually(lambda: handled(behaviour, "flaky"), timeout=30, what="the nak'd message handled")
    finally:
        b.stop.set()
        await asyncio.wait_for(task_b, timeout=10)
    assert sorted(behaviour.handled) == ["flaky", "one", "three", "two"], "each handled once"


async def test_a_durable_consumer_deleted_after_its_stream_was_created_anew_skips_nothing(
    bus: Bus, nats_url: str
) -> None:
    """The stream is created anew and read; then, while the consumer is cut off from NATS, its
    durable consumer is deleted and the new stream grows past the old one's end: the durable
    consumer created again starts where the new stream's was, not where the old stream's was."""
    behaviour = Behaviour()
    async with cuttable_proxy(nats_url) as proxy:
        nc = await nats.connect(proxy.url(), max_reconnect_attempts=-1, reconnect_time_wait=0.2)  # type: ignore[arg-type]
        runner = running(bus, behaviour, Metrics(), owns_stream=False, nc=nc)
        task = asyncio.create_task(runner.run())
        try:
            old = [f"old-{i}" for i in range(6)]
            for job in old:
                await bus.publish(job)
            await eventually(lambda: handled(behaviour, *old), timeout=20, what="the old stream read")
            await bus.nc.jetstream().delete_stream(STREAM)
            await eventually(
                lambda: true(not runner.subscribed.is_set()), timeout=30, what="waiting for the stream"
            )
            await ensure_stream(bus.nc.jetstream(), "admission", StreamLimits())
            for job in ("new-0", "new-1"):
                await bus.publish(job)
            await eventually(lambda: handled(behaviour, "new-0", "new-1"), timeout=30, what="the new stream")

            proxy.refusing = True
            await proxy.cut()
            await bus.nc.jetstream().delete_consumer(STREAM, CONSUMER)
            later = [f"new-{i}" for i in range(2, 9)]  # up to sequence 9, past the old stream's end
            for job in later:
                await bus.publish(job)
            proxy.refusing = False
            await eventually(
                lambda: handled(behaviour, *later), timeout=30, what="the new stream's later messages"
            )
        finally:
            runner.stop.set()
            await asyncio.wait_for(task, timeout=10)
            await nc.close()
    assert behaviour.handled == old + [f"new-{i}" for i in range(9)]
