"""Tables of the telemetry schema."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Identity,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

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

gpu_rollups = Table(
    "gpu_rollups",
    metadata,
    Column("gpu_uuid", String(64), nullable=False),
    Column("window_start", DateTime(timezone=True), nullable=False),
    Column("node", String(253), nullable=False),
    Column("gpu_index", Integer, nullable=False),
    Column("samples", Integer, nullable=False),
    Column("utilization_mean_pct", Float, nullable=False),
    Column("utilization_max_pct", Float, nullable=False),
    Column("memory_mean_mib", Float, nullable=False),
    Column("memory_max_mib", Integer, nullable=False),
    Column("power_mean_w", Float, nullable=False),
    Column("power_max_w", Float, nullable=False),
    Column("temperature_mean_c", Float, nullable=False),
    Column("temperature_max_c", Float, nullable=False),
    PrimaryKeyConstraint("gpu_uuid", "window_start", name="pk_gpu_rollups"),
    Index("ix_gpu_rollups_window_start", "window_start"),
)

#: open and past findings: a GPU unhealthy or idle since when, and when that ended
gpu_findings = Table(
    "gpu_findings",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("gpu_uuid", String(64), nullable=False),
    Column("kind", String(16), nullable=False),  # unhealthy | idle
    Column("node", String(253), nullable=False),
    Column("gpu_index", Integer, nullable=False),
    Column("since", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True), nullable=True),
    Column("detail", JSONB, nullable=False),
    Index(
        "ux_gpu_findings_open",
        "gpu_uuid",
        "kind",
        unique=True,
        postgresql_where=text("ended_at IS NULL"),
    ),
)
