"""Record consumed events as they are, for services that will act on them later and for audits."""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, DateTime, Identity, MetaData, String, Table, func, insert
from sqlalchemy.dialects.postgresql import JSONB

from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.consumer import Handler
from tessera.core.messaging.envelope import Envelope


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
        Column("received_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        Column("data", JSONB, nullable=False),
    )


def recording_handler(table: Table) -> Handler[UnitOfWork]:
    async def record(envelope: Envelope, uow: UnitOfWork) -> None:
        await uow.session.execute(
            insert(table).values(
                event_id=envelope.id,
                type=envelope.type,
                subject=envelope.subject,
                source=envelope.source,
                occurred_at=envelope.time,
                data=envelope.data,
            )
        )

    return record
