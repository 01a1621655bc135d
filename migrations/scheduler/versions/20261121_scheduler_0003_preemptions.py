"""preemptions: requests from admission until the victim is evicted

Revision ID: scheduler_0003
Revises: scheduler_0002
Create Date: 2026-11-21 06:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "scheduler_0003"
down_revision: str | None = "scheduler_0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "preemptions",
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("preemptor_job_id", sa.String(length=64), nullable=False),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        sa.Column("deadline", sa.DateTime(timezone=True), nullable=False),
        sa.Column("grace_period_s", sa.Integer(), server_default="0", nullable=False),
        sa.Column("checkpointable", sa.Boolean(), server_default="false", nullable=False),
        sa.Column("forced", sa.Boolean(), server_default="false", nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("job_id"),
        schema="scheduler",
    )


def downgrade() -> None:
    op.drop_table("preemptions", schema="scheduler")
