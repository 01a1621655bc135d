"""each hourly usage row keeps the idle run in progress at its last reading, so a restart continues it

Revision ID: telemetry_0006
Revises: telemetry_0005
Create Date: 2026-11-28 06:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "telemetry_0006"
down_revision: str | None = "telemetry_0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "telemetry"


def upgrade() -> None:
    op.add_column(
        "usage_hourly", sa.Column("idle_run_since", sa.DateTime(timezone=True), nullable=True), schema=S
    )
    op.add_column(
        "usage_hourly",
        sa.Column("idle_pending_s", sa.Float(), nullable=False, server_default="0"),
        schema=S,
    )


def downgrade() -> None:
    op.drop_column("usage_hourly", "idle_pending_s", schema=S)
    op.drop_column("usage_hourly", "idle_run_since", schema=S)
