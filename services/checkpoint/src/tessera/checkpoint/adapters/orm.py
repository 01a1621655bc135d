"""Tables of the checkpoint schema."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Index,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from tessera.core.db.messaging_tables import add_messaging_tables

metadata = MetaData(schema="checkpoint")
outbox, inbox = add_messaging_tables(metadata)

#: checkpoints training processes reported saved (durable, manifest published)
checkpoints = Table(
    "checkpoints",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("job_id", String(255), nullable=False),
    Column("step", BigInteger, nullable=False),
    Column("uri", Text, nullable=False),
    Column("size_bytes", BigInteger, nullable=False),
    Column("saved_at", DateTime(timezone=True), nullable=False),
    Column("request_id", String(64), nullable=True),
    Column("recorded_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
Index("ix_checkpoint_checkpoints_job_saved_at", checkpoints.c.job_id, checkpoints.c.saved_at)
Index("ix_checkpoint_checkpoints_saved_at", checkpoints.c.saved_at)

#: requests to save, each a state machine with a deadline (see `domain.model.CheckpointRequest`)
checkpoint_requests = Table(
    "checkpoint_requests",
    metadata,
    Column("request_id", String(64), primary_key=True),
    Column("job_id", String(255), nullable=False),
    Column("reason", String(64), nullable=False),
    Column("state", String(16), nullable=False),
    Column("deadline", DateTime(timezone=True), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("outcome", Text, nullable=True),
    Column("checkpoint_id", String(64), nullable=True),
    Column("checkpoint_uri", Text, nullable=True),
    Column("preemptor_job_id", String(255), nullable=True),
    Column("trace", JSONB, nullable=True),
)
OPEN_REQUEST = text("state IN ('requested', 'saving')")
# At most one open request per job, whichever replica or signal asks: the others find it.
Index(
    "uq_checkpoint_requests_open_job",
    checkpoint_requests.c.job_id,
    unique=True,
    postgresql_where=OPEN_REQUEST,
)
# The deadline loop reads the open requests by deadline.
Index("ix_checkpoint_requests_open_deadline", checkpoint_requests.c.deadline, postgresql_where=OPEN_REQUEST)
Index("ix_checkpoint_requests_updated_at", checkpoint_requests.c.updated_at)

#: the jobs this service heard of from admission and the scheduler
jobs = Table(
    "jobs",
    metadata,
    Column("job_id", String(255), primary_key=True),
    Column("checkpointable", Boolean, nullable=True),
    Column("admitted_at", DateTime(timezone=True), nullable=True),
    Column("placed_at", DateTime(timezone=True), nullable=True),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
Index("ix_checkpoint_jobs_finished_at", jobs.c.finished_at)

#: where each job's pods run, from `gang_placed`
job_pods = Table(
    "job_pods",
    metadata,
    Column("job_id", String(255), ForeignKey("jobs.job_id", ondelete="CASCADE"), nullable=False),
    Column("pod", String(255), nullable=False),
    Column("node", String(255), nullable=False),
    PrimaryKeyConstraint("job_id", "pod", name="pk_job_pods"),
)
Index("ix_checkpoint_job_pods_node", job_pods.c.node)

#: termination marks seen on nodes, each acted on once (see `domain.signals`)
node_signals = Table(
    "node_signals",
    metadata,
    Column("node", String(255), nullable=False),
    Column("key", String(320), nullable=False),
    Column("value", Text, nullable=False),
    Column("reason", String(64), nullable=False),
    Column("noticed_at", DateTime(timezone=True), nullable=False),
    Column("deadline", DateTime(timezone=True), nullable=False),
    PrimaryKeyConstraint("node", "key", name="pk_node_signals"),
)
