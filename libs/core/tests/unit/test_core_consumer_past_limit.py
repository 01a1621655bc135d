"""A message delivered past the limit (the durable consumer sets none, the runner counts) is
dead-lettered only when it was never handled: one handled whose ack was lost is acked."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from typing import Any

from tessera.core.messaging.consumer import ConsumerRunner, ConsumerSpec, DeadLetter
from tessera.core.messaging.envelope import Envelope
from tessera.core.observability.metrics import Metrics
from tessera.core.settings import ConsumerSettings

from .test_core_consumer_database_outage import Database, JetStream, Msg, UnitOfWork


class Service:
    """The handler and the dead-letter hook of a consumer with `max_deliver=3`, and what they saw."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.js = JetStream()
        self.handled: list[str] = []
        self.told: list[str] = []

    async def handler(self, envelope: Envelope, uow: Any) -> None:
        self.handled.append(envelope.subject)

    async def on_dead_letter(self, letter: DeadLetter, uow: Any) -> None:
        self.told.append(letter.reason)

    def runner(self) -> ConsumerRunner[Any]:
        settings = ConsumerSettings(max_deliver=3, backoff_base_s=0.01, backoff_max_s=0.05, ack_wait_s=1.0)
        spec = ConsumerSpec("c", "admission", "s", self.handler, on_dead_letter=self.on_dead_letter)
        return ConsumerRunner(  # type: ignore[type-var]
            self.js,  # type: ignore[arg-type]
            spec.configured(settings),
            lambda: UnitOfWork(self.db),
            "admission",
            Metrics(),
            asyncio.Event(),
        )


def redelivery(msg: Msg, deliveries: int) -> Msg:
    again = Msg(msg.subject)
    again.headers, again.data = msg.headers, msg.data
    again.metadata.num_delivered = deliveries
    return again


async def test_a_message_handled_on_its_last_delivery_whose_ack_was_lost_is_acked_not_dead_lettered() -> None:
    service = Service(Database(down_for_probes=0))
    consumer = service.runner()
    msg = redelivery(Msg("job-1"), 3)  # max_deliver
    await consumer.handle_batch([msg])  # type: ignore[list-item]
    assert (msg.settled, service.handled) == (["ack"], ["job-1"])

    again = redelivery(msg, 4)  # its ack was lost: delivered past the limit
    await consumer.handle_batch([again])  # type: ignore[list-item]
    assert (again.settled, service.js.published, service.told) == (["ack"], [], [])
    assert service.handled == ["job-1"], "not run again"


async def test_past_the_limit_a_message_tried_alone_is_dead_lettered_and_one_never_tried_alone_runs_once() -> (
    None
):
    service = Service(Database(down_for_probes=0))
    handled, tried, untried = (redelivery(Msg(job), 4) for job in ("job-1", "job-2", "job-3"))
    service.db.inbox |= {("c", handled.headers["ce-id"]), ("c.tried", tried.headers["ce-id"])}
    await service.runner().handle_batch([handled, tried, untried])  # type: ignore[list-item]
    assert (handled.settled, tried.settled, untried.settled) == (["ack"], ["term"], ["ack"])
    assert (service.js.published, service.handled) == (["tessera.admission.dlq.c"], ["job-3"])
    assert service.told == ["delivered 4 times, over the limit of 3"]


class Crash(BaseException):
    """The process dies while the handler runs: nothing of its transaction is committed."""


async def test_a_message_crashing_the_process_is_dead_lettered_alone_and_those_fetched_with_it_are_handled() -> (
    None
):
    service = Service(Database(down_for_probes=0))

    async def handler(envelope: Envelope, uow: Any) -> None:
        if envelope.subject == "job-1":
            raise Crash
        service.handled.append(envelope.subject)

    consumer = service.runner()
    consumer.spec = replace(consumer.spec, handler=handler)
    pending = [Msg(job) for job in ("job-1", "job-2", "job-3")]
    for deliveries in range(1, 10):  # each crash: every unsettled message is delivered again
        pending = [redelivery(msg, deliveries) for msg in pending if not msg.settled]
        if not pending:
            break
        with contextlib.suppress(Crash):
            await consumer.handle_batch(pending)  # type: ignore[arg-type]
    assert sorted(service.handled) == ["job-2", "job-3"], "handled, not dead-lettered"
    assert service.told == ["delivered 4 times, over the limit of 3"], "only the one that crashes"
    assert service.js.published == ["tessera.admission.dlq.c"]


async def test_a_message_past_the_limit_is_nakd_while_the_inbox_cannot_be_read() -> None:
    service = Service(Database(down_for_probes=1))
    msg = redelivery(Msg("job-1"), 4)
    await service.runner().handle_batch([msg])  # type: ignore[list-item]
    assert (msg.settled, service.js.published, service.told) == (["nak"], [], [])
