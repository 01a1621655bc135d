"""observed events indexed by when they were received, for retention

Revision ID: forecaster_0002
Revises: forecaster_0001
Create Date: 2026-11-23 03:00:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = 'forecaster_0002'
down_revision: str | None = 'forecaster_0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(op.f('ix_forecaster_observed_events_received_at'), 'observed_events', ['received_at'], unique=False, schema='forecaster')


def downgrade() -> None:
    op.drop_index(op.f('ix_forecaster_observed_events_received_at'), table_name='observed_events', schema='forecaster')
