"""The outbox relay: publish committed events in order, and delete each row only after its PubAck."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nats.js import JetStreamContext
from sqlalchemy import Table, delete, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tessera.core import faults
from tessera.core.observability.metrics import Metrics

log = logging.getLogger(__name__)


class OutboxRelay:
    """Several relays (replicas) may run: `FOR UPDATE SKIP LOCKED` gives each row to one of them.
    A crash after publishing but before deleting republishes the row with the same `Nats-Msg-Id`,
    which JetStream drops inside the stream's duplicate window: exactly once."""

    def __init__(
        self,
        js: JetStreamContext,
        sessions: async_sessionmaker[AsyncSession],
        outbox: Table,
        metrics: Metrics,
        stop: asyncio.Event,
        *,
        batch: int = 256,
        poll_s: float = 0.5,
    ) -> None:
        self.js = js
        self.sessions = sessions
        self.outbox = outbox
        self.metrics = metrics
        self.stop = stop
        self.batch = batch
        self.poll_s = poll_s
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while not self.stop.is_set():
            try:
                published = await self.publish_batch()
            except Exception:
                log.exception("outbox relay failed; retrying")
                published = 0
                await asyncio.sleep(self.poll_s)
            if published == 0:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=self.poll_s)

    async def publish_batch(self) -> int:
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
                return 0
            # One connection keeps publish order; the acks are awaited together.
            acks = await asyncio.gather(
                *(self.js.publish(row.subject, row.body, headers=dict(row.headers)) for row in rows)
            )
            faults.hit("relay.after_publish")
            await session.execute(delete(t).where(t.c.seq.in_([row.seq for row in rows])))
        self.metrics.outbox_published.inc(sum(1 for ack in acks if not ack.duplicate))
        return len(rows)
