"""Tables of the telemetry schema."""

from __future__ import annotations

from sqlalchemy import Boolean, Column, DateTime, Integer, MetaData, PrimaryKeyConstraint, String, Table, func

from tessera.core.db.messaging_tables import add_messaging_tables

metadata = MetaData(schema="telemetry")
outbox, inbox = add_messaging_tables(metadata)

gpus = Table(
    "gpus",
    metadata,
    Column("node", String(253), nullable=False),
    Column("gpu_index", Integer, nullable=False),
    Column("uuid", String(64), nullable=False, unique=True),
    Column("model", String(64), nullable=False),
    Column("memory_mib", Integer, nullable=False),
    Column("healthy", Boolean, nullable=False, server_default="true"),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("node", "gpu_index", name="pk_gpus"),
)

published_inventory = Table(
    "published_inventory",
    metadata,
    Column("source", String(255), primary_key=True),
    Column("digest", String(64), nullable=False),
    Column("published_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
