"""The consumer's fetch on real NATS and PostgreSQL: one pull takes every message already there as
one batch (up to the batch size), without a task per message, and a lone message is handled without
waiting for a batch to fill."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from dataclasses import replace

import pytest
from nats.aio.msg import Msg
from nats.js import JetStreamContext

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


class TaskCounter(BatchRecorder):
    """Records, for each fetch, the messages it took and the tasks it made."""

    fetches: list[tuple[int, int]]

    async def _fetch(self, sub: JetStreamContext.PullSubscription) -> list[Msg]:
        loop = asyncio.get_running_loop()
        made = 0

        def counting(
            loop: asyncio.AbstractEventLoop, coro: Coroutine[object, object, object], **kwargs: object
        ) -> asyncio.Task[object]:
            nonlocal made
            made += 1
            return asyncio.Task(coro, loop=loop, **kwargs)  # type: ignore[arg-type]

        before = loop.get_task_factory()
        loop.set_task_factory(counting)  # type: ignore[arg-type]
        try:
            msgs = await super()._fetch(sub)
        finally:
            loop.set_task_factory(before)
        self.fetches.append((len(msgs), made))
        return msgs


async def run_consumer(
    bus: Bus,
    behaviour: Behaviour,
    *,
    linger_s: float,
    batch: int,
    expected: int,
    runner_type: type[BatchRecorder] = BatchRecorder,
) -> BatchRecorder:
    stop = asyncio.Event()
    runner = runner_type(
        bus.nc.jetstream(),
        replace(spec(behaviour, batch=batch), linger_s=linger_s),
        bus.uow,
        "admission",
        Metrics(),
        stop,
    )
    runner.batches = []
    if isinstance(runner, TaskCounter):
        runner.fetches = []
    task = asyncio.create_task(runner.run())
    try:
        await eventually(
            lambda: _ready(len(behaviour.handled) >= expected), timeout=20, what=f"{expected} handled"
        )
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)
    return runner


async def _ready(value: bool) -> bool:
    return value


@pytest.mark.parametrize("linger_s", [0.0, 0.01])
async def test_a_backlog_is_taken_in_full_batches_in_order(bus: Bus, linger_s: float) -> None:
    job_ids = [f"j{i:02d}" for i in range(12)]
    for job_id in job_ids:
        await bus.publish(job_id)
    behaviour = Behaviour()
    batches = (await run_consumer(bus, behaviour, linger_s=linger_s, batch=5, expected=12)).batches
    assert behaviour.handled == job_ids, "handled once each, in stream order"
    assert batches == [5, 5, 2], "each pull took every message already there, up to the batch"


async def test_a_lone_message_is_handled_alone_without_waiting_for_the_batch(bus: Bus) -> None:
    await bus.publish("alone")
    behaviour = Behaviour()
    batches = (await run_consumer(bus, behaviour, linger_s=0.0, batch=64, expected=1)).batches
    assert behaviour.handled == ["alone"]
    assert batches == [1]


async def test_a_backlog_is_taken_without_a_task_per_message(bus: Bus) -> None:
    job_ids = [f"j{i:02d}" for i in range(40)]
    for job_id in job_ids:
        await bus.publish(job_id)
    behaviour = Behaviour()
    runner = await run_consumer(bus, behaviour, linger_s=0.0, batch=64, expected=40, runner_type=TaskCounter)
    assert isinstance(runner, TaskCounter)
    assert behaviour.handled == job_ids, "handled once each, in stream order"
    taken, made = runner.fetches[0]
    assert taken == 40
    # before: nats.py's `next_msg` made two tasks for each message, queued already or not
    assert made <= 10, f"{made} tasks for a batch of {taken}"
