"""evictions ready: the checkpoint service's word that a checkpointable victim may be evicted

Revision ID: scheduler_0005
Revises: scheduler_0004
Create Date: 2026-11-23 03:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "scheduler_0005"
down_revision: str | None = "scheduler_0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "evictions_ready",
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("preemptor_job_id", sa.String(length=64), nullable=False),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        sa.Column("checkpoint_uri", sa.Text(), nullable=True),
        sa.Column("step", sa.BigInteger(), nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "preemptor_job_id"),
        schema="scheduler",
    )
    op.create_index(
        op.f("ix_scheduler_evictions_ready_received_at"),
        "evictions_ready",
        ["received_at"],
        unique=False,
        schema="scheduler",
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_scheduler_evictions_ready_received_at"), table_name="evictions_ready", schema="scheduler")
    op.drop_table("evictions_ready", schema="scheduler")
