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
    # NULL: no reading of the window had a utilisation (telemetry_0007)
    Column("utilization_mean_pct", Float, nullable=True),
    Column("utilization_max_pct", Float, nullable=True),
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

# ---- usage and cost accounting (see domain/usage.py) --------------------------------------------

#: jobs as admission announced them: what their usage is billed to
jobs = Table(
    "jobs",
    metadata,
    Column("job_id", String(255), primary_key=True),
    Column("name", String(255), nullable=False, server_default=""),
    Column("tenant", String(63), nullable=False),
    Column("queue", String(63), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

#: the scheduler's placements: which job each pod (namespace and name; the namespace "" when the
#: placement did not name it) belongs to and the share of each GPU it was given
pod_placements = Table(
    "pod_placements",
    metadata,
    Column("namespace", String(253), nullable=False, server_default=""),
    Column("pod", String(253), nullable=False),
    Column("job_id", String(255), nullable=False),
    Column("node", String(253), nullable=False),
    Column("gpus", JSONB, nullable=False),  # [{"uuid": ..., "milli": ...}]
    Column("placed_at", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True), nullable=True),
    PrimaryKeyConstraint("namespace", "pod", name="pk_pod_placements"),
    Index("ix_pod_placements_job_id", "job_id"),
)

_USAGE_SUMS = (
    ("allocated_gpu_s", Float),
    ("used_gpu_s", Float),
    ("memory_mib_s", Float),
    ("idle_gpu_s", Float),
    ("cost", Float),
    ("samples", BigInteger),
)

#: one container's use of one GPU over one hour (replaced, never incremented: see domain/usage.py)
usage_hourly = Table(
    "usage_hourly",
    metadata,
    Column("window_start", DateTime(timezone=True), nullable=False),
    Column("node", String(253), nullable=False),
    Column("gpu_uuid", String(64), nullable=False),
    Column("namespace", String(253), nullable=False),
    Column("pod", String(253), nullable=False),
    Column("container", String(253), nullable=False),
    Column("job_id", String(255), nullable=False),
    Column("queue", String(63), nullable=False),
    Column("tenant", String(63), nullable=False),
    Column("flavor", String(63), nullable=False),
    Column("capacity_type", String(16), nullable=False),
    Column("split", String(16), nullable=False),
    *(Column(name, kind, nullable=False) for name, kind in _USAGE_SUMS),
    Column("first_at", DateTime(timezone=True), nullable=True),
    Column("last_at", DateTime(timezone=True), nullable=True),
    #: the idle run in progress at `last_at` and this row's idle seconds in it not yet counted
    Column("idle_run_since", DateTime(timezone=True), nullable=True),
    Column("idle_pending_s", Float, nullable=False, server_default="0"),
    PrimaryKeyConstraint(
        "window_start", "node", "gpu_uuid", "namespace", "pod", "container", name="pk_usage_hourly"
    ),
    Index("ix_usage_hourly_tenant_window", "tenant", "window_start"),
    Index("ix_usage_hourly_window_start", "window_start"),
)

#: the hourly rows summed per day, job and flavor (rebuilt from the hours, so idempotent)
usage_daily = Table(
    "usage_daily",
    metadata,
    Column("day", DateTime(timezone=True), nullable=False),
    Column("job_id", String(255), nullable=False),
    Column("queue", String(63), nullable=False),
    Column("tenant", String(63), nullable=False),
    Column("flavor", String(63), nullable=False),
    Column("capacity_type", String(16), nullable=False),
    *(Column(name, kind, nullable=False) for name, kind in _USAGE_SUMS),
    PrimaryKeyConstraint(
        "day", "job_id", "queue", "tenant", "flavor", "capacity_type", name="pk_usage_daily"
    ),
    Index("ix_usage_daily_tenant_day", "tenant", "day"),
)

#: rightsizing recommendations: one open per container, GPU and kind
rightsizing_findings = Table(
    "rightsizing_findings",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("gpu_uuid", String(64), nullable=False),
    Column("namespace", String(253), nullable=False),
    Column("pod", String(253), nullable=False),
    Column("container", String(253), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("job_id", String(255), nullable=False),
    Column("tenant", String(63), nullable=False),
    Column("since", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True), nullable=True),
    Column("detail", JSONB, nullable=False),
    Index(
        "ux_rightsizing_findings_open",
        "gpu_uuid",
        "namespace",
        "pod",
        "container",
        "kind",
        unique=True,
        postgresql_where=text("ended_at IS NULL"),
    ),
)
