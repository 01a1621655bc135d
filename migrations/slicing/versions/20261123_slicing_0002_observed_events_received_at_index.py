"""observed events indexed by when they were received, for retention

Revision ID: slicing_0002
Revises: slicing_0001
Create Date: 2026-11-23 03:00:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = 'slicing_0002'
down_revision: str | None = 'slicing_0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(op.f('ix_slicing_observed_events_received_at'), 'observed_events', ['received_at'], unique=False, schema='slicing')


def downgrade() -> None:
    op.drop_index(op.f('ix_slicing_observed_events_received_at'), table_name='observed_events', schema='slicing')
