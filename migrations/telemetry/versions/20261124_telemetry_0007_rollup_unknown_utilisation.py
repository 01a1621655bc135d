"""a rollup's utilisation mean and max are NULL when no reading of its window had a utilisation

Revision ID: telemetry_0007
Revises: telemetry_0006
Create Date: 2026-11-24 08:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "telemetry_0007"
down_revision: str | None = "telemetry_0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "telemetry"
COLUMNS = ("utilization_mean_pct", "utilization_max_pct")


def upgrade() -> None:
    for column in COLUMNS:
        op.alter_column("gpu_rollups", column, existing_type=sa.Float(), nullable=True, schema=S)


def downgrade() -> None:
    for column in COLUMNS:
        # the windows without a known utilisation read as 0%, as they were stored before
        op.execute(sa.text(f"UPDATE {S}.gpu_rollups SET {column} = 0 WHERE {column} IS NULL"))
        op.alter_column("gpu_rollups", column, existing_type=sa.Float(), nullable=False, schema=S)
