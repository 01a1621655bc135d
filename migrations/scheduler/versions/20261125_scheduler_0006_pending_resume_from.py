"""pending gangs: the checkpoint an admitted job resumes from

Revision ID: scheduler_0006
Revises: scheduler_0005
Create Date: 2026-11-25 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "scheduler_0006"
down_revision: str | None = "scheduler_0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("pending_gangs", sa.Column("resume_from", sa.Text(), nullable=True), schema="scheduler")


def downgrade() -> None:
    op.drop_column("pending_gangs", "resume_from", schema="scheduler")
