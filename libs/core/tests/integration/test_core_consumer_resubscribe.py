"""A consumer whose durable consumer or stream vanishes (deleted, or NATS restored without its
JetStream data) subscribes again and goes on, on real NATS and PostgreSQL: it does not fetch from
nothing for ever, re-reads nothing it handled, and skips nothing published since."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tessera.contracts import subjects
from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.consumer import ConsumerRunner
from tessera.core.messaging.streams import StreamLimits, ensure_stream
from tessera.core.observability.metrics import Metrics
from tessera.testing.services import eventually

from .poison_harness import CONSUMER, Behaviour, Bus, open_bus, spec

pytestmark = pytest.mark.integration

STREAM = subjects.stream_name("admission")


@pytest.fixture
async def bus(nats_url: str, fresh_database: str) -> AsyncIterator[Bus]:
    async with open_bus(nats_url, fresh_database) as b:
        yield b


async def handled(behaviour: Behaviour, *jobs: str) -> bool:
    return all(job in behaviour.handled for job in jobs)


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, {"consumer": CONSUMER, **labels}) or 0.0


def running(
    bus: Bus, behaviour: Behaviour, metrics: Metrics, *, owns_stream: bool
) -> ConsumerRunner[UnitOfWork]:
    async def ensure() -> None:
        await ensure_stream(bus.nc.jetstream(), "admission", StreamLimits())

    return ConsumerRunner(
        bus.nc.jetstream(),
        spec(behaviour),
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
