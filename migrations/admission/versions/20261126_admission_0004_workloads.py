"""workloads: the Kubernetes objects (Indexed Jobs, headless Service) that run each job

Revision ID: admission_0004
Revises: admission_0003
Create Date: 2026-11-26 06:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "admission_0004"
down_revision: str | None = "admission_0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "admission"
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "workloads",
        sa.Column(
            "job_id", sa.String(64), sa.ForeignKey(f"{S}.jobs.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("owner", sa.String(16), nullable=False, server_default="tessera"),
        sa.Column("objects", JSONB(), nullable=False, server_default="[]"),
        sa.Column("applied", sa.String(16), nullable=False),
        sa.Column("note", sa.Text(), nullable=False, server_default=""),
        sa.Column("updated_at", TS, nullable=False),
        schema=S,
    )


def downgrade() -> None:
    op.drop_table("workloads", schema=S)
