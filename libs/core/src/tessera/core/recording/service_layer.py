"""The unit of work of a recording service, and its one handler."""

from __future__ import annotations

from typing import ClassVar

from sqlalchemy import Table
from sqlalchemy.ext.asyncio import AsyncSession

from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.envelope import Envelope
from tessera.core.recording.model import ObservedEvent
from tessera.core.recording.repository import ObservedEventRepository, SqlObservedEventRepository


class RecordingUnitOfWork(UnitOfWork):
    """A service's subclass names its table: `observed_table = orm.observed_events`."""

    observed_table: ClassVar[Table]
    observed: ObservedEventRepository

    def open_repositories(self, session: AsyncSession) -> None:
        self.observed = SqlObservedEventRepository(session, self.observed_table)


async def record(envelope: Envelope, uow: RecordingUnitOfWork) -> None:
    """Keep the event as it arrived; the inbox, in the same transaction, keeps a redelivery out."""
    await uow.observed.add(
        ObservedEvent(
            event_id=envelope.id,
            type=envelope.type,
            subject=envelope.subject,
            source=envelope.source,
            occurred_at=envelope.time,
            data=envelope.data,
        )
    )
