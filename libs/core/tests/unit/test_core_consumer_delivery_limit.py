"""A durable consumer created with a delivery limit (by an earlier release) has it lifted even
when its info cannot be read at subscription: a later ack floor read lifts it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from nats.js.api import ConsumerConfig

from tessera.core.messaging.consumer import ConsumerRunner, ConsumerSpec
from tessera.core.messaging.consumer_loop import ACK_FLOOR_REFRESH_S
from tessera.core.observability.metrics import Metrics
from tessera.core.settings import ConsumerSettings

from .test_core_consumer_database_outage import Database, UnitOfWork


class Subscription:
    """A durable consumer with `max_deliver=5` whose info does not answer the first `timeouts` reads."""

    def __init__(self, timeouts: int) -> None:
        self.timeouts = timeouts
        self.reads = 0
        self.config = ConsumerConfig(durable_name="c", max_deliver=5)

    async def consumer_info(self) -> SimpleNamespace:
        self.reads += 1
        if self.timeouts > 0:
            self.timeouts -= 1
            raise TimeoutError
        return SimpleNamespace(ack_floor=SimpleNamespace(stream_seq=0), config=self.config)


class JetStream:
    def __init__(self, sub: Subscription) -> None:
        self.sub = sub

    async def stream_info(self, _: str) -> SimpleNamespace:
        return SimpleNamespace(created=None, state=SimpleNamespace(last_seq=0))

    async def pull_subscribe(self, *_: Any, **__: Any) -> Subscription:
        return self.sub

    async def add_consumer(self, _: str, config: ConsumerConfig) -> None:
        self.sub.config = config


def runner(js: JetStream) -> ConsumerRunner[Any]:
    async def handler(*_: Any) -> None:
        return None

    spec = ConsumerSpec("c", "admission", "s", handler).configured(ConsumerSettings())
    db = Database(down_for_probes=0)
    return ConsumerRunner(js, spec, lambda: UnitOfWork(db), "admission", Metrics(), asyncio.Event())  # type: ignore[arg-type, return-value]


async def test_a_delivery_limit_not_lifted_at_subscription_is_lifted_at_a_later_ack_floor_read() -> None:
    sub = Subscription(timeouts=1)
    consumer = runner(JetStream(sub))
    subscribed: Any = await consumer._subscribe()
    assert subscribed is sub
    assert sub.config.max_deliver == 5, "its info timed out: the limit stands for now"

    await consumer._read_ack_floor_if_due(sub, idle=True)  # type: ignore[arg-type]
    assert sub.reads == 1, "read again only a few seconds later"

    assert consumer._floor_read_at is not None
    consumer._floor_read_at -= ACK_FLOOR_REFRESH_S  # a few seconds later, nothing delivered meanwhile
    await consumer._read_ack_floor_if_due(sub, idle=True)  # type: ignore[arg-type]
    assert (sub.reads, sub.config.max_deliver) == (2, -1)

    consumer._floor_read_at -= ACK_FLOOR_REFRESH_S
    await consumer._read_ack_floor_if_due(sub, idle=True)  # type: ignore[arg-type]
    assert sub.reads == 2, "lifted: no more reads while nothing is delivered"
