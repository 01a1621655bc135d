"""The durable pull-consumer runner: decode, open a unit of work, check the inbox, handle, commit, then ack."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from sqlalchemy import text

from tessera.contracts import subjects
from tessera.core import faults
from tessera.core.messaging.consumer_loop import EnsureStream, PullLoop
from tessera.core.messaging.consumer_spec import ConsumerSpec, DeadLetterHook, Handler, UowT
from tessera.core.messaging.dead_letter_publish import DeadLetterPublish
from tessera.core.messaging.dead_letters import DeadLetter, dead_letter_copy, original_id
from tessera.core.messaging.envelope import Envelope, decode
from tessera.core.messaging.failures import PermanentError, describe, is_permanent
from tessera.core.messaging.limits import surely_fits, wire_size
from tessera.core.observability.logs import job_id_var, trace_id_from_headers, trace_id_var
from tessera.core.observability.metrics import Metrics
from tessera.core.observability.ratelimit import RateLimitedLog
from tessera.core.observability.tracing import span_from_headers
from tessera.core.waits import wait_any

log = logging.getLogger(__name__)

#: how long the consumer waits for the database to answer `SELECT 1` before deeming it down
DATABASE_PROBE_TIMEOUT_S = 5.0

#: nats.py's default, used until a connection tells the server's own
DEFAULT_MAX_PAYLOAD = 1024 * 1024
#: the inbox's `message_id` column: a longer id could not be recorded, so it is refused at intake
MAX_MESSAGE_ID = 128

__all__ = ["ConsumerRunner", "ConsumerSpec", "DeadLetter", "DeadLetterHook", "Handler", "PermanentError"]


class ConsumerRunner(PullLoop[UowT]):
    def __init__(
        self,
        js: JetStreamContext,
        spec: ConsumerSpec[UowT],
        uow_factory: Callable[[], UowT],
        service: str,
        metrics: Metrics,
        stop: asyncio.Event,
        max_payload: Callable[[], int] = lambda: DEFAULT_MAX_PAYLOAD,
        ensure_stream: EnsureStream | None = None,
    ) -> None:
        self.js = js
        self.spec = spec
        self.uow_factory = uow_factory
        self.service = service
        self.metrics = metrics
        self.stop = stop
        self.max_payload = max_payload
        self.ensure_stream = ensure_stream
        self.subscribed = asyncio.Event()
        self.dlq_subject = subjects.dead_letter(service, spec.name)
        self.stream = subjects.stream_name(spec.stream_owner)
        self._tried = f"{spec.name}.tried"
        self._failures = RateLimitedLog(log)
        self._dead_letters = DeadLetterPublish(js, self.dlq_subject, spec.name, self._failures)

    def intake_limit(self) -> int:
        """The largest message this consumer takes: its setting, within the server's `max_payload`."""
        return min(self.spec.max_message_bytes, self.max_payload())

    def backoff(self, deliveries: int) -> float:
        return float(min(self.spec.backoff_max_s, self.spec.backoff_base_s * 2 ** max(0, deliveries - 1)))

    async def handle(self, msg: Msg) -> None:
        await self.handle_batch([msg])

    async def handle_batch(self, msgs: list[Msg]) -> None:
        """Handle a fetched batch in one transaction, so one commit (one WAL flush) covers the batch
        while a failing message rolls back alone (:meth:`_attempt`). Commit, then ack.

        A message delivered again runs in a batch of its own, after the others, marked in the inbox
        (`<consumer>.tried`) before it runs: one that crashes the process, raising the delivery
        count of every message fetched with it, takes none of them down with it (a message past the
        limit never tried alone runs once alone, :meth:`_settle_past_limit`).

        A batch that fails while the database does not answer is no fault of its messages: they are
        held (their ack deadline extended) and the batch runs again once the database answers, so an
        outage spends none of their deliveries and sends none of them to the dead-letter subject."""
        self._observe_delivery(msgs)
        decoded: list[tuple[Msg, Envelope]] = []
        past: list[tuple[Msg, Envelope]] = []
        alone: list[tuple[Msg, Envelope]] = []
        for msg in msgs:
            refused = self._intake(msg)
            if isinstance(refused, tuple):
                with _message_context(msg.headers, ""):
                    await self.dead_letter(msg, refused[1], kind=refused[0])
                continue
            deliveries = msg.metadata.num_delivered or 1
            over = deliveries > self.spec.max_deliver
            (past if over else alone if deliveries > 1 else decoded).append((msg, refused))
        await self._handle_together(decoded)
        if past:
            alone += await self._settle_past_limit(past)
        for one in alone:
            await self._handle_alone(one)

    async def _handle_alone(self, one: tuple[Msg, Envelope]) -> None:
        """Mark the message tried alone (committed before it runs), then run it in its own batch."""
        try:
            async with self.uow_factory() as uow:
                await uow.seen(self._tried, one[1].id)
                await uow.commit()
        except Exception as exc:  # the database away: the batch below is held until it answers
            extra = {"consumer": self.spec.name, "error": repr(exc)}
            self._failures.warning(
                f"tried:{type(exc).__name__}", "marking a message tried failed", extra=extra
            )
        await self._handle_together([one])

    async def _handle_together(self, decoded: list[tuple[Msg, Envelope]]) -> None:
        if not decoded:
            return
        started = time.perf_counter()
        outcomes, whole_batch_failed = await self._attempt(decoded)
        while (
            any(isinstance(o, BaseException) for _, _, o in outcomes) and not await self._database_answers()
        ):
            if not await self._hold_until_database_answers([msg for msg, _ in decoded]):
                return  # stopping: unsettled, JetStream redelivers them after the ack wait
            outcomes, whole_batch_failed = await self._attempt(decoded)
        if whole_batch_failed and len(decoded) > 1:
            # the database answers, yet the batch failed as a whole: one message in it may be the
            # cause, so each one is tried alone and only the culprit pays
            outcomes = [o for one in decoded for o in (await self._attempt([one]))[0]]
        faults.hit("consumer.after_commit")
        for msg, envelope, outcome in outcomes:
            with _message_context(envelope.headers, envelope.subject):
                await self._settle(msg, envelope, outcome)
        elapsed = (time.perf_counter() - started) / len(decoded)
        for _ in decoded:
            self.metrics.handle_seconds.labels(self.spec.name).observe(elapsed)

    async def _settle_past_limit(self, past: list[tuple[Msg, Envelope]]) -> list[tuple[Msg, Envelope]]:
        """Messages delivered past the limit (the runner counts, the durable consumer sets none):
        those handled (their ack lost) are acked, those tried alone before (a crash, a copy not
        stored) dead-lettered without running again, and the others (fetched with one that crashed
        the process) returned to run once alone. Nak'd while the inbox cannot be read."""
        ids = [envelope.id for _, envelope in past]
        try:
            async with self.uow_factory() as uow:  # never committed: the inbox is only read
                handled = await uow.seen_many(self.spec.name, ids)
                tried = await uow.seen_many(self._tried, ids)
        except Exception as exc:
            self._failures.warning(
                f"past-limit:{type(exc).__name__}",
                "reading the inbox for messages past the delivery limit failed; will retry",
                extra={"consumer": self.spec.name, "error": repr(exc), "messages": len(past)},
            )
            for msg, _ in past:
                await msg.nak(delay=self.backoff(msg.metadata.num_delivered or 1))
            return []
        untried: list[tuple[Msg, Envelope]] = []
        for msg, envelope in past:
            if envelope.id not in handled and envelope.id not in tried:
                untried.append((msg, envelope))
                continue
            with _message_context(envelope.headers, envelope.subject):
                if envelope.id in handled:
                    await msg.ack()
                    self.metrics.messages.labels(self.spec.name, "duplicate").inc()
                    continue
                deliveries = msg.metadata.num_delivered or 1
                reason = f"delivered {deliveries} times, over the limit of {self.spec.max_deliver}"
                await self.dead_letter(msg, reason, kind="exhausted", envelope=envelope)
        return untried

    async def _attempt(
        self, decoded: list[tuple[Msg, Envelope]]
    ) -> tuple[list[tuple[Msg, Envelope, str | BaseException]], bool]:
        """The batch in one transaction (:meth:`_run`): the outcomes, and whether the batch failed
        as a whole (its inbox statement or its commit), in which case nothing of it took effect.

        A handler runs without a savepoint while no handler before it in the transaction could be
        lost by a rollback: the first handled message of a batch, and every message of a batch whose
        spec is `replay_safe` (its handlers' effects all live in the unit of work, so running them
        again after a rollback does nothing twice). When such a handler fails, the transaction is
        rolled back and the batch runs again, once, with a savepoint before every handler and the
        failed message not run again. So a replay-safe batch whose handlers succeed pays no savepoint,
        and any other batch a savepoint per message after its first (two round trips for a handler
        that sends statements, none for one that sends none)."""
        known: dict[int, BaseException] = {}
        replay = self.spec.replay_safe
        try:
            while True:
                try:
                    return await self._run(decoded, known, replay=replay), False
                except _Restart as restart:
                    known[restart.index] = restart.error
                    replay = False
        except Exception as exc:  # the inbox statement or the commit failed: nothing took effect
            self._failures.warning(
                f"batch:{type(exc).__name__}",
                "batch failed as a whole; retrying",
                extra={"consumer": self.spec.name, "error": repr(exc), "messages": len(decoded)},
            )
            return [(msg, envelope, exc) for msg, envelope in decoded], True

    async def _run(
        self, decoded: list[tuple[Msg, Envelope]], known: Mapping[int, BaseException], *, replay: bool
    ) -> list[tuple[Msg, Envelope, str | BaseException]]:
        """One transaction: the inbox rows of the batch's messages with one statement, then each new
        message's handler, then one commit. A handler that fails after a savepoint rolls back to it
        and its inbox row is removed again, so the commit records only what took effect: a
        redelivery of it is handled, a redelivery of the others is a duplicate. A handler that fails
        without one raises :class:`_Restart`. `known` holds the outcomes of messages that failed in
        an earlier try of this batch; they are not run again. A later copy of a failed message (the
        same event id) takes its outcome and is retried with it, and the id's inbox row is never
        written: a redelivery of either copy is handled, never acked as a duplicate of nothing."""
        outcomes: list[tuple[Msg, Envelope, str | BaseException]] = []
        failed_ids = {decoded[index][1].id: error for index, error in known.items()}
        async with self.uow_factory() as uow:
            new_ids = [envelope.id for _, envelope in decoded if envelope.id not in failed_ids]
            duplicates = await uow.seen_many(self.spec.name, new_ids)
            taken: set[str] = set()
            failed: list[str] = []
            guarded = False  # a handler succeeded in this transaction: a savepoint must protect it
            for index, (msg, envelope) in enumerate(decoded):
                if envelope.id in failed_ids:
                    outcomes.append((msg, envelope, known.get(index, failed_ids[envelope.id])))
                    continue
                if envelope.id in duplicates or envelope.id in taken:
                    outcomes.append((msg, envelope, "duplicate"))
                    continue
                taken.add(envelope.id)
                savepoint = not replay and (guarded or bool(known))
                outcome = await self._handle_one(uow, envelope, savepoint=savepoint)
                if isinstance(outcome, BaseException):
                    if not savepoint:
                        raise _Restart(index, outcome)
                    failed.append(envelope.id)
                    failed_ids[envelope.id] = outcome
                else:
                    guarded = True
                outcomes.append((msg, envelope, outcome))
            await uow.unsee(self.spec.name, failed)
            await uow.commit()
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

    async def _handle_one(self, uow: UowT, envelope: Envelope, *, savepoint: bool) -> str | BaseException:
        """Run the handler (in a savepoint of its own when told: SQLAlchemy sends its `SAVEPOINT`
        with the handler's first statement, and nothing for a handler that sends none)."""
        with (
            _message_context(envelope.headers, envelope.subject),
            span_from_headers(
                f"handle {envelope.type}",
                envelope.headers,
                consumer=self.spec.name,
                event_id=envelope.id,
                job_id=envelope.subject,
            ) as span,
        ):
            try:
                if savepoint:
                    async with uow.session.begin_nested():
                        await self._handle(uow, envelope)
                else:
                    await self._handle(uow, envelope)
                outcome = "handled"
            except Exception as exc:
                uow.forget_events()
                span.record_exception(exc)
                return exc
            span.set_attribute("outcome", outcome)
            return outcome

    async def _handle(self, uow: UowT, envelope: Envelope) -> None:
        await self.spec.handler(envelope, uow)
        await uow.flush_events()

    async def _settle(self, msg: Msg, envelope: Envelope, outcome: str | BaseException) -> None:
        if isinstance(outcome, str):
            await msg.ack()
            self.metrics.messages.labels(self.spec.name, outcome).inc()
            return
        if isinstance(outcome, PermanentError):
            await self.dead_letter(
                msg, f"rejected by handler: {outcome}", kind="permanent", envelope=envelope
            )
            return
        if is_permanent(outcome):  # a wrong type, an overflow, a value the database refuses
            await self.dead_letter(
                msg, f"can never be handled: {describe(outcome)}", kind="permanent", envelope=envelope
            )
            return
        deliveries = msg.metadata.num_delivered or 1
        if deliveries >= self.spec.max_deliver:
            await self.dead_letter(
                msg,
                f"failed {deliveries} times, last error: {outcome!r}",
                kind="exhausted",
                envelope=envelope,
            )
            return
        delay = self.backoff(deliveries)
        self._failures.warning(
            f"retry:{type(outcome).__name__}",
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

    def _intake(self, msg: Msg) -> Envelope | tuple[str, str]:
        """The message decoded, or (kind, reason) why it is refused at the door: too large, not a
        CloudEvent, an id the inbox cannot record, or a body that fails its contract."""
        limit = self.intake_limit()
        if not surely_fits(msg.headers, msg.data, limit):
            size = wire_size(msg.headers, msg.data)
            if size > limit:
                return "too_large", f"too large: {size} bytes with headers, over the limit of {limit} bytes"
        try:
            envelope = decode(msg.subject, msg.headers, msg.data)
            if len(envelope.id) > MAX_MESSAGE_ID or not envelope.id.isprintable():
                return (
                    "undecodable",
                    f"undecodable: ce-id must be at most {MAX_MESSAGE_ID} printable characters",
                )
            envelope.parse()
        except Exception as exc:  # EnvelopeError, and whatever else bad bytes raise (a UnicodeError)
            return "undecodable", f"undecodable: {describe(exc)}"
        return envelope

    def _observe_delivery(self, msgs: list[Msg]) -> None:
        redelivered = sum(1 for msg in msgs if (msg.metadata.num_delivered or 1) > 1)
        if redelivered:
            self.metrics.redeliveries.labels(self.spec.name).inc(redelivered)
        if msgs:
            self.metrics.consumer_lag.labels(self.spec.name).set(
                getattr(msgs[-1].metadata, "num_pending", 0) or 0
            )

    async def dead_letter(
        self, msg: Msg, reason: str, *, kind: str = "permanent", envelope: Envelope | None = None
    ) -> None:
        """Tell the service (`on_dead_letter`), publish the copy to the dead-letter subject, then
        terminate the original; not before the copy is stored (:class:`DeadLetterPublish`). The copy
        fits the server's limit: a body that does not is cut, and the copy names the stream and
        sequence where the whole original still lies."""
        headers = dict(msg.headers or {})
        sequence = msg.metadata.sequence.stream
        await self._tell_service(
            DeadLetter(self.spec.name, original_id(headers, sequence), headers, envelope, kind, reason)
        )
        copy_headers, body = dead_letter_copy(
            headers=headers,
            body=msg.data,
            subject=msg.subject,
            consumer=self.spec.name,
            reason=reason,
            deliveries=msg.metadata.num_delivered or 1,
            stream=getattr(msg.metadata, "stream", None) or self.stream,
            stream_sequence=sequence,
            limit=self.max_payload(),
        )
        retry_in = self.backoff(msg.metadata.num_delivered or 1)
        if not await self._dead_letters.publish(msg, body, copy_headers, retry_in_s=retry_in):
            return  # nak'd: dead-lettered again when it comes back; terminated once its copy is stored
        await msg.term()
        self.metrics.dead_letters.labels(self.spec.name, kind).inc()
        log.error(
            "message dead-lettered",
            extra={
                "consumer": self.spec.name,
                "kind": kind,
                "reason": reason,
                "dlq_subject": self.dlq_subject,
                "stream_sequence": sequence,
            },
        )

    async def _tell_service(self, letter: DeadLetter) -> None:
        """Run the spec's hook once per message id, in its own transaction; a failing hook is logged
        and the message is dead-lettered all the same (it must not loop)."""
        hook = self.spec.on_dead_letter
        if hook is None:
            return
        recordable = len(letter.message_id) <= MAX_MESSAGE_ID and letter.message_id.isprintable()
        try:
            async with self.uow_factory() as uow:
                if recordable and await uow.seen(f"{self.spec.name}.dead", letter.message_id):
                    return
                await hook(letter, uow)
                await uow.commit()
        except Exception:
            log.exception("the dead-letter hook failed", extra={"consumer": self.spec.name})


class _Restart(Exception):
    """A handler failed with no savepoint before it: the transaction must be rolled back whole."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(index)
        self.index = index
        self.error = error


@contextlib.contextmanager
def _message_context(headers: Mapping[str, str] | None, job_id: str) -> Iterator[None]:
    """Log lines written while a message is handled or settled carry its trace id and job id."""
    trace_token = trace_id_var.set(trace_id_from_headers(headers))
    job_token = job_id_var.set(job_id)
    try:
        yield
    finally:
        job_id_var.reset(job_token)
        trace_id_var.reset(trace_token)
