"""A dead-letter subject that does not take copies for a while, on real NATS and PostgreSQL: a
message on its last delivery is not lost (not even to a restart meanwhile), other messages keep
being handled, and once copies are taken the message gets its copy exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import ServiceUnavailableError

from tessera.contracts import subjects
from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.consumer import ConsumerRunner
from tessera.core.messaging.envelope import Envelope
from tessera.core.observability.metrics import Metrics
from tessera.testing.services import eventually

from .poison_harness import CONSUMER, DLQ, Behaviour, Bus, open_bus, spec

pytestmark = pytest.mark.integration

STREAM = subjects.stream_name("admission")


@pytest.fixture
async def bus(nats_url: str, fresh_database: str) -> AsyncIterator[Bus]:
    async with open_bus(nats_url, fresh_database) as b:
        yield b


class Broken(Behaviour):
    """A "broken-" job fails every time, transiently."""

    async def handle(self, envelope: Envelope, uow: UnitOfWork) -> None:
        if envelope.subject.startswith("broken"):
            self.attempts[envelope.subject] = self.attempts.get(envelope.subject, 0) + 1
            raise RuntimeError("fails every time")
        await super().handle(envelope, uow)


class RefusingDeadLetters:
    """JetStream, but refusing publishes to the dead-letter subject (503) while `refusing`."""

    def __init__(self, js: JetStreamContext) -> None:
        self.js = js
        self.refusing = True
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.js, name)

    async def publish(self, subject: str, *args: Any, **kwargs: Any) -> Any:
        if self.refusing and subject == DLQ:
            self.refused += 1
            raise ServiceUnavailableError(code=503, description="JetStream not ready")
        return await self.js.publish(subject, *args, **kwargs)


async def true(value: bool) -> bool:
    return value


def runner(bus: Bus, js: RefusingDeadLetters, behaviour: Behaviour) -> ConsumerRunner[UnitOfWork]:
    return ConsumerRunner(
        js,  # type: ignore[arg-type]
        spec(behaviour, max_deliver=2),
        bus.uow,
        "admission",
        Metrics(),
        asyncio.Event(),
    )


async def test_a_message_whose_dead_letter_copy_is_refused_on_its_last_delivery_is_kept_and_holds_up_nothing(
    bus: Bus,
) -> None:
    # the durable consumer as an earlier release created it, with JetStream's delivery limit
    await bus.nc.jetstream().add_consumer(
        STREAM,
        ConsumerConfig(
            durable_name=CONSUMER,
            ack_policy=AckPolicy.EXPLICIT,
            max_deliver=2,
            ack_wait=5.0,
            filter_subject=subjects.SUBMIT_JOB,
        ),
    )
    behaviour = Broken()
    refusing = RefusingDeadLetters(bus.nc.jetstream())
    first = runner(bus, refusing, behaviour)
    task = asyncio.create_task(first.run())
    try:
        await bus.publish("broken-1")
        await eventually(
            lambda: true(behaviour.attempts.get("broken-1") == 2 and refusing.refused >= 2),
            timeout=20,
            what="the copy refused on the last delivery and after",
        )
        for job in ("ok-1", "ok-2"):
            await bus.publish(job)
        await eventually(
            lambda: true(behaviour.handled == ["ok-1", "ok-2"]), timeout=20, what="other messages handled"
        )
    finally:
        first.stop.set()  # stopping while the copy is refused: the message must not be lost
        await asyncio.wait_for(task, timeout=10)
    info = await bus.nc.jetstream().consumer_info(STREAM, CONSUMER)
    assert info.config.max_deliver == -1, "the durable consumer's delivery limit was lifted"
    assert await bus.dead_letters() == []

    second = runner(bus, RefusingDeadLetters(bus.nc.jetstream()), behaviour)
    second_js: RefusingDeadLetters = second.js  # type: ignore[assignment]
    second_js.refusing = False
    task = asyncio.create_task(second.run())
    try:

        async def settled() -> bool:
            info = await bus.nc.jetstream().consumer_info(STREAM, CONSUMER)
            return len(await bus.dead_letters()) == 1 and info.num_ack_pending == info.num_pending == 0

        await eventually(settled, timeout=30, what="the copy stored and the message terminated")
    finally:
        second.stop.set()
        await asyncio.wait_for(task, timeout=10)
    copies = await bus.dead_letters()
    assert [(m.headers or {}).get("ce-id") for m in copies] == ["evt-broken-1"], "one copy"
    assert behaviour.attempts["broken-1"] == 2, "not handled again past the limit"
    assert behaviour.handled == ["ok-1", "ok-2"]
