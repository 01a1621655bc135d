"""The relay's `publish_async` on real NATS: while a PubAck slot is free a publish takes no turn of the
event loop (a round's messages go out together, not one socket write and one task each), and with
every slot taken it still waits at most `wait_stall`."""

from __future__ import annotations

import asyncio

import nats
import nats.js.errors
import pytest

from tessera.contracts import subjects
from tessera.contracts.events import SubmitJob
from tessera.core.messaging.envelope import encode
from tessera.core.messaging.publish_async import publish_async
from tessera.core.messaging.streams import StreamLimits, ensure_stream
from tessera.testing.services import reset_jetstream

pytestmark = pytest.mark.integration

MESSAGES = 200


def message(n: int) -> tuple[bytes, dict[str, str]]:
    _, headers, body = encode(SubmitJob(job_id=f"job-{n}", spec={}), "tessera/test", event_id=f"evt-{n}")
    return body, headers


async def test_publishes_with_a_slot_free_take_no_turn_of_the_loop_each(nats_url: str) -> None:
    await reset_jetstream(nats_url)
    nc = await nats.connect(nats_url)
    try:
        await ensure_stream(nc.jetstream(), "admission", StreamLimits())
        js = nc.jetstream()
        body, headers = message(-1)  # the first call subscribes the PubAck handler
        await asyncio.wait_for(
            await publish_async(js, subjects.SUBMIT_JOB, body, headers, wait_stall=1.0), 10
        )
        turns = 0
        counting = True

        async def count_turns() -> None:
            nonlocal turns
            while counting:
                turns += 1
                await asyncio.sleep(0)

        counter = asyncio.create_task(count_turns())
        await asyncio.sleep(0)
        turns = 0
        futures = []
        for n in range(MESSAGES):
            body, headers = message(n)
            futures.append(await publish_async(js, subjects.SUBMIT_JOB, body, headers, wait_stall=1.0))
        turns_while_publishing = turns
        counting = False
        acks = await asyncio.wait_for(asyncio.gather(*futures), timeout=10)
        await counter
        # before: the slot was taken in a task of its own, a turn of the loop per message
        assert turns_while_publishing == 0
        assert len({ack.seq for ack in acks}) == MESSAGES, "each message stored once"
        assert js.publish_async_pending() == 0
    finally:
        await nc.close()


async def test_with_every_slot_taken_a_publish_waits_at_most_wait_stall(nats_url: str) -> None:
    await reset_jetstream(nats_url)
    nc = await nats.connect(nats_url)
    try:
        await ensure_stream(nc.jetstream(), "admission", StreamLimits())
        js = nc.jetstream(publish_async_max_pending=2)
        body, headers = message(-1)
        await asyncio.wait_for(
            await publish_async(js, subjects.SUBMIT_JOB, body, headers, wait_stall=1.0), 10
        )
        slots = js._publish_async_pending_semaphore  # nats-py 2.16: held here as PubAcks in flight would
        for _ in range(2):
            await slots.acquire()
        body, headers = message(0)
        with pytest.raises(nats.js.errors.TooManyStalledMsgsError):
            await asyncio.wait_for(
                publish_async(js, subjects.SUBMIT_JOB, body, headers, wait_stall=0.1), timeout=5
            )
        slots.release()
        ack = await asyncio.wait_for(
            await publish_async(js, subjects.SUBMIT_JOB, body, headers, wait_stall=1.0), 10
        )
        assert ack.stream == subjects.stream_name("admission")
    finally:
        await nc.close()
