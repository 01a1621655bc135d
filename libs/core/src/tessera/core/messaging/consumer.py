"""The durable pull-consumer runner: decode, open a unit of work, check the inbox, handle, commit, then ack."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from sqlalchemy import text

from tessera.contracts import subjects
from tessera.core import faults
from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.envelope import MSG_ID, Envelope, EnvelopeError, decode
from tessera.core.observability.logs import job_id_var
from tessera.core.observability.metrics import Metrics
from tessera.core.observability.tracing import span_from_headers
from tessera.core.settings import ConsumerSettings
from tessera.core.waits import wait_any

log = logging.getLogger(__name__)

#: how long the consumer waits for the database to answer `SELECT 1` before deeming it down
DATABASE_PROBE_TIMEOUT_S = 5.0

UowT = TypeVar("UowT", bound=UnitOfWork)
Handler = Callable[[Envelope, UowT], Awaitable[None]]


class PermanentError(Exception):
    """The message can never be handled; it goes to the dead-letter subject at once."""


@dataclass(frozen=True)
class ConsumerSpec(Generic[UowT]):
    """A durable consumer: what it reads and which handler takes each message.

    Delivery settings (`max_deliver`, `ack_wait_s`, `batch`, backoff) come from the service's
    `consumer` settings, applied by the runner; `settings` overrides them for this consumer alone."""

    name: str
    stream_owner: str
    filter_subject: str
    handler: Handler[UowT]
    settings: ConsumerSettings | None = None
    linger_s: float = 0.01

    def configured(self, defaults: ConsumerSettings) -> ConsumerSpec[UowT]:
        return self if self.settings is not None else replace(self, settings=defaults)

    @property
    def delivery(self) -> ConsumerSettings:
        return self.settings if self.settings is not None else ConsumerSettings()

    @property
    def max_deliver(self) -> int:
        return self.delivery.max_deliver

    @property
    def ack_wait_s(self) -> float:
        return self.delivery.ack_wait_s

    @property
    def batch(self) -> int:
        return self.delivery.batch

    @property
    def backoff_base_s(self) -> float:
        return self.delivery.backoff_base_s

    @property
    def backoff_max_s(self) -> float:
        return self.delivery.backoff_max_s


class ConsumerRunner(Generic[UowT]):
    def __init__(
        self,
        js: JetStreamContext,
        spec: ConsumerSpec[UowT],
        uow_factory: Callable[[], UowT],
        service: str,
        metrics: Metrics,
        stop: asyncio.Event,
    ) -> None:
        self.js = js
        self.spec = spec
        self.uow_factory = uow_factory
        self.service = service
        self.metrics = metrics
        self.stop = stop
        self.subscribed = asyncio.Event()
        self.dlq_subject = subjects.dead_letter(service, spec.name)

    def backoff(self, deliveries: int) -> float:
        return float(min(self.spec.backoff_max_s, self.spec.backoff_base_s * 2 ** max(0, deliveries - 1)))

    async def _subscribe(self) -> JetStreamContext.PullSubscription:
        config = ConsumerConfig(
            durable_name=self.spec.name,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            max_deliver=self.spec.max_deliver,
            ack_wait=self.spec.ack_wait_s,
            filter_subject=self.spec.filter_subject,
        )
        delay = 0.2
        while not self.stop.is_set():
            try:
                sub = await self.js.pull_subscribe(
                    self.spec.filter_subject,
                    durable=self.spec.name,
                    stream=subjects.stream_name(self.spec.stream_owner),
                    config=config,
                )
                self.subscribed.set()
                return sub
            except NotFoundError:
                log.info("waiting for stream", extra={"stream": subjects.stream_name(self.spec.stream_owner)})
            except Exception:
                log.exception("subscribe failed; retrying", extra={"consumer": self.spec.name})
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
        raise asyncio.CancelledError

    async def _fetch(self, sub: JetStreamContext.PullSubscription) -> list[Msg]:
        """Wait up to a second for the first message, then take what else arrives within a few
        milliseconds: low latency when traffic trickles, full batches when it floods."""
        first = await sub.fetch(1, timeout=1.0)
        if self.spec.batch > 1:
            with contextlib.suppress(TimeoutError):
                first += await sub.fetch(self.spec.batch - 1, timeout=self.spec.linger_s)
        return first

    async def run(self) -> None:
        sub = await self._subscribe()
        while not self.stop.is_set():
            try:
                msgs = await self._fetch(sub)
            except TimeoutError:
                continue
            except Exception:
                if self.stop.is_set():
                    break
                log.exception("fetch failed", extra={"consumer": self.spec.name})
                await asyncio.sleep(0.5)
                continue
            try:
                await self.handle_batch(msgs)
            except Exception:
                # Say an ack failed on a NATS hiccup: whatever was not acked is redelivered after
                # ack_wait and the inbox drops what was already handled, so the consumer goes on.
                log.exception("settling a batch failed; unacked messages will be redelivered")
                await asyncio.sleep(0.5)
        try:
            await sub.unsubscribe()
        except Exception:
            log.debug("unsubscribe after stop failed", exc_info=True)

    async def handle(self, msg: Msg) -> None:
        await self.handle_batch([msg])

    async def handle_batch(self, msgs: list[Msg]) -> None:
        """Handle a fetched batch in one transaction, each message in its own savepoint, so one commit
        (one WAL flush) covers the batch while a failing message rolls back alone. Commit, then ack.

        A batch that fails while the database does not answer is no fault of its messages: they are
        held (their ack deadline extended) and the batch runs again once the database answers, so an
        outage spends none of their deliveries and sends none of them to the dead-letter subject."""
        started = time.perf_counter()
        decoded: list[tuple[Msg, Envelope]] = []
        for msg in msgs:
            try:
                envelope = decode(msg.subject, msg.headers, msg.data)
                envelope.parse()
            except EnvelopeError as exc:
                await self.dead_letter(msg, f"undecodable: {exc}")
                continue
            decoded.append((msg, envelope))
        if not decoded:
            return
        outcomes = await self._attempt(decoded)
        while (
            any(isinstance(o, BaseException) for _, _, o in outcomes) and not await self._database_answers()
        ):
            if not await self._hold_until_database_answers([msg for msg, _ in decoded]):
                return  # stopping: unsettled, JetStream redelivers them after the ack wait
            outcomes = await self._attempt(decoded)
        faults.hit("consumer.after_commit")
        for msg, envelope, outcome in outcomes:
            await self._settle(msg, envelope, outcome)
        elapsed = (time.perf_counter() - started) / len(decoded)
        for _ in decoded:
            self.metrics.handle_seconds.labels(self.spec.name).observe(elapsed)

    async def _attempt(
        self, decoded: list[tuple[Msg, Envelope]]
    ) -> list[tuple[Msg, Envelope, str | BaseException]]:
        """One transaction for the batch: the inbox rows of all its messages with one statement,
        then each new message's handler in its own savepoint. A message whose handler fails rolls
        back to its savepoint and its inbox row is removed again, so the commit records only what
        took effect: a redelivery of it is handled, a redelivery of the others is a duplicate."""
        outcomes: list[tuple[Msg, Envelope, str | BaseException]] = []
        try:
            async with self.uow_factory() as uow:
                duplicates = await uow.seen_many(self.spec.name, [envelope.id for _, envelope in decoded])
                taken: set[str] = set()
                failed: list[str] = []
                for msg, envelope in decoded:
                    if envelope.id in duplicates or envelope.id in taken:
                        outcomes.append((msg, envelope, "duplicate"))
                        continue
                    taken.add(envelope.id)
                    outcome = await self._handle_one(uow, envelope)
                    if isinstance(outcome, BaseException):
                        failed.append(envelope.id)
                    outcomes.append((msg, envelope, outcome))
                await uow.unsee(self.spec.name, failed)
                await uow.commit()
        except Exception as exc:  # the commit itself failed: nothing of the batch took effect
            log.warning(
                "batch commit failed; retrying each message",
                extra={"consumer": self.spec.name, "error": repr(exc)},
            )
            outcomes = [(msg, envelope, exc) for msg, envelope in decoded]
        return outcomes

    async def _database_answers(self) -> bool:
        async def probe() -> None:
            async with self.uow_factory() as uow:
                await uow.session.execute(text("SELECT 1"))

        try:
            await asyncio.wait_for(probe(), timeout=DATABASE_PROBE_TIMEOUT_S)
        except Exception:
            return False
        return True

    async def _hold_until_database_answers(self, msgs: list[Msg]) -> bool:
        """Keep `msgs` (extending their ack deadline) until the database answers; False on stop."""
        log.warning(
            "the database does not answer; holding the batch until it does",
            extra={"consumer": self.spec.name, "messages": len(msgs)},
        )
        delay = self.spec.backoff_base_s
        longest = max(self.spec.backoff_base_s, min(self.spec.backoff_max_s, self.spec.ack_wait_s / 2))
        while True:
            for msg in msgs:
                with contextlib.suppress(Exception):  # NATS away too: redelivered later, the inbox dedups
                    await msg.in_progress()
            if await wait_any(self.stop, timeout=delay):
                return False
            if await self._database_answers():
                log.info("the database answers again; retrying the batch", extra={"consumer": self.spec.name})
                return True
            delay = min(delay * 2, longest)

    async def _handle_one(self, uow: UowT, envelope: Envelope) -> str | BaseException:
        job_token = job_id_var.set(envelope.subject)
        try:
            with span_from_headers(
                f"handle {envelope.type}",
                envelope.headers,
                consumer=self.spec.name,
                event_id=envelope.id,
                job_id=envelope.subject,
            ) as span:
                try:
                    async with uow.session.begin_nested():
                        await self.spec.handler(envelope, uow)
                        await uow.flush_events()
                        outcome = "handled"
                except Exception as exc:
                    uow.forget_events()
                    span.record_exception(exc)
                    return exc
                span.set_attribute("outcome", outcome)
                return outcome
        finally:
            job_id_var.reset(job_token)

    async def _settle(self, msg: Msg, envelope: Envelope, outcome: str | BaseException) -> None:
        if isinstance(outcome, str):
            await msg.ack()
            self.metrics.messages.labels(self.spec.name, outcome).inc()
            return
        if isinstance(outcome, PermanentError):
            await self.dead_letter(msg, f"rejected by handler: {outcome}")
            return
        deliveries = msg.metadata.num_delivered or 1
        if deliveries >= self.spec.max_deliver:
            await self.dead_letter(msg, f"failed {deliveries} times, last error: {outcome!r}")
            return
        delay = self.backoff(deliveries)
        log.warning(
            "handler failed; will retry",
            extra={
                "consumer": self.spec.name,
                "event_id": envelope.id,
                "delay_s": delay,
                "error": repr(outcome),
            },
        )
        await msg.nak(delay=delay)
        self.metrics.messages.labels(self.spec.name, "retry").inc()

    async def dead_letter(self, msg: Msg, reason: str) -> None:
        headers = dict(msg.headers or {})
        original_id = headers.get(MSG_ID) or headers.get("ce-id") or f"seq-{msg.metadata.sequence.stream}"
        headers.update(
            {
                "tessera-dlq-reason": reason[:1000],
                "tessera-dlq-original-subject": msg.subject,
                "tessera-dlq-consumer": self.spec.name,
                "tessera-dlq-deliveries": str(msg.metadata.num_delivered or 1),
                MSG_ID: f"dlq-{self.spec.name}-{original_id}",
            }
        )
        await self.js.publish(self.dlq_subject, msg.data, headers=headers)
        await msg.term()
        self.metrics.dead_letters.labels(self.spec.name).inc()
        log.error(
            "message dead-lettered",
            extra={"consumer": self.spec.name, "reason": reason, "dlq_subject": self.dlq_subject},
        )
