"""Tables of the slicing schema."""

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
    String,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from tessera.core.db.messaging_tables import add_messaging_tables
from tessera.core.recording.repository import observed_events_table

metadata = MetaData(schema="slicing")
outbox, inbox = add_messaging_tables(metadata)
observed_events = observed_events_table(metadata)

#: one node's reconfiguration, a state machine (see `domain.operation.Operation`); updated at each step
operations = Table(
    "operations",
    metadata,
    Column("operation_id", String(64), primary_key=True),
    Column("node", String(255), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("config", String(64), nullable=False),
    Column("body", Text, nullable=False),
    Column("gpus", JSONB, nullable=False),
    Column("expected_resources", JSONB, nullable=False),
    Column("previous_config", String(64), nullable=True),
    Column("drain", Boolean, nullable=False),
    Column("change_reason", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("written", Boolean, nullable=False),
    Column("retry_at", DateTime(timezone=True), nullable=True),
    Column("deadline", DateTime(timezone=True), nullable=True),
    Column("cordoned_by_us", Boolean, nullable=False),
    Column("reason", Text, nullable=True),
    # the attempt's reboot credit (`Operation.rebooting`): the apply deadline moved on while rebooting
    Column("rebooting_since", DateTime(timezone=True), nullable=True),
    Column("reboot_credit_s", Float, nullable=False, server_default=text("0")),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)
OPEN_OPERATION = text("state IN ('planned', 'cordoned', 'draining', 'applying', 'verifying')")
# At most one open operation per node, whichever replica planned it.
Index("uq_slicing_operations_open_node", operations.c.node, unique=True, postgresql_where=OPEN_OPERATION)
Index("ix_slicing_operations_updated_at", operations.c.updated_at)

#: every step an operation took, in order: its history for operators and tests
operation_steps = Table(
    "operation_steps",
    metadata,
    Column("seq", BigInteger, Identity(always=True), primary_key=True),
    Column(
        "operation_id",
        String(64),
        ForeignKey("operations.operation_id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("state", String(16), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("reason", Text, nullable=True),
    Column("at", DateTime(timezone=True), nullable=False),
)
Index("ix_slicing_operation_steps_operation", operation_steps.c.operation_id, operation_steps.c.seq)

#: which replica may act on a node, until when (database time, so replicas' clocks do not matter)
node_leases = Table(
    "node_leases",
    metadata,
    Column("node", String(255), primary_key=True),
    Column("holder", String(128), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("acquired_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

#: each pod's measured GPU use per minute (telemetry's `pod_gpu_usage`, summed within the minute), kept
#: for the planner's lookback window so a restart keeps the history (see `domain.usage_history`)
pod_usage = Table(
    "pod_usage",
    metadata,
    Column("pod", String(320), primary_key=True),
    Column("minute", DateTime(timezone=True), primary_key=True),
    Column("node", String(255), nullable=False),
    Column("gpu_uuid", String(128), nullable=False),
    Column("total_pct", Float, nullable=False),
    Column("samples", Integer, nullable=False),
    Column("allocated_milli", Integer, nullable=False),
    Column("split", String(16), nullable=False),
)
Index("ix_slicing_pod_usage_minute", pod_usage.c.minute)
