"""Messaging that cannot be poisoned, on real NATS and PostgreSQL: a message that can never be handled
is dead-lettered at once, its dead-letter copy always fits the server's limit, a bad message in a
batch costs only itself, and the connection survives all of it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from tessera.core.messaging.dead_letters import DELIVERIES, REASON
from tessera.core.messaging.limits import ORIGINAL_SEQUENCE, ORIGINAL_STREAM, TRUNCATED, wire_size
from tessera.core.observability.logs import TraceIdFilter
from tessera.core.observability.metrics import Metrics
from tessera.testing.services import eventually

from .poison_harness import TRACEPARENT, Behaviour, Bus, consuming, open_bus

pytestmark = pytest.mark.integration


@pytest.fixture
async def bus(nats_url: str, fresh_database: str) -> AsyncIterator[Bus]:
    async with open_bus(nats_url, fresh_database) as b:
        yield b


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_a_value_the_database_refuses_is_dead_lettered_at_once_and_its_sender_told(bus: Bus) -> None:
    behaviour, metrics = Behaviour(), Metrics()
    async with consuming(bus, behaviour, metrics=metrics):
        await bus.publish("overflow-1")
        await bus.publish("refused-1")
        await bus.publish("ok-1")
        letters = await eventually(
            lambda: _at_least(bus.dead_letters(), 2), timeout=20, what="two dead letters"
        )
        await eventually(lambda: _true("ok-1" in behaviour.handled), what="ok-1 handled")

    reasons = {m.headers["ce-subject"]: m.headers for m in letters}  # type: ignore[index]
    assert reasons["overflow-1"][DELIVERIES] == "1", "no redelivery loop for a permanent error"
    assert "out of range" in reasons["overflow-1"][REASON]
    assert reasons["refused-1"][DELIVERIES] == "1"
    assert behaviour.attempts == {"overflow-1": 1, "refused-1": 1, "ok-1": 1}
    assert sorted((letter.kind, letter.envelope is not None) for letter in behaviour.letters) == [
        ("permanent", True),
        ("permanent", True),
    ]
    assert sample(metrics, "tessera_dead_letters_total", consumer="poison-test", kind="permanent") == 2


async def test_a_dead_letter_copy_too_large_for_the_server_is_cut_and_points_at_the_original(
    bus: Bus,
) -> None:
    limit = bus.nc.max_payload
    behaviour = Behaviour()
    async with consuming(bus, behaviour):
        # fits as published; with the dead-letter headers added it would not
        seq = await bus.publish("refused-big", padding=bus.padding_to("refused-big", limit - 50))
        await eventually(lambda: _true(bool(behaviour.letters)), what="the hook told")
        letters = await eventually(lambda: _at_least(bus.dead_letters(), 1), what="a dead letter")
        await bus.publish("ok-after")
        await eventually(lambda: _true("ok-after" in behaviour.handled), what="a later message handled")
    assert bus.nc.is_connected

    (copy,) = letters
    headers = copy.headers or {}
    assert wire_size(headers, copy.data) <= limit
    assert headers[TRUNCATED] == "true"
    assert headers[ORIGINAL_STREAM] == "TESSERA_ADMISSION" and headers[ORIGINAL_SEQUENCE] == str(seq)
    original = await bus.nc.jetstream().get_msg("TESSERA_ADMISSION", seq)
    assert original.data is not None and len(original.data) > len(copy.data)
    assert original.data.startswith(copy.data), "the copy is the original's beginning"


async def test_bad_messages_in_a_batch_cost_only_themselves(bus: Bus) -> None:
    behaviour, metrics = Behaviour(), Metrics()
    async with consuming(bus, behaviour, metrics=metrics, max_message_bytes=4096, batch=16):
        await bus.publish("ok-1")
        await bus.publish("too-big", padding=8_000)
        await bus.publish("not-utf8", body=b'{"spec": "\xff\xfe"}')
        await bus.publish("long-id", headers={"ce-id": "i" * 200, "Nats-Msg-Id": "long-id"})
        await bus.publish("ok-2")
        await eventually(lambda: _at_least(bus.dead_letters(), 3), what="three dead letters")
        await eventually(lambda: _true({"ok-1", "ok-2"} <= set(behaviour.handled)), what="ok-1 and ok-2")

    kinds = sorted(
        (letter.headers["ce-subject"], letter.kind, letter.envelope) for letter in behaviour.letters
    )
    assert kinds == [
        ("long-id", "undecodable", None),
        ("not-utf8", "undecodable", None),
        ("too-big", "too_large", None),
    ]
    too_big = next(letter for letter in behaviour.letters if letter.kind == "too_large")
    assert "over the limit of 4096 bytes" in too_big.reason
    assert sorted(behaviour.handled) == ["ok-1", "ok-2"]
    assert sample(metrics, "tessera_dead_letters_total", consumer="poison-test", kind="undecodable") == 2


async def test_redeliveries_lag_and_trace_ids_are_visible(bus: Bus, caplog: pytest.LogCaptureFixture) -> None:
    caplog.handler.addFilter(TraceIdFilter())
    caplog.set_level(logging.INFO)
    behaviour, metrics = Behaviour(), Metrics()
    async with consuming(bus, behaviour, metrics=metrics):
        await bus.publish("flaky-1")
        await bus.publish("refused-1")
        await eventually(lambda: _true("flaky-1" in behaviour.handled), what="flaky-1 handled on its retry")
        await eventually(lambda: _true(bool(behaviour.letters)), what="refused-1 dead-lettered")
    assert sample(metrics, "tessera_consumer_redeliveries_total", consumer="poison-test") >= 1
    assert (
        metrics.registry.get_sample_value("tessera_consumer_lag_messages", {"consumer": "poison-test"})
        is not None
    )
    trace_id = TRACEPARENT.split("-")[1]
    inside = [
        r for r in caplog.records if r.getMessage() in ("handler failed; will retry", "message dead-lettered")
    ]
    assert {r.getMessage() for r in inside} == {"handler failed; will retry", "message dead-lettered"}
    assert {getattr(r, "trace_id", None) for r in inside} == {trace_id}


async def _at_least(found: object, n: int) -> object:
    items = await found  # type: ignore[misc]
    return items if len(items) >= n else None


async def _true(value: bool) -> bool:
    return value
