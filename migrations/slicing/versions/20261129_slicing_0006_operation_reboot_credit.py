"""each operation's reboot credit: when its attempt last found the MIG manager rebooting the node, and
how far that moved the attempt's apply deadline on

Revision ID: slicing_0006
Revises: slicing_0005
Create Date: 2026-11-29 06:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "slicing_0006"
down_revision: str | None = "slicing_0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "slicing"


def upgrade() -> None:
    op.add_column(
        "operations", sa.Column("rebooting_since", sa.DateTime(timezone=True), nullable=True), schema=S
    )
    op.add_column(
        "operations", sa.Column("reboot_credit_s", sa.Float(), nullable=False, server_default="0"), schema=S
    )


def downgrade() -> None:
    op.drop_column("operations", "reboot_credit_s", schema=S)
    op.drop_column("operations", "rebooting_since", schema=S)
