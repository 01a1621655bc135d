"""The service stream's limits on real NATS: `ensure_stream` brings an existing stream to them, and a
stream that discards new messages refuses a publish when full instead of dropping unread ones, a
refusal the outbox relay's `publish_async` sees as such."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js.api import DiscardPolicy
from nats.js.errors import APIError, ServiceUnavailableError

from tessera.contracts import subjects
from tessera.core.messaging.publish_async import publish_async
from tessera.core.messaging.streams import StreamLimits, ensure_stream
from tessera.core.settings import StreamSettings
from tessera.testing.services import reset_jetstream

pytestmark = pytest.mark.integration

STREAM = subjects.stream_name("admission")


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    await reset_jetstream(nats_url)
    connection = await nats.connect(nats_url)
    try:
        yield connection
    finally:
        await connection.close()


async def test_a_full_stream_that_discards_new_refuses_a_publish_and_keeps_what_it_holds(nc: NATS) -> None:
    js = nc.jetstream()
    await ensure_stream(js, "admission", StreamLimits())  # as created by an earlier version
    assert (await js.stream_info(STREAM)).config.discard == DiscardPolicy.OLD

    await ensure_stream(js, "admission", StreamSettings(max_bytes=4096, discard="new").limits())
    config = (await js.stream_info(STREAM)).config
    assert (config.discard, config.max_bytes) == (DiscardPolicy.NEW, 4096), "the existing stream was updated"

    sequences, refused = [], None
    for i in range(64):  # far more than 4 KiB
        try:
            sequences.append((await js.publish(subjects.tenant_submit_job(f"t{i}"), b"x" * 200)).seq)
        except APIError as exc:
            refused = exc
            break
    assert refused is not None and refused.code == 503, "the publish that does not fit is refused"
    state = (await js.stream_info(STREAM)).state
    assert (state.first_seq, state.messages) == (1, len(sequences)), "no message was dropped to make room"


async def test_by_default_a_full_stream_still_drops_its_oldest_messages(nc: NATS) -> None:
    js = nc.jetstream()
    await ensure_stream(js, "admission", StreamSettings(max_bytes=4096).limits())
    for i in range(64):
        await js.publish(subjects.tenant_submit_job(f"t{i}"), b"x" * 200)
    state = (await js.stream_info(STREAM)).state
    assert state.first_seq > 1 and state.last_seq == 64


async def test_a_refused_publish_fails_its_pubacks_future_with_the_refusal(nc: NATS) -> None:
    """nats.py 2.16 left the future of an error PubAck pending for ever (its handler raised the
    error instead of setting it): the outbox relay saw a refusal as a PubAck that never came."""
    await ensure_stream(nc.jetstream(), "admission", StreamSettings(max_bytes=1024, discard="new").limits())
    js = nc.jetstream(publish_async_max_pending=3)
    outcomes: list[object] = []
    for i in range(12):  # the stream fills after a few; every later one is refused
        future = await publish_async(js, subjects.tenant_submit_job(f"t{i}"), b"x" * 200, {}, wait_stall=5.0)
        try:
            outcomes.append(await asyncio.wait_for(future, timeout=30))
        except ServiceUnavailableError as exc:
            outcomes.append(exc)
    refused = [o for o in outcomes if isinstance(o, ServiceUnavailableError)]
    assert refused and outcomes[-1] in refused, "the refusal reached the future"
    assert "maximum bytes" in (refused[0].description or "")
    assert js.publish_async_pending() == 0, "no slot is held by a refused publish"
