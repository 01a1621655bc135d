"""Tables of the admission schema."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    Sequence,
    String,
    Table,
    Text,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB

from tessera.core.db.messaging_tables import add_messaging_tables

metadata = MetaData(schema="admission")
outbox, inbox = add_messaging_tables(metadata)

change_seq = Sequence("change_seq", metadata=metadata)
"""Bumped (outside transactions) by anything that may change what a cycle decides."""

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
    # the queueing view of the job: its cluster queue, per-group requests, and what it holds
    Column("cluster_queue", String(63), nullable=True),
    Column("workload", JSONB, nullable=True),
    Column("flavors", JSONB, nullable=True),
    Column("admitted_at", DateTime(timezone=True), nullable=True),
    Column("wait_reason", String(32), nullable=True),
    Column("wait_message", Text, nullable=True),
    Column("preempted_by", String(64), nullable=True),
    Column("preemption_deadline", DateTime(timezone=True), nullable=True),
)
Index("ix_jobs_state_submitted", jobs.c.state, jobs.c.submitted_at)
Index("ix_jobs_tenant", jobs.c.tenant, jobs.c.submitted_at)
Index("ix_jobs_cluster_queue_state", jobs.c.cluster_queue, jobs.c.state)

job_transitions = Table(
    "job_transitions",
    metadata,
    Column("seq", BigInteger, Identity(always=True), primary_key=True),
    Column("job_id", String(64), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False, index=True),
    Column("state", String(16), nullable=False),
    Column("reason", Text, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
)

job_checkpoints = Table(
    "job_checkpoints",
    metadata,
    # the checkpoint service's id (`tessera.contracts.events.checkpoint_id`: from the job and the uri)
    Column("id", String(64), primary_key=True),
    Column("job_id", String(64), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("step", BigInteger, nullable=False),
    Column("size_bytes", BigInteger, nullable=False, server_default="0"),
    Column("uri", Text, nullable=False),
    Column("request_id", String(64), nullable=True),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("recorded_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
Index(
    "ix_job_checkpoints_job_at",
    job_checkpoints.c.job_id,
    job_checkpoints.c.at.desc(),
    job_checkpoints.c.step.desc(),
)

# ---- queueing configuration ----------------------------------------------------------------------

flavors = Table(
    "flavors",
    metadata,
    Column("name", String(63), primary_key=True),
    Column("gpu_model", String(63), nullable=True),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("capacity_type", String(16), nullable=False, server_default="on-demand"),
    Column("node_labels", JSONB, nullable=False, server_default="{}"),
    Column("tolerations", JSONB, nullable=False, server_default="[]"),
)

cohorts = Table(
    "cohorts",
    metadata,
    Column("name", String(63), primary_key=True),
    Column("parent", String(63), nullable=True),
    Column("quotas", JSONB, nullable=False, server_default="[]"),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

queues = Table(
    "queues",
    metadata,
    Column("name", String(63), primary_key=True),
    Column("cohort", String(63), nullable=True),
    Column("quotas", JSONB, nullable=False, server_default="[]"),
    Column("strategy", String(32), nullable=False),
    Column("preemption", JSONB, nullable=False, server_default="{}"),
    Column("fair_share_weight", Float, nullable=False, server_default="1"),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

tenant_queues = Table(
    "tenant_queues",
    metadata,
    Column("tenant", String(63), primary_key=True),
    Column("queue", String(63), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

priority_classes = Table(
    "priority_classes",
    metadata,
    Column("name", String(63), primary_key=True),
    Column("value", Integer, nullable=False),
    Column("description", Text, nullable=False, server_default=""),
)

policy = Table(
    "policy",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("fair_sharing", JSONB, nullable=False, server_default="{}"),
    Column("timing", JSONB, nullable=False, server_default="{}"),
)

tokens = Table(
    "tokens",
    metadata,
    Column("sha256", String(64), primary_key=True),
    Column("tenant", String(63), nullable=True),
    Column("admin", Boolean, nullable=False, server_default="false"),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # what lists and revokes name a token by: the first 16 hex digits of its hash (not a secret)
    Column("id", String(16), nullable=False, unique=True),
    Column("expires_at", DateTime(timezone=True), nullable=True),
    Column("revoked_at", DateTime(timezone=True), nullable=True),
)

idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    # a key is the tenant's own: another tenant's same key names another job
    Column("tenant", String(63), primary_key=True),
    Column("key", String(64), primary_key=True),
    Column("body_sha256", String(64), nullable=False),
    Column("job_id", String(64), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# ---- state the cycle keeps between runs ----------------------------------------------------------

inflight_preemptions = Table(
    "inflight_preemptions",
    metadata,
    Column("preemptor", String(64), primary_key=True),
    Column("victims", JSONB, nullable=False),
    Column("requested_at", DateTime(timezone=True), nullable=False),
    Column("deadline", DateTime(timezone=True), nullable=False),
    Column("flavors", JSONB, nullable=False),
    Column("usage", JSONB, nullable=False),
)

draining_victims = Table(
    "draining_victims",
    metadata,
    Column("victim", String(64), primary_key=True),
    Column("preemptor", String(64), nullable=False),
    Column("reason", String(64), nullable=False),
    Column("deadline", DateTime(timezone=True), nullable=False),
)

fair_share_history = Table(
    "fair_share_history",
    metadata,
    Column("queue", String(63), primary_key=True),
    Column("history", JSONB, nullable=False),
    Column("sampled_at", DateTime(timezone=True), nullable=False),
)

# ---- the cluster as telemetry and the scheduler report it ----------------------------------------

inventory_nodes = Table(
    "inventory_nodes",
    metadata,
    Column("name", String(253), primary_key=True),
    Column("source", String(253), nullable=False),
    Column("gpus", JSONB, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("labels", JSONB, nullable=False, server_default="{}"),
)

placements = Table(
    "placements",
    metadata,
    Column("job_id", String(64), primary_key=True),
    Column("pods", JSONB, nullable=False),
    Column("placed_at", DateTime(timezone=True), nullable=False),
)

# ---- the Kubernetes objects that run each job ----------------------------------------------------

workloads = Table(
    "workloads",
    metadata,
    Column("job_id", String(64), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("namespace", String(63), nullable=False),
    # who made the objects: "tessera" (admission, from a submitted job) or "user" (kubectl apply)
    Column("owner", String(16), nullable=False, server_default="tessera"),
    # [{"kind": "Job", "name": ...}, ...]: the objects that run the job
    Column("objects", JSONB, nullable=False, server_default="[]"),
    # what admission last made sure of on the cluster: suspended, running (unsuspended), deleted
    Column("applied", String(16), nullable=False),
    Column("note", Text, nullable=False, server_default=""),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    # the job's updated_at whose conditions admission last wrote onto its Jobs
    Column("reported_at", DateTime(timezone=True), nullable=True),
)
