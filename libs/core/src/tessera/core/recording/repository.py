"""Where observed events are kept: one `observed_events` table in each recording service's schema."""

from __future__ import annotations

from typing import Protocol

from sqlalchemy import BigInteger, Column, DateTime, Identity, MetaData, String, Table, func, insert
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession

from tessera.core.recording.model import ObservedEvent

#: the column retention reads: when this service stored the event (its own clock, not the sender's)
RECEIVED_AT = "received_at"


def observed_events_table(metadata: MetaData) -> Table:
    return Table(
        "observed_events",
        metadata,
        Column("seq", BigInteger, Identity(always=True), primary_key=True),
        Column("event_id", String(64), nullable=False),
        Column("type", String(255), nullable=False, index=True),
        Column("subject", String(255), nullable=False),
        Column("source", String(255), nullable=False),
        Column("occurred_at", DateTime(timezone=True), nullable=False),
        Column(RECEIVED_AT, DateTime(timezone=True), nullable=False, server_default=func.now(), index=True),
        Column("data", JSONB, nullable=False),
    )


class ObservedEventRepository(Protocol):
    async def add(self, event: ObservedEvent) -> None: ...


class SqlObservedEventRepository:
    def __init__(self, session: AsyncSession, table: Table) -> None:
        self.session = session
        self.table = table

    async def add(self, event: ObservedEvent) -> None:
        await self.session.execute(
            insert(self.table).values(
                event_id=event.event_id,
                type=event.type,
                subject=event.subject,
                source=event.source,
                occurred_at=event.occurred_at,
                data=event.data,
            )
        )
