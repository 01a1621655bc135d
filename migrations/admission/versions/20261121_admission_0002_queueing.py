"""queueing: configuration, job queueing columns, preemption state, inventory, tokens

Revision ID: admission_0002
Revises: admission_0001
Create Date: 2026-11-21 06:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "admission_0002"
down_revision: str | None = "admission_0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "admission"
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.execute(sa.schema.CreateSequence(sa.Sequence("change_seq", schema=S)))
    for name, column in [
        ("cluster_queue", sa.String(63)),
        ("workload", postgresql.JSONB()),
        ("flavors", postgresql.JSONB()),
        ("admitted_at", TS),
        ("wait_reason", sa.String(32)),
        ("wait_message", sa.Text()),
        ("preempted_by", sa.String(64)),
        ("preemption_deadline", TS),
    ]:
        op.add_column("jobs", sa.Column(name, column, nullable=True), schema=S)
    op.create_index("ix_jobs_cluster_queue_state", "jobs", ["cluster_queue", "state"], schema=S)
    op.create_table(
        "flavors",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("gpu_model", sa.String(63), nullable=True),
        sa.Column("updated_at", TS, nullable=False, server_default=sa.text("now()")),
        schema=S,
    )
    op.create_table(
        "cohorts",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("parent", sa.String(63), nullable=True),
        sa.Column("quotas", postgresql.JSONB(), nullable=False, server_default="[]"),
        sa.Column("updated_at", TS, nullable=False, server_default=sa.text("now()")),
        schema=S,
    )
    op.create_table(
        "queues",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("cohort", sa.String(63), nullable=True),
        sa.Column("quotas", postgresql.JSONB(), nullable=False, server_default="[]"),
        sa.Column("strategy", sa.String(32), nullable=False),
        sa.Column("preemption", postgresql.JSONB(), nullable=False, server_default="{}"),
        sa.Column("fair_share_weight", sa.Float(), nullable=False, server_default="1"),
        sa.Column("updated_at", TS, nullable=False, server_default=sa.text("now()")),
        schema=S,
    )
    op.create_table(
        "tenant_queues",
        sa.Column("tenant", sa.String(63), primary_key=True),
        sa.Column("queue", sa.String(63), nullable=False),
        sa.Column("updated_at", TS, nullable=False, server_default=sa.text("now()")),
        schema=S,
    )
    op.create_table(
        "priority_classes",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("value", sa.Integer(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False, server_default=""),
        schema=S,
    )
    op.create_table(
        "policy",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("fair_sharing", postgresql.JSONB(), nullable=False, server_default="{}"),
        sa.Column("timing", postgresql.JSONB(), nullable=False, server_default="{}"),
        schema=S,
    )
    op.create_table(
        "tokens",
        sa.Column("sha256", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(63), nullable=True),
        sa.Column("admin", sa.Boolean(), nullable=False, server_default="false"),
        sa.Column("created_at", TS, nullable=False, server_default=sa.text("now()")),
        schema=S,
    )
    op.create_table(
        "inflight_preemptions",
        sa.Column("preemptor", sa.String(64), primary_key=True),
        sa.Column("victims", postgresql.JSONB(), nullable=False),
        sa.Column("requested_at", TS, nullable=False),
        sa.Column("deadline", TS, nullable=False),
        sa.Column("flavors", postgresql.JSONB(), nullable=False),
        sa.Column("usage", postgresql.JSONB(), nullable=False),
        schema=S,
    )
    op.create_table(
        "draining_victims",
        sa.Column("victim", sa.String(64), primary_key=True),
        sa.Column("preemptor", sa.String(64), nullable=False),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("deadline", TS, nullable=False),
        schema=S,
    )
    op.create_table(
        "fair_share_history",
        sa.Column("queue", sa.String(63), primary_key=True),
        sa.Column("history", postgresql.JSONB(), nullable=False),
        sa.Column("sampled_at", TS, nullable=False),
        schema=S,
    )
    op.create_table(
        "inventory_nodes",
        sa.Column("name", sa.String(253), primary_key=True),
        sa.Column("source", sa.String(253), nullable=False),
        sa.Column("gpus", postgresql.JSONB(), nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        schema=S,
    )
    op.create_table(
        "placements",
        sa.Column("job_id", sa.String(64), primary_key=True),
        sa.Column("pods", postgresql.JSONB(), nullable=False),
        sa.Column("placed_at", TS, nullable=False),
        schema=S,
    )


def downgrade() -> None:
    for table in (
        "placements",
        "inventory_nodes",
        "fair_share_history",
        "draining_victims",
        "inflight_preemptions",
        "tokens",
        "policy",
        "priority_classes",
        "tenant_queues",
        "queues",
        "cohorts",
        "flavors",
    ):
        op.drop_table(table, schema=S)
    op.drop_index("ix_jobs_cluster_queue_state", table_name="jobs", schema=S)
    for name in (
        "preemption_deadline",
        "preempted_by",
        "wait_message",
        "wait_reason",
        "admitted_at",
        "flavors",
        "workload",
        "cluster_queue",
    ):
        op.drop_column("jobs", name, schema=S)
    op.execute(sa.schema.DropSequence(sa.Sequence("change_seq", schema=S)))
