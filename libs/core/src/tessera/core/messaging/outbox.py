"""The outbox relay: publish committed events in order, and delete each row only after its PubAck.

A row that can never be published (over the server's size limit, or refused by every try while the
rows around it go through) moves to the service's `outbox_dead_letters` table with the reason, so it
never holds up the rows behind it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import PubAck
from sqlalchemy import BigInteger, Table, any_, bindparam, delete, func, insert, select, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tessera.core import faults
from tessera.core.db.messaging_tables import outbox_dead_letters_of
from tessera.core.messaging.failures import describe, is_permanent
from tessera.core.messaging.limits import MessageTooLarge, check_fits
from tessera.core.messaging.publish_async import connected, publish_async
from tessera.core.observability.metrics import Metrics
from tessera.core.observability.ratelimit import RateLimitedLog

log = logging.getLogger(__name__)

#: nats.py's default, used until a connection tells the server's own
DEFAULT_MAX_PAYLOAD = 1024 * 1024

#: the connection is away, not the row: such a failure does not count against the row
_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,  # ConnectionResetError, and nats' TimeoutError (a timeout is judged apart)
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.ConnectionDrainingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    nats.js.errors.TooManyStalledMsgsError,  # no PubAck slot came free in time: NATS is not answering
)
#: no stream answered the publish: JetStream is away (a NATS node restarting), or no stream takes the
#: subject, which the relay asks JetStream about before it counts the failure against the row
_NO_RESPONDERS: tuple[type[BaseException], ...] = (
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
)
#: JetStream did not take the message on this try, which may be no fault of the row: judged alike
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    TimeoutError,
    nats.js.errors.ServiceUnavailableError,
    *_NO_RESPONDERS,
)
#: JetStream's error code for a message its stream would not store (full, with discard "new")
_STREAM_STORE_FAILED = 10077
#: subjects asked about per round at most, when nothing of the round went through
_STREAM_LOOKUPS = 8
#: rows a round sends between two turns it gives the event loop: a publish with a PubAck slot free
#: does not suspend, so a round of a full batch would otherwise hold the loop (the service's other
#: work, nats.py's flusher) for the whole batch
_SENT_BETWEEN_TURNS = 64
#: what nats.py refuses before sending: the same row is refused the same way every time
_UNSENDABLE: tuple[type[BaseException], ...] = (
    nats.errors.MaxPayloadError,
    nats.errors.BadHeaderError,
    nats.errors.BadSubjectError,
)


class OutboxRelay:
    """Several relays (replicas) may run: `FOR UPDATE SKIP LOCKED` gives each row to one of them.

    A batch of rows is published back to back on one connection, all PubAcks in flight at once, and
    awaited together; then the rows whose PubAck came back are deleted with one statement, in the
    transaction that locked them. A row whose publish failed stays and is published again on the next
    round: what was acked is never published twice by the relay. A crash after publishing but before
    deleting republishes the batch with the same `Nats-Msg-Id`s, which JetStream drops inside the
    stream's duplicate window: exactly once.

    A failure counts against a row (`attempts`) only when it is the row's fault: NATS refused the
    row, or other rows of the round went through, or JetStream says no stream takes its subject. A
    timeout, "no responders" or a 503 alone say JetStream is away (a NATS node restarting), not that
    the row is bad. A stream that refuses to store a message (full, discarding new ones) counts
    against no row either, even when others of the round went through: the rows wait for room.
    After `max_attempts` such failures, or at once when the row can never fit in a message, the row
    moves to the dead-letter table with the reason. A NATS or JetStream outage counts against no
    row, however long it lasts.

    Woken by a commit after the outbox drained, the relay lingers `linger_s` before its next round,
    so the commits of that moment go out as one batch (one lock, one delete and one commit for all)
    rather than a round each; a round that filled its batch goes on at once."""

    def __init__(
        self,
        js: JetStreamContext,
        sessions: async_sessionmaker[AsyncSession],
        outbox: Table,
        metrics: Metrics,
        stop: asyncio.Event,
        *,
        batch: int = 512,
        poll_s: float = 0.5,
        ack_timeout_s: float = 5.0,
        max_attempts: int = 5,
        max_payload: Callable[[], int] = lambda: DEFAULT_MAX_PAYLOAD,
        sample_every_s: float = 5.0,
        linger_s: float = 0.002,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        if linger_s < 0:
            raise ValueError(f"linger_s must not be negative, got {linger_s}")
        self.js = js
        self.sessions = sessions
        self.outbox = outbox
        self.dead_letters = outbox_dead_letters_of(outbox)
        self.metrics = metrics
        self.stop = stop
        self.batch = batch
        self.poll_s = poll_s
        self.ack_timeout_s = ack_timeout_s
        self.max_attempts = max_attempts
        self.max_payload = max_payload
        self.sample_every_s = sample_every_s
        self.linger_s = linger_s
        self._wake = asyncio.Event()
        self._failures = RateLimitedLog(log)
        self._sampled_at = float("-inf")

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while not self.stop.is_set():
            self._wake.clear()  # a commit from now on wakes the next round
            try:
                published, failed = await self.publish_batch_outcomes()
            except Exception as exc:
                self._failures.error(
                    f"round:{type(exc).__name__}", "outbox relay round failed; retrying", exc_info=True
                )
                published, failed = 0, 1
            await self._sample_if_due()
            if failed:  # NATS (or the database) is away: do not spin on the rows that stayed
                await asyncio.sleep(self.poll_s)
            elif published < self.batch:  # drained: wait for a commit, or poll
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=self.poll_s)
                    if self.linger_s and not self.stop.is_set():
                        await asyncio.sleep(self.linger_s)  # the commits of this moment join

    async def publish_batch(self) -> int:
        """One round; the number of rows published and deleted."""
        return (await self.publish_batch_outcomes())[0]

    async def publish_batch_outcomes(self) -> tuple[int, int]:
        """One round: (rows published and deleted, rows whose publish failed and stay). Rows moved
        to the dead-letter table are in neither."""
        t = self.outbox
        async with self.sessions() as session, session.begin():
            rows = (
                await session.execute(
                    select(
                        t.c.seq,
                        t.c.event_id,
                        t.c.subject,
                        t.c.headers,
                        t.c.body,
                        t.c.created_at,
                        t.c.attempts,
                    )
                    .order_by(t.c.seq)
                    .limit(self.batch)
                    .with_for_update(skip_locked=True)
                )
            ).all()
            if not rows:
                return 0, 0
            outcomes = await self._publish_all(rows)
            faults.hit("relay.after_publish")
            acked = [
                row.seq for row, outcome in zip(rows, outcomes, strict=True) if isinstance(outcome, PubAck)
            ]
            if acked:
                # one statement text whatever the count: one prepared statement, not one per count
                await session.execute(
                    delete(t).where(t.c.seq == any_(bindparam("seqs", type_=ARRAY(BigInteger)))),
                    {"seqs": acked},
                )
            stayed = await self._judge_failures(session, rows, outcomes, any_acked=bool(acked))
        self.metrics.outbox_published.inc(
            sum(1 for outcome in outcomes if isinstance(outcome, PubAck) and not outcome.duplicate)
        )
        return len(acked), stayed

    async def _judge_failures(
        self,
        session: AsyncSession,
        rows: Sequence[Any],
        outcomes: Sequence[PubAck | BaseException],
        any_acked: bool,
    ) -> int:
        """Count each failure against its row when it is the row's fault; move the rows that used
        their tries up (or can never fit) to the dead-letter table. The number of rows that stay."""
        counted: list[dict[str, Any]] = []
        doomed: list[tuple[Any, str, str]] = []
        stayed = 0
        streamless = set() if any_acked else await self._streamless(rows, outcomes)
        for row, outcome in zip(rows, outcomes, strict=True):
            if isinstance(outcome, PubAck):
                continue
            reason = describe(outcome)
            kind = _failure_kind(outcome, any_acked or row.subject in streamless)
            self.metrics.outbox_publish_failures.labels(kind).inc()
            if kind == "unpublishable":
                too_large = isinstance(outcome, MessageTooLarge | nats.errors.MaxPayloadError)
                doomed.append(
                    (row, f"can never be published: {reason}", "too_large" if too_large else "refused")
                )
            elif kind == "row" and row.attempts + 1 >= self.max_attempts:
                doomed.append((row, f"failed {row.attempts + 1} times, last error: {reason}", "exhausted"))
            else:
                stayed += 1
                if kind == "row":
                    counted.append({"row_seq": row.seq, "error": reason})
            self._failures.warning(
                f"publish:{kind}:{type(outcome).__name__}",
                "outbox publish failed",
                extra={"kind": kind, "event_id": row.event_id, "subject": row.subject, "error": reason},
            )
        t = self.outbox
        if counted:
            await session.execute(
                update(t)
                .where(t.c.seq == bindparam("row_seq"))
                .values(attempts=t.c.attempts + 1, last_error=bindparam("error")),
                counted,
            )
        if doomed:
            await self._move_to_dead_letters(session, doomed)
        return stayed

    async def _streamless(self, rows: Sequence[Any], outcomes: Sequence[PubAck | BaseException]) -> set[str]:
        """The subjects of the round's "no responders" rows that JetStream says no stream takes (a few
        per round): those rows are at fault. While JetStream does not answer, none are."""
        asked = dict.fromkeys(
            row.subject
            for row, outcome in zip(rows, outcomes, strict=True)
            if isinstance(outcome, _NO_RESPONDERS)
        )
        streamless: set[str] = set()
        for subject in list(asked)[:_STREAM_LOOKUPS]:
            try:
                await asyncio.wait_for(self.js.find_stream_name_by_subject(subject), self.ack_timeout_s)
            except nats.js.errors.NotFoundError:
                streamless.add(subject)
            except Exception:  # JetStream away too: the round's problem, not the rows'
                break
        return streamless

    async def _move_to_dead_letters(
        self, session: AsyncSession, doomed: Sequence[tuple[Any, str, str]]
    ) -> None:
        await session.execute(
            insert(self.dead_letters),
            [
                {
                    "seq": row.seq,
                    "event_id": row.event_id,
                    "subject": row.subject,
                    "headers": row.headers,
                    "body": row.body,
                    "created_at": row.created_at,
                    "attempts": row.attempts + 1,
                    "reason": reason,
                }
                for row, reason, _ in doomed
            ],
        )
        t = self.outbox
        await session.execute(
            delete(t).where(t.c.seq == any_(bindparam("seqs", type_=ARRAY(BigInteger)))),
            {"seqs": [row.seq for row, _, _ in doomed]},
        )
        for row, reason, kind in doomed:
            self.metrics.outbox_dead_lettered.labels(kind).inc()
            log.error(
                "outbox row moved to the dead-letter table; it will not be published",
                extra={"event_id": row.event_id, "subject": row.subject, "seq": row.seq, "reason": reason},
            )

    async def sample(self) -> None:
        """Set the backlog, oldest-row age and dead-letter gauges from the tables (one round trip)."""
        t, dl = self.outbox, self.dead_letters
        query = select(
            select(func.count()).select_from(t).scalar_subquery(),
            select(func.extract("epoch", func.now() - func.min(t.c.created_at))).scalar_subquery(),
            select(func.count()).select_from(dl).scalar_subquery(),
        )
        async with self.sessions() as session:
            backlog, oldest_age, dead = (await session.execute(query)).one()
        self.metrics.outbox_backlog.set(backlog)
        self.metrics.outbox_oldest_age.set(float(oldest_age or 0.0))
        self.metrics.outbox_dead_letter_rows.set(dead)

    async def _sample_if_due(self) -> None:
        now = time.monotonic()
        if now - self._sampled_at < self.sample_every_s:
            return
        self._sampled_at = now
        try:
            await self.sample()
        except Exception as exc:  # the database may be away; the gauges keep their last values
            self._failures.warning(
                f"sample:{type(exc).__name__}", "outbox sample failed", extra={"error": repr(exc)}
            )

    async def _publish_all(self, rows: Sequence[Any]) -> list[PubAck | BaseException]:
        """Publish the rows in order on the one connection, then await all the PubAcks together, up
        to `ack_timeout_s`; each row's own outcome, so one failure costs one row. A row too large for
        the server is never sent: sending it would make the server close the connection.

        Sending stops at the first sign that the connection is away (it is not connected, or a
        publish fails on the connection), and when sending has taken `ack_timeout_s`: the rows not
        sent stay for a later round, counted against none. The connection is looked at before each row,
        but nats.py's reader notices a closed socket only when the loop turns (every
        `_SENT_BETWEEN_TURNS` rows), so up to that many rows may go into its reconnect buffer; sent
        on reconnection, they are deduplicated by `Nats-Msg-Id` and the consumers' inbox if a later
        round publishes them again. A round lasts at most about twice `ack_timeout_s`
        on NATS's side, so it never holds its rows' locks for ever."""
        outcomes: list[PubAck | BaseException] = [_NOT_SENT] * len(rows)
        sent: list[tuple[int, asyncio.Future[PubAck]]] = []
        held: set[asyncio.Future[PubAck]] = set()
        limit = self.max_payload()
        sending = 0
        try:
            try:
                async with asyncio.timeout(self.ack_timeout_s):
                    for sending, row in enumerate(rows):
                        if sending and sending % _SENT_BETWEEN_TURNS == 0:
                            await asyncio.sleep(0)
                        if not connected(self.js):
                            outcomes[sending] = _DISCONNECTED
                            break
                        try:
                            headers = dict(row.headers)
                            check_fits(row.subject, headers, row.body, limit)
                            future = await self._send(row.subject, row.body, headers, held)
                            sent.append((sending, future))
                            held.add(future)
                        except _CONNECTION_ERRORS as exc:  # the rest would fail (or queue up) alike
                            outcomes[sending] = exc
                            break
                        except Exception as exc:  # this row's own failure (too large, a bad header)
                            outcomes[sending] = exc
            except TimeoutError:
                outcomes[sending] = _SENDING_TIMED_OUT
            if sent:
                _, late = await asyncio.wait([future for _, future in sent], timeout=self.ack_timeout_s)
                for future in late:
                    future.cancel()
        except BaseException:  # cancelled (the relay stops): forget what is in flight; the rows stay
            for _, future in sent:
                future.cancel()
            raise
        for i, future in sent:
            if future.cancelled():
                outcomes[i] = TimeoutError(f"no PubAck within {self.ack_timeout_s} s")
            else:
                outcomes[i] = future.exception() or future.result()
        return outcomes

    async def _send(
        self,
        subject: str,
        body: bytes,
        headers: dict[str, str],
        held: set[asyncio.Future[PubAck]],
    ) -> asyncio.Future[PubAck]:
        """Put one message on the wire; the future of its PubAck. `held`: the round's futures so far."""
        if getattr(self.js, "publish_async", None) is not None:
            return await publish_async(
                self.js, subject, body, headers, wait_stall=self.ack_timeout_s, held=held
            )
        # An older nats-py: a task per request. Tasks start in creation order, so order is kept.
        return asyncio.ensure_future(self.js.publish(subject, body, headers=headers))


def _failure_kind(outcome: BaseException, any_acked: bool) -> str:
    """'unpublishable' (never will be), 'row' (this row's fault: it counts), 'connection' (NATS away),
    'stream_full' (the stream would not store it: never counted, the row waits for room)."""
    if isinstance(outcome, _UNSENDABLE) or is_permanent(outcome):
        return "unpublishable"
    if isinstance(outcome, nats.js.errors.APIError) and outcome.err_code == _STREAM_STORE_FAILED:
        return "stream_full"  # the stream's limits, whoever else went through: the row waits for room
    if isinstance(outcome, _UNAVAILABLE):  # slow or away: the row's fault only if others went through
        return "row" if any_acked else "connection"
    if isinstance(outcome, _CONNECTION_ERRORS):  # _NotSent among them
        return "connection"
    return "row"


class _NotSent(ConnectionError):
    """The round stopped sending before this row: not the row's fault, it is sent on a later round."""


_NOT_SENT = _NotSent("not sent: the round stopped sending before this row")
_DISCONNECTED = _NotSent("not sent: NATS is not connected")
_SENDING_TIMED_OUT = _NotSent("not sent: the round ran out of time sending")
