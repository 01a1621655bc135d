"""Tables of the scheduler schema."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB

from tessera.core.db.messaging_tables import add_messaging_tables

metadata = MetaData(schema="scheduler")
outbox, inbox = add_messaging_tables(metadata)

inventory_nodes = Table(
    "inventory_nodes",
    metadata,
    Column("name", String(253), primary_key=True),
    Column("source", String(255), nullable=False),
    Column("data", JSONB, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

placements = Table(
    "placements",
    metadata,
    Column("job_id", String(64), nullable=False, index=True),
    Column("pod", String(253), nullable=False),
    Column("pod_group", String(63), nullable=False),
    Column("node", String(253), nullable=False, index=True),
    Column("gpus", JSONB, nullable=False),
    Column("cpu_milli", Integer, nullable=False),
    Column("memory_mib", Integer, nullable=False),
    Column("placed_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("job_id", "pod", name="pk_placements"),
)

pending_gangs = Table(
    "pending_gangs",
    metadata,
    Column("job_id", String(64), primary_key=True),
    Column("priority", Integer, nullable=False),
    Column("spec", JSONB, nullable=False),
    Column("submitted_at", DateTime(timezone=True), nullable=False),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("last_reason", Text, nullable=False, server_default=""),
    # "job" (admitted through admission; spec is its JobSpec) or "podgroup" (found on the cluster).
    Column("source", String(16), nullable=False, server_default="job"),
    # A RequeueReason value; empty until the first failed attempt.
    Column("reason_code", String(32), nullable=False, server_default=""),
    Column("backoff_until", DateTime(timezone=True), nullable=True),
    # The trace context the job arrived with, so every decision on it joins the job's trace.
    Column("trace", JSONB, nullable=False, server_default="{}"),
    # The checkpoint the job resumes from (job_admitted's resume_from): its pods get it in their env.
    Column("resume_from", Text, nullable=True),
)

# Preemption requests from admission, until the victim's pods are evicted (at once, or at the
# deadline when the victim can checkpoint first).
preemptions = Table(
    "preemptions",
    metadata,
    Column("job_id", String(64), primary_key=True),
    Column("preemptor_job_id", String(64), nullable=False),
    Column("reason", Text, nullable=False, server_default=""),
    Column("deadline", DateTime(timezone=True), nullable=False),
    Column("grace_period_s", Integer, nullable=False, server_default="0"),
    Column("checkpointable", Boolean, nullable=False, server_default="false"),
    Column("forced", Boolean, nullable=False, server_default="false"),
    Column("requested_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# The checkpoint service's word that a victim may go now (its checkpoint is saved, failed or timed
# out): a checkpointable victim is evicted on it rather than at its deadline. Keyed by the preemption
# it answers, so a late answer to an earlier preemption never releases a later one.
evictions_ready = Table(
    "evictions_ready",
    metadata,
    Column("job_id", String(64), primary_key=True),
    Column("preemptor_job_id", String(64), primary_key=True),
    Column("reason", Text, nullable=False, server_default=""),
    Column("checkpoint_uri", Text, nullable=True),
    Column("step", BigInteger, nullable=True),
    Column("received_at", DateTime(timezone=True), nullable=False, server_default=func.now(), index=True),
)

# One row: bumped by every cycle that decides something, so a replica whose in-memory state is
# older than the last decision (another replica took it) rebuilds before it decides.
decision_version = Table(
    "decision_version",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("version", BigInteger, nullable=False, server_default="0"),
)
