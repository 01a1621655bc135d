"""pod placements keyed by namespace and name: two tenants' pods of one name are two placements

Revision ID: telemetry_0005
Revises: telemetry_0004
Create Date: 2026-11-28 05:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "telemetry_0005"
down_revision: str | None = "telemetry_0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "telemetry"


def upgrade() -> None:
    # the placements stored so far did not name their namespace: "" (matched by name alone)
    op.add_column(
        "pod_placements",
        sa.Column("namespace", sa.String(253), nullable=False, server_default=""),
        schema=S,
    )
    op.drop_constraint("pk_pod_placements", "pod_placements", type_="primary", schema=S)
    op.create_primary_key("pk_pod_placements", "pod_placements", ["namespace", "pod"], schema=S)


def downgrade() -> None:
    # a pod name placed in several namespaces keeps its latest placement
    op.execute(
        f"DELETE FROM {S}.pod_placements AS a USING {S}.pod_placements AS b "
        "WHERE a.pod = b.pod AND (a.placed_at, a.namespace) < (b.placed_at, b.namespace)"
    )
    op.drop_constraint("pk_pod_placements", "pod_placements", type_="primary", schema=S)
    op.create_primary_key("pk_pod_placements", "pod_placements", ["pod"], schema=S)
    op.drop_column("pod_placements", "namespace", schema=S)
