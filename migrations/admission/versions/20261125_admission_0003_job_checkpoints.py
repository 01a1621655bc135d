"""job checkpoints: what each job saved (from the checkpoint service's checkpoint_saved)

Revision ID: admission_0003
Revises: admission_0002
Create Date: 2026-11-25 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "admission_0003"
down_revision: str | None = "admission_0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "admission"
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "job_checkpoints",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("job_id", sa.String(64), sa.ForeignKey(f"{S}.jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("request_id", sa.String(64), nullable=True),
        sa.Column("at", TS, nullable=False),
        sa.Column("recorded_at", TS, nullable=False, server_default=sa.text("now()")),
        schema=S,
    )
    op.create_index(
        "ix_job_checkpoints_job_at",
        "job_checkpoints",
        ["job_id", sa.text("at DESC"), sa.text("step DESC")],
        schema=S,
    )


def downgrade() -> None:
    op.drop_index("ix_job_checkpoints_job_at", table_name="job_checkpoints", schema=S)
    op.drop_table("job_checkpoints", schema=S)
