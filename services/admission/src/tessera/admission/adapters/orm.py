"""Tables of the admission schema."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)
from sqlalchemy.dialects.postgresql import JSONB

from tessera.core.db.messaging_tables import add_messaging_tables

metadata = MetaData(schema="admission")
outbox, inbox = add_messaging_tables(metadata)

jobs = Table(
    "jobs",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("name", String(63), nullable=False),
    Column("tenant", String(63), nullable=False),
    Column("queue", String(63), nullable=False),
    Column("priority", Integer, nullable=False),
    Column("state", String(16), nullable=False),
    Column("spec", JSONB, nullable=True),
    Column("errors", JSONB, nullable=False, server_default="[]"),
    Column("trace_headers", JSONB, nullable=False, server_default="{}"),
    Column("submitted_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)
Index("ix_jobs_state_submitted", jobs.c.state, jobs.c.submitted_at)
Index("ix_jobs_tenant", jobs.c.tenant, jobs.c.submitted_at)

job_transitions = Table(
    "job_transitions",
    metadata,
    Column("seq", BigInteger, Identity(always=True), primary_key=True),
    Column("job_id", String(64), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False, index=True),
    Column("state", String(16), nullable=False),
    Column("reason", Text, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
)
