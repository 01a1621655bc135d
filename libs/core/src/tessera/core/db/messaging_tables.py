"""The outbox and inbox tables each service keeps in its own schema."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Identity,
    Index,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB


def outbox_table(metadata: MetaData) -> Table:
    table = Table(
        "outbox",
        metadata,
        Column("seq", BigInteger, Identity(always=True), primary_key=True),
        Column("event_id", String(64), nullable=False, unique=True),
        Column("subject", String(255), nullable=False),
        Column("headers", JSONB, nullable=False),
        Column("body", LargeBinary, nullable=False),
        Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        Column("published_at", DateTime(timezone=True), nullable=True),
    )
    Index("ix_outbox_unpublished", table.c.seq, postgresql_where=table.c.published_at.is_(None))
    return table


def inbox_table(metadata: MetaData) -> Table:
    return Table(
        "inbox",
        metadata,
        Column("consumer", String(128), nullable=False),
        Column("message_id", String(128), nullable=False),
        Column("received_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        PrimaryKeyConstraint("consumer", "message_id", name="pk_inbox"),
    )


def add_messaging_tables(metadata: MetaData) -> tuple[Table, Table]:
    return outbox_table(metadata), inbox_table(metadata)


def create_messaging_tables(schema: str) -> None:
    """In an Alembic migration: create the outbox and inbox of `schema` (with their indexes)."""
    from alembic import op

    metadata = MetaData(schema=schema)
    add_messaging_tables(metadata)
    metadata.create_all(op.get_bind())


def drop_messaging_tables(schema: str) -> None:
    """In an Alembic downgrade: drop what `create_messaging_tables` created."""
    from alembic import op

    metadata = MetaData(schema=schema)
    add_messaging_tables(metadata)
    metadata.drop_all(op.get_bind())
