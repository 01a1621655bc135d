"""the outbox's dead-letter table, and each outbox row's count of failed publishes

Revision ID: admission_0005
Revises: admission_0004
Create Date: 2026-11-27 06:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "admission_0005"
down_revision: str | None = "admission_0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "admission"
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column("outbox", sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"), schema=S)
    op.add_column("outbox", sa.Column("last_error", sa.Text(), nullable=True), schema=S)
    op.create_table(
        "outbox_dead_letters",
        sa.Column("seq", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("event_id", sa.String(64), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("headers", postgresql.JSONB(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("dead_lettered_at", TS, nullable=False, server_default=sa.text("now()")),
        schema=S,
    )


def downgrade() -> None:
    op.drop_table("outbox_dead_letters", schema=S)
    op.drop_column("outbox", "last_error", schema=S)
    op.drop_column("outbox", "attempts", schema=S)
