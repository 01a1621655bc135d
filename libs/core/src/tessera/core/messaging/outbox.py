"""The outbox relay: publish committed events in order, and delete each row only after its PubAck."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from nats.js import JetStreamContext
from nats.js.api import PubAck
from sqlalchemy import BigInteger, Table, any_, bindparam, delete, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tessera.core import faults
from tessera.core.observability.metrics import Metrics

log = logging.getLogger(__name__)


class OutboxRelay:
    """Several relays (replicas) may run: `FOR UPDATE SKIP LOCKED` gives each row to one of them.

    A batch of rows is published back to back on one connection, all PubAcks in flight at once, and
    awaited together; then the rows whose PubAck came back are deleted with one statement, in the
    transaction that locked them. A row whose publish failed stays and is published again on the next
    round, alone: what was acked is never published twice by the relay. A crash after publishing but
    before deleting republishes the batch with the same `Nats-Msg-Id`s, which JetStream drops inside
    the stream's duplicate window: exactly once."""

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
    ) -> None:
        self.js = js
        self.sessions = sessions
        self.outbox = outbox
        self.metrics = metrics
        self.stop = stop
        self.batch = batch
        self.poll_s = poll_s
        self.ack_timeout_s = ack_timeout_s
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while not self.stop.is_set():
            self._wake.clear()  # a commit from now on wakes the next round
            try:
                published, failed = await self.publish_batch_outcomes()
            except Exception:
                log.exception("outbox relay failed; retrying")
                published, failed = 0, 1
            if failed:  # NATS (or the database) is away: do not spin on the rows that stayed
                await asyncio.sleep(self.poll_s)
            elif published < self.batch:  # drained: wait for a commit, or poll
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=self.poll_s)

    async def publish_batch(self) -> int:
        """One round; the number of rows published and deleted."""
        return (await self.publish_batch_outcomes())[0]

    async def publish_batch_outcomes(self) -> tuple[int, int]:
        """One round: (rows published and deleted, rows whose publish failed and stay)."""
        t = self.outbox
        async with self.sessions() as session, session.begin():
            rows = (
                await session.execute(
                    select(t.c.seq, t.c.subject, t.c.headers, t.c.body)
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
        failures = [outcome for outcome in outcomes if not isinstance(outcome, PubAck)]
        if failures:
            log.warning(
                "outbox publish failed; the rows stay and are published again",
                extra={"failed": len(failures), "published": len(acked), "error": repr(failures[0])},
            )
        self.metrics.outbox_published.inc(
            sum(1 for outcome in outcomes if isinstance(outcome, PubAck) and not outcome.duplicate)
        )
        return len(acked), len(failures)

    async def _publish_all(self, rows: Sequence[Any]) -> list[PubAck | BaseException]:
        """Publish every row in order on the one connection, then await all the PubAcks together,
        up to `ack_timeout_s`; each row's own outcome, so one failure costs one row."""
        outcomes: list[PubAck | BaseException] = [_NOT_SENT] * len(rows)
        sent: list[tuple[int, asyncio.Future[PubAck]]] = []
        for i, row in enumerate(rows):
            try:
                sent.append((i, await self._send(row.subject, row.body, dict(row.headers))))
            except Exception as exc:  # not even sent (the connection is closed): this row stays
                outcomes[i] = exc
        if sent:
            _, late = await asyncio.wait([future for _, future in sent], timeout=self.ack_timeout_s)
            for future in late:
                future.cancel()
        for i, future in sent:
            if future.cancelled():
                outcomes[i] = TimeoutError(f"no PubAck within {self.ack_timeout_s} s")
            else:
                outcomes[i] = future.exception() or future.result()
        return outcomes

    async def _send(self, subject: str, body: bytes, headers: dict[str, str]) -> asyncio.Future[PubAck]:
        """Put one message on the wire; the future of its PubAck."""
        publish_async = getattr(self.js, "publish_async", None)
        if publish_async is not None:
            future: asyncio.Future[PubAck] = await publish_async(subject, body, headers=headers)
            return future
        # An older nats-py: a task per request. Tasks start in creation order, so order is kept.
        return asyncio.ensure_future(self.js.publish(subject, body, headers=headers))


_NOT_SENT = RuntimeError("not sent")
