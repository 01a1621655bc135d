"""tokens get a public id, an expiry and a revocation time; Idempotency-Key is scoped per tenant
(its own table, keyed by tenant and key, with the hash of the body it came with)

Revision ID: admission_0006
Revises: admission_0005
Create Date: 2026-11-28 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "admission_0006"
down_revision: str | None = "admission_0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = "admission"
TS = sa.DateTime(timezone=True)
DNS_LABEL = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


def upgrade() -> None:
    op.add_column("tokens", sa.Column("id", sa.String(16), nullable=True), schema=S)
    op.execute(f"UPDATE {S}.tokens SET id = left(sha256, 16)")
    op.alter_column("tokens", "id", nullable=False, schema=S)
    op.create_unique_constraint("tokens_id_key", "tokens", ["id"], schema=S)
    op.add_column("tokens", sa.Column("expires_at", TS, nullable=True), schema=S)
    op.add_column("tokens", sa.Column("revoked_at", TS, nullable=True), schema=S)
    # tokens anyone could mint while auth was off, for tenants no job may name, can never be right
    op.execute(
        f"UPDATE {S}.tokens SET revoked_at = now() "
        f"WHERE NOT admin AND (tenant IS NULL OR length(tenant) > 63 OR tenant !~ '{DNS_LABEL}')"
    )
    op.create_table(
        "idempotency_keys",
        sa.Column("tenant", sa.String(63), primary_key=True),
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("body_sha256", sa.String(64), nullable=False),
        sa.Column(
            "job_id", sa.String(64), sa.ForeignKey(f"{S}.jobs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("created_at", TS, nullable=False, server_default=sa.text("now()")),
        schema=S,
    )


def downgrade() -> None:
    op.drop_table("idempotency_keys", schema=S)
    op.drop_column("tokens", "revoked_at", schema=S)
    op.drop_column("tokens", "expires_at", schema=S)
    op.drop_constraint("tokens_id_key", "tokens", schema=S)
    op.drop_column("tokens", "id", schema=S)
