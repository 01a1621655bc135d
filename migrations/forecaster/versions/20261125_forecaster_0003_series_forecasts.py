"""series, observations, GPU shapes, chosen models, forecast errors and latest forecasts; samples are no
longer recorded whole

Revision ID: forecaster_0003
Revises: forecaster_0002
Create Date: 2026-11-25 04:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = 'forecaster_0003'
down_revision: str | None = 'forecaster_0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = 'forecaster'


def upgrade() -> None:
    op.create_table('series',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=True), nullable=False),
    sa.Column('key', sa.String(length=512), nullable=False),
    sa.Column('metric', sa.String(length=200), nullable=False),
    sa.Column('labels', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('step_s', sa.Float(), nullable=False),
    sa.Column('aggregation', sa.String(length=16), nullable=False),
    sa.Column('gpu_shape', sa.String(length=128), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('key'),
    schema=S
    )
    op.create_index(op.f('ix_forecaster_series_metric'), 'series', ['metric'], unique=False, schema=S)
    op.create_table('observations',
    sa.Column('series_id', sa.BigInteger(), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('part', sa.String(length=128), server_default='', nullable=False),
    sa.Column('total', sa.Float(), nullable=False),
    sa.Column('count', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['series_id'], ['forecaster.series.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('series_id', 'at', 'part'),
    schema=S
    )
    op.create_index('ix_observations_at', 'observations', ['at'], unique=False, schema=S)
    op.create_table('gpus',
    sa.Column('uuid', sa.String(length=128), nullable=False),
    sa.Column('model', sa.String(length=128), nullable=False),
    sa.Column('node', sa.String(length=253), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('uuid'),
    schema=S
    )
    op.create_table('models',
    sa.Column('series_id', sa.BigInteger(), nullable=False),
    sa.Column('chosen', sa.String(length=64), nullable=True),
    sa.Column('scores', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('horizon', sa.Integer(), nullable=False),
    sa.Column('fit_seconds', sa.Float(), nullable=False),
    sa.Column('reason', sa.String(length=64), nullable=True),
    sa.Column('fitted_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['series_id'], ['forecaster.series.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('series_id'),
    schema=S
    )
    op.create_table('forecast_errors',
    sa.Column('series_id', sa.BigInteger(), nullable=False),
    sa.Column('origin_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('model', sa.String(length=64), nullable=False),
    sa.Column('forecast', sa.Float(), nullable=False),
    sa.Column('actual', sa.Float(), nullable=False),
    sa.Column('relative_error', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['series_id'], ['forecaster.series.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('series_id', 'origin_at'),
    schema=S
    )
    op.create_index('ix_forecast_errors_origin_at', 'forecast_errors', ['origin_at'], unique=False, schema=S)
    op.create_table('forecasts',
    sa.Column('series_id', sa.BigInteger(), nullable=False),
    sa.Column('origin_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('step_s', sa.Float(), nullable=False),
    sa.Column('values', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('model', sa.String(length=64), nullable=True),
    sa.Column('margin', sa.Float(), nullable=False),
    sa.Column('level', sa.Float(), nullable=False),
    sa.Column('last_value', sa.Float(), nullable=True),
    sa.Column('last_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('degraded', sa.String(length=64), nullable=True),
    sa.Column('computed_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['series_id'], ['forecaster.series.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('series_id'),
    schema=S
    )
    op.drop_index(op.f('ix_forecaster_observed_events_received_at'), table_name='observed_events', schema=S)
    op.drop_index(op.f('ix_forecaster_observed_events_type'), table_name='observed_events', schema=S)
    op.drop_table('observed_events', schema=S)


def downgrade() -> None:
    op.create_table('observed_events',
    sa.Column('seq', sa.BigInteger(), sa.Identity(always=True), nullable=False),
    sa.Column('event_id', sa.String(length=64), nullable=False),
    sa.Column('type', sa.String(length=255), nullable=False),
    sa.Column('subject', sa.String(length=255), nullable=False),
    sa.Column('source', sa.String(length=255), nullable=False),
    sa.Column('occurred_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('received_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('data', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.PrimaryKeyConstraint('seq'),
    schema=S
    )
    op.create_index(op.f('ix_forecaster_observed_events_type'), 'observed_events', ['type'], unique=False, schema=S)
    op.create_index(op.f('ix_forecaster_observed_events_received_at'), 'observed_events', ['received_at'], unique=False, schema=S)
    for table in ('forecasts', 'forecast_errors', 'models', 'gpus'):
        op.drop_table(table, schema=S)
    op.drop_index('ix_observations_at', table_name='observations', schema=S)
    op.drop_table('observations', schema=S)
    op.drop_index(op.f('ix_forecaster_series_metric'), table_name='series', schema=S)
    op.drop_table('series', schema=S)
