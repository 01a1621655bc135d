"""The consumer's fetch on real NATS and PostgreSQL: one pull takes every message already there as
one batch (up to the batch size), and a lone message is handled without waiting for a batch to fill."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from nats.aio.msg import Msg

from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.consumer import ConsumerRunner
from tessera.core.observability.metrics import Metrics
from tessera.testing.services import eventually

from .poison_harness import Behaviour, Bus, open_bus, spec

pytestmark = pytest.mark.integration


@pytest.fixture
async def bus(nats_url: str, fresh_database: str) -> AsyncIterator[Bus]:
    async with open_bus(nats_url, fresh_database) as b:
        yield b


class BatchRecorder(ConsumerRunner[UnitOfWork]):
    """Records the size of each batch it is handed."""

    batches: list[int]

    async def handle_batch(self, msgs: list[Msg]) -> None:
        self.batches.append(len(msgs))
        await super().handle_batch(msgs)


async def run_consumer(
    bus: Bus, behaviour: Behaviour, *, linger_s: float, batch: int, expected: int
) -> list[int]:
    stop = asyncio.Event()
    runner = BatchRecorder(
        bus.nc.jetstream(),
        replace(spec(behaviour, batch=batch), linger_s=linger_s),
        bus.uow,
        "admission",
        Metrics(),
        stop,
    )
    runner.batches = []
    task = asyncio.create_task(runner.run())
    try:
        await eventually(
            lambda: _ready(len(behaviour.handled) >= expected), timeout=20, what=f"{expected} handled"
        )
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)
    return runner.batches


async def _ready(value: bool) -> bool:
    return value


@pytest.mark.parametrize("linger_s", [0.0, 0.01])
async def test_a_backlog_is_taken_in_full_batches_in_order(bus: Bus, linger_s: float) -> None:
    job_ids = [f"j{i:02d}" for i in range(12)]
    for job_id in job_ids:
        await bus.publish(job_id)
    behaviour = Behaviour()
    batches = await run_consumer(bus, behaviour, linger_s=linger_s, batch=5, expected=12)
    assert behaviour.handled == job_ids, "handled once each, in stream order"
    assert batches == [5, 5, 2], "each pull took every message already there, up to the batch"


async def test_a_lone_message_is_handled_alone_without_waiting_for_the_batch(bus: Bus) -> None:
    await bus.publish("alone")
    behaviour = Behaviour()
    batches = await run_consumer(bus, behaviour, linger_s=0.0, batch=64, expected=1)
    assert behaviour.handled == ["alone"]
    assert batches == [1]
