"""each pod's measured GPU use per minute, for packing time-sliced GPUs by use

Revision ID: slicing_0005
Revises: slicing_0004
Create Date: 2026-11-28 06:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "slicing_0005"
down_revision: str | None = "slicing_0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "slicing"


def upgrade() -> None:
    op.create_table(
        "pod_usage",
        sa.Column("pod", sa.String(length=320), nullable=False),
        sa.Column("minute", sa.DateTime(timezone=True), nullable=False),
        sa.Column("node", sa.String(length=255), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=128), nullable=False),
        sa.Column("total_pct", sa.Float(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("allocated_milli", sa.Integer(), nullable=False),
        sa.Column("split", sa.String(length=16), nullable=False),
        sa.PrimaryKeyConstraint("pod", "minute"),
        schema=S,
    )
    op.create_index("ix_slicing_pod_usage_minute", "pod_usage", ["minute"], unique=False, schema=S)


def downgrade() -> None:
    op.drop_index("ix_slicing_pod_usage_minute", table_name="pod_usage", schema=S)
    op.drop_table("pod_usage", schema=S)
