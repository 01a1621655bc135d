"""decision version: lets a replica notice decisions another replica took

Revision ID: scheduler_0004
Revises: scheduler_0003
Create Date: 2026-11-21 06:45:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "scheduler_0004"
down_revision: str | None = "scheduler_0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "decision_version",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("version", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("id"),
        schema="scheduler",
    )
    op.execute("INSERT INTO scheduler.decision_version (id, version) VALUES (1, 0)")


def downgrade() -> None:
    op.drop_table("decision_version", schema="scheduler")
