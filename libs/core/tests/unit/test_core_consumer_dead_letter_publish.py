"""A dead-letter copy JetStream does not take (a timeout, a 503) never costs the message: it is
terminated only once its copy is stored."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from nats.js.errors import ServiceUnavailableError

from tessera.core.messaging.consumer import ConsumerRunner, ConsumerSpec, PermanentError
from tessera.core.messaging.envelope import Envelope
from tessera.core.observability.metrics import Metrics
from tessera.core.settings import ConsumerSettings

from .test_core_consumer_database_outage import Database, Msg, UnitOfWork


class FlakyJetStream:
    """Refuses the first `failures` publishes as JetStream does while a node restarts."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.published: list[str] = []

    async def publish(self, subject: str, *_: Any, **__: Any) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise ServiceUnavailableError(code=503, description="JetStream not ready")
        self.published.append(subject)


def runner(js: FlakyJetStream, *, failing: Exception) -> ConsumerRunner[Any]:
    async def handler(envelope: Envelope, uow: Any) -> None:
        raise failing

    settings = ConsumerSettings(max_deliver=3, backoff_base_s=0.01, backoff_max_s=0.05, ack_wait_s=1.0)
    spec = ConsumerSpec("c", "admission", "s", handler).configured(settings)
    db = Database(down_for_probes=0)
    return ConsumerRunner(js, spec, lambda: UnitOfWork(db), "admission", Metrics(), asyncio.Event())  # type: ignore[arg-type, return-value]


async def test_on_the_last_delivery_a_failed_dead_letter_publish_naks_the_message_instead_of_holding_it() -> (
    None
):
    # The durable consumer delivers without a limit: the message comes back and is dead-lettered
    # then, and the consumer is never held up by a dead-letter subject that does not take copies.
    js = FlakyJetStream(failures=1)
    consumer = runner(js, failing=RuntimeError("still failing"))
    msg = Msg("job-1")
    msg.metadata.num_delivered = 3  # max_deliver
    await consumer.handle_batch([msg])  # type: ignore[list-item]
    assert (msg.settled, msg.in_progress_calls, js.published) == (["nak"], 0, []), "nak'd, not held"

    handled: list[str] = []

    async def handler(envelope: Envelope, uow: Any) -> None:
        handled.append(envelope.subject)

    consumer.spec = replace(consumer.spec, handler=handler)
    again = Msg("job-1")
    again.headers, again.data = msg.headers, msg.data
    again.metadata.num_delivered = 4  # past the limit: dead-lettered without running again
    await consumer.handle_batch([again])  # type: ignore[list-item]
    assert (again.settled, js.published, handled) == (["term"], ["tessera.admission.dlq.c"], [])


async def test_with_deliveries_left_a_failed_dead_letter_publish_naks_the_message() -> None:
    js = FlakyJetStream(failures=1)
    consumer = runner(js, failing=PermanentError("never"))
    msg = Msg("job-1")
    await consumer.handle_batch([msg])  # type: ignore[list-item]
    assert (msg.settled, js.published) == (["nak"], []), "kept for a redelivery, not terminated"

    again = Msg("job-1")
    again.headers, again.data = msg.headers, msg.data
    again.metadata.num_delivered = 2
    await consumer.handle_batch([again])  # type: ignore[list-item]
    assert (again.settled, js.published) == (["term"], ["tessera.admission.dlq.c"])
