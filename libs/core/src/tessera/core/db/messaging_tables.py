"""The outbox, its dead-letter table and the inbox each service keeps in its own schema."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
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
        # publishes that failed through the row's own fault (not NATS being away), and the last error
        Column("attempts", Integer, nullable=False, server_default="0"),
        Column("last_error", Text, nullable=True),
    )
    Index("ix_outbox_unpublished", table.c.seq, postgresql_where=table.c.published_at.is_(None))
    return table


OUTBOX_DEAD_LETTERS = "outbox_dead_letters"


def outbox_dead_letter_table(metadata: MetaData) -> Table:
    """Outbox rows that can never be published (too large, refused by every try), kept with the
    reason for an operator to inspect or replay; the relay moves them here so rows behind go on."""
    return Table(
        OUTBOX_DEAD_LETTERS,
        metadata,
        Column("seq", BigInteger, primary_key=True, autoincrement=False),
        Column("event_id", String(64), nullable=False),
        Column("subject", String(255), nullable=False),
        Column("headers", JSONB, nullable=False),
        Column("body", LargeBinary, nullable=False),
        Column("created_at", DateTime(timezone=True), nullable=False),
        Column("attempts", Integer, nullable=False),
        Column("reason", Text, nullable=False),
        Column("dead_lettered_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    )


def outbox_dead_letters_of(outbox: Table) -> Table:
    """The dead-letter table beside `outbox`, in the same metadata (`add_messaging_tables` adds it)."""
    key = f"{outbox.schema}.{OUTBOX_DEAD_LETTERS}" if outbox.schema else OUTBOX_DEAD_LETTERS
    table = outbox.metadata.tables.get(key)
    if table is None:
        raise LookupError(f"no {key} table beside {outbox.fullname}; define it with add_messaging_tables")
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
    """The outbox and the inbox; the outbox's dead-letter table is added beside them
    (`outbox_dead_letters_of(outbox)` finds it)."""
    outbox = outbox_table(metadata)
    outbox_dead_letter_table(metadata)
    return outbox, inbox_table(metadata)


def create_messaging_tables(schema: str) -> None:
    """In an Alembic migration: create the outbox, its dead-letter table and the inbox of `schema`."""
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
