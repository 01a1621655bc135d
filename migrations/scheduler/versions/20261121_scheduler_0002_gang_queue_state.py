"""gang queue state: source, requeue reason, backoff and trace of pending gangs

Revision ID: scheduler_0002
Revises: scheduler_0001
Create Date: 2026-11-21 06:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "scheduler_0002"
down_revision: str | None = "scheduler_0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "pending_gangs",
        sa.Column("source", sa.String(length=16), server_default="job", nullable=False),
        schema="scheduler",
    )
    op.add_column(
        "pending_gangs",
        sa.Column("reason_code", sa.String(length=32), server_default="", nullable=False),
        schema="scheduler",
    )
    op.add_column(
        "pending_gangs",
        sa.Column("backoff_until", sa.DateTime(timezone=True), nullable=True),
        schema="scheduler",
    )
    op.add_column(
        "pending_gangs",
        sa.Column("trace", postgresql.JSONB(astext_type=sa.Text()), server_default="{}", nullable=False),
        schema="scheduler",
    )


def downgrade() -> None:
    op.drop_column("pending_gangs", "trace", schema="scheduler")
    op.drop_column("pending_gangs", "backoff_until", schema="scheduler")
    op.drop_column("pending_gangs", "reason_code", schema="scheduler")
    op.drop_column("pending_gangs", "source", schema="scheduler")
