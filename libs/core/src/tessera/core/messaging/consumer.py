"""The durable pull-consumer runner: decode, open a unit of work, check the inbox, handle, commit, then ack."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from tessera.contracts import subjects
from tessera.core import faults
from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.envelope import MSG_ID, Envelope, EnvelopeError, decode
from tessera.core.observability.logs import job_id_var
from tessera.core.observability.metrics import Metrics
from tessera.core.observability.tracing import span_from_headers
from tessera.core.settings import ConsumerSettings

log = logging.getLogger(__name__)

Handler = Callable[[Envelope, UnitOfWork], Awaitable[None]]


class PermanentError(Exception):
    """The message can never be handled; it goes to the dead-letter subject at once."""


@dataclass(frozen=True)
class ConsumerSpec:
    name: str
    stream_owner: str
    filter_subject: str
    handler: Handler
    max_deliver: int = 5
    ack_wait_s: float = 30.0
    batch: int = 64
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0

    @classmethod
    def configured(
        cls, name: str, stream_owner: str, filter_subject: str, handler: Handler, settings: ConsumerSettings
    ) -> ConsumerSpec:
        return cls(
            name,
            stream_owner,
            filter_subject,
            handler,
            settings.max_deliver,
            settings.ack_wait_s,
            settings.batch,
            settings.backoff_base_s,
            settings.backoff_max_s,
        )


class ConsumerRunner:
    def __init__(
        self,
        js: JetStreamContext,
        spec: ConsumerSpec,
        uow_factory: Callable[[], UnitOfWork],
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

    async def run(self) -> None:
        sub = await self._subscribe()
        while not self.stop.is_set():
            try:
                msgs = await sub.fetch(self.spec.batch, timeout=1.0)
            except TimeoutError:
                continue
            except Exception:
                if self.stop.is_set():
                    break
                log.exception("fetch failed", extra={"consumer": self.spec.name})
                await asyncio.sleep(0.5)
                continue
            for index, msg in enumerate(msgs):
                if self.stop.is_set():
                    # Hand back what was fetched but not started: redelivered at once, elsewhere or after restart.
                    for pending in msgs[index:]:
                        await pending.nak()
                    break
                await self.handle(msg)
        try:
            await sub.unsubscribe()
        except Exception:
            log.debug("unsubscribe after stop failed", exc_info=True)

    async def handle(self, msg: Msg) -> None:
        started = time.perf_counter()
        deliveries = msg.metadata.num_delivered or 1
        try:
            envelope = decode(msg.subject, msg.headers, msg.data)
            envelope.parse()
        except EnvelopeError as exc:
            await self.dead_letter(msg, f"undecodable: {exc}")
            return
        job_token = job_id_var.set(envelope.subject)
        try:
            with span_from_headers(
                f"handle {envelope.type}",
                envelope.headers,
                consumer=self.spec.name,
                event_id=envelope.id,
                job_id=envelope.subject,
            ) as span:
                outcome = await self._handle_in_uow(envelope)
                span.set_attribute("outcome", outcome)
            faults.hit("consumer.after_commit")
            await msg.ack()
            self.metrics.messages.labels(self.spec.name, outcome).inc()
        except PermanentError as exc:
            await self.dead_letter(msg, f"rejected by handler: {exc}")
        except Exception as exc:
            if deliveries >= self.spec.max_deliver:
                await self.dead_letter(msg, f"failed {deliveries} times, last error: {exc!r}")
            else:
                delay = self.backoff(deliveries)
                log.warning(
                    "handler failed; will retry",
                    extra={
                        "consumer": self.spec.name,
                        "event_id": envelope.id,
                        "delay_s": delay,
                        "error": repr(exc),
                    },
                )
                await msg.nak(delay=delay)
                self.metrics.messages.labels(self.spec.name, "retry").inc()
        finally:
            job_id_var.reset(job_token)
            self.metrics.handle_seconds.labels(self.spec.name).observe(time.perf_counter() - started)

    async def _handle_in_uow(self, envelope: Envelope) -> str:
        async with self.uow_factory() as uow:
            if await uow.seen(self.spec.name, envelope.id):
                return "duplicate"
            await self.spec.handler(envelope, uow)
            await uow.commit()
        return "handled"

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
