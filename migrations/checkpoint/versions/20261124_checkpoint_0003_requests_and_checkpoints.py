"""checkpoints, checkpoint requests with deadlines, jobs and their pods, node signals; observed events go

Revision ID: checkpoint_0003
Revises: checkpoint_0002
Create Date: 2026-11-24 09:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = 'checkpoint_0003'
down_revision: str | None = 'checkpoint_0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OPEN_REQUEST = sa.text("state IN ('requested', 'saving')")


def upgrade() -> None:
    # The placements it recorded are replaced by jobs and job_pods, which it acts on.
    op.drop_index(op.f('ix_checkpoint_observed_events_received_at'), table_name='observed_events', schema='checkpoint')
    op.drop_index(op.f('ix_checkpoint_observed_events_type'), table_name='observed_events', schema='checkpoint')
    op.drop_table('observed_events', schema='checkpoint')

    op.create_table('checkpoints',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('job_id', sa.String(length=255), nullable=False),
    sa.Column('step', sa.BigInteger(), nullable=False),
    sa.Column('uri', sa.Text(), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.Column('saved_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('request_id', sa.String(length=64), nullable=True),
    sa.Column('recorded_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    schema='checkpoint'
    )
    op.create_index('ix_checkpoint_checkpoints_job_saved_at', 'checkpoints', ['job_id', 'saved_at'], unique=False, schema='checkpoint')
    op.create_index('ix_checkpoint_checkpoints_saved_at', 'checkpoints', ['saved_at'], unique=False, schema='checkpoint')

    op.create_table('checkpoint_requests',
    sa.Column('request_id', sa.String(length=64), nullable=False),
    sa.Column('job_id', sa.String(length=255), nullable=False),
    sa.Column('reason', sa.String(length=64), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('deadline', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('outcome', sa.Text(), nullable=True),
    sa.Column('checkpoint_id', sa.String(length=64), nullable=True),
    sa.Column('checkpoint_uri', sa.Text(), nullable=True),
    sa.Column('preemptor_job_id', sa.String(length=255), nullable=True),
    sa.Column('trace', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.PrimaryKeyConstraint('request_id'),
    schema='checkpoint'
    )
    op.create_index('uq_checkpoint_requests_open_job', 'checkpoint_requests', ['job_id'], unique=True, schema='checkpoint', postgresql_where=OPEN_REQUEST)
    op.create_index('ix_checkpoint_requests_open_deadline', 'checkpoint_requests', ['deadline'], unique=False, schema='checkpoint', postgresql_where=OPEN_REQUEST)
    op.create_index('ix_checkpoint_requests_updated_at', 'checkpoint_requests', ['updated_at'], unique=False, schema='checkpoint')

    op.create_table('jobs',
    sa.Column('job_id', sa.String(length=255), nullable=False),
    sa.Column('checkpointable', sa.Boolean(), nullable=True),
    sa.Column('admitted_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('placed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('job_id'),
    schema='checkpoint'
    )
    op.create_index('ix_checkpoint_jobs_finished_at', 'jobs', ['finished_at'], unique=False, schema='checkpoint')

    op.create_table('job_pods',
    sa.Column('job_id', sa.String(length=255), nullable=False),
    sa.Column('pod', sa.String(length=255), nullable=False),
    sa.Column('node', sa.String(length=255), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['checkpoint.jobs.job_id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('job_id', 'pod', name='pk_job_pods'),
    schema='checkpoint'
    )
    op.create_index('ix_checkpoint_job_pods_node', 'job_pods', ['node'], unique=False, schema='checkpoint')

    op.create_table('node_signals',
    sa.Column('node', sa.String(length=255), nullable=False),
    sa.Column('key', sa.String(length=320), nullable=False),
    sa.Column('value', sa.Text(), nullable=False),
    sa.Column('reason', sa.String(length=64), nullable=False),
    sa.Column('noticed_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('deadline', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('node', 'key', name='pk_node_signals'),
    schema='checkpoint'
    )


def downgrade() -> None:
    op.drop_table('node_signals', schema='checkpoint')
    op.drop_index('ix_checkpoint_job_pods_node', table_name='job_pods', schema='checkpoint')
    op.drop_table('job_pods', schema='checkpoint')
    op.drop_index('ix_checkpoint_jobs_finished_at', table_name='jobs', schema='checkpoint')
    op.drop_table('jobs', schema='checkpoint')
    op.drop_index('ix_checkpoint_requests_updated_at', table_name='checkpoint_requests', schema='checkpoint')
    op.drop_index('ix_checkpoint_requests_open_deadline', table_name='checkpoint_requests', schema='checkpoint', postgresql_where=OPEN_REQUEST)
    op.drop_index('uq_checkpoint_requests_open_job', table_name='checkpoint_requests', schema='checkpoint', postgresql_where=OPEN_REQUEST)
    op.drop_table('checkpoint_requests', schema='checkpoint')
    op.drop_index('ix_checkpoint_checkpoints_saved_at', table_name='checkpoints', schema='checkpoint')
    op.drop_index('ix_checkpoint_checkpoints_job_saved_at', table_name='checkpoints', schema='checkpoint')
    op.drop_table('checkpoints', schema='checkpoint')

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
    schema='checkpoint'
    )
    op.create_index(op.f('ix_checkpoint_observed_events_type'), 'observed_events', ['type'], unique=False, schema='checkpoint')
    op.create_index(op.f('ix_checkpoint_observed_events_received_at'), 'observed_events', ['received_at'], unique=False, schema='checkpoint')
