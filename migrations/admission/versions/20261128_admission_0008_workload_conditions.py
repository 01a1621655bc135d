"""workloads: when admission last wrote the job's conditions onto its Kubernetes Jobs (the job's
updated_at it reported), so a changed reason is written once

Revision ID: admission_0008
Revises: admission_0007
Create Date: 2026-11-28 11:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "admission_0008"
down_revision: str | None = "admission_0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "admission"


def upgrade() -> None:
    op.add_column("workloads", sa.Column("reported_at", sa.DateTime(timezone=True), nullable=True), schema=S)


def downgrade() -> None:
    op.drop_column("workloads", "reported_at", schema=S)
