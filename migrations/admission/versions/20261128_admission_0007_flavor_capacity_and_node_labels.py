"""flavors get a capacity type (on-demand or spot), node labels and tolerations, as Kueue's
ResourceFlavors; admission keeps each inventory node's labels, to tell which flavor a node is

Revision ID: admission_0007
Revises: admission_0006
Create Date: 2026-11-28 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "admission_0007"
down_revision: str | None = "admission_0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "admission"


def upgrade() -> None:
    op.add_column(
        "flavors",
        sa.Column("capacity_type", sa.String(16), nullable=False, server_default="on-demand"),
        schema=S,
    )
    op.add_column("flavors", sa.Column("node_labels", JSONB(), nullable=False, server_default="{}"), schema=S)
    op.add_column("flavors", sa.Column("tolerations", JSONB(), nullable=False, server_default="[]"), schema=S)
    op.add_column(
        "inventory_nodes", sa.Column("labels", JSONB(), nullable=False, server_default="{}"), schema=S
    )


def downgrade() -> None:
    op.drop_column("inventory_nodes", "labels", schema=S)
    for column in ("tolerations", "node_labels", "capacity_type"):
        op.drop_column("flavors", column, schema=S)
