"""usage accounting: jobs, pod placements, hourly and daily usage, rightsizing findings

Revision ID: telemetry_0003
Revises: telemetry_0002
Create Date: 2026-11-23 04:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = 'telemetry_0003'
down_revision: str | None = 'telemetry_0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

S = 'telemetry'


def _sums() -> list[sa.Column]:
    return [
        sa.Column('allocated_gpu_s', sa.Float(), nullable=False),
        sa.Column('used_gpu_s', sa.Float(), nullable=False),
        sa.Column('memory_mib_s', sa.Float(), nullable=False),
        sa.Column('idle_gpu_s', sa.Float(), nullable=False),
        sa.Column('cost', sa.Float(), nullable=False),
        sa.Column('samples', sa.BigInteger(), nullable=False),
    ]


def upgrade() -> None:
    op.create_table('jobs',
    sa.Column('job_id', sa.String(length=255), nullable=False),
    sa.Column('name', sa.String(length=255), server_default='', nullable=False),
    sa.Column('tenant', sa.String(length=63), nullable=False),
    sa.Column('queue', sa.String(length=63), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('job_id'),
    schema=S
    )
    op.create_table('pod_placements',
    sa.Column('pod', sa.String(length=253), nullable=False),
    sa.Column('job_id', sa.String(length=255), nullable=False),
    sa.Column('node', sa.String(length=253), nullable=False),
    sa.Column('gpus', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('placed_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('pod', name='pk_pod_placements'),
    schema=S
    )
    op.create_index('ix_pod_placements_job_id', 'pod_placements', ['job_id'], unique=False, schema=S)
    op.create_table('usage_hourly',
    sa.Column('window_start', sa.DateTime(timezone=True), nullable=False),
    sa.Column('node', sa.String(length=253), nullable=False),
    sa.Column('gpu_uuid', sa.String(length=64), nullable=False),
    sa.Column('namespace', sa.String(length=253), nullable=False),
    sa.Column('pod', sa.String(length=253), nullable=False),
    sa.Column('container', sa.String(length=253), nullable=False),
    sa.Column('job_id', sa.String(length=255), nullable=False),
    sa.Column('queue', sa.String(length=63), nullable=False),
    sa.Column('tenant', sa.String(length=63), nullable=False),
    sa.Column('flavor', sa.String(length=63), nullable=False),
    sa.Column('capacity_type', sa.String(length=16), nullable=False),
    sa.Column('split', sa.String(length=16), nullable=False),
    *_sums(),
    sa.Column('first_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('window_start', 'node', 'gpu_uuid', 'namespace', 'pod', 'container', name='pk_usage_hourly'),
    schema=S
    )
    op.create_index('ix_usage_hourly_tenant_window', 'usage_hourly', ['tenant', 'window_start'], unique=False, schema=S)
    op.create_index('ix_usage_hourly_window_start', 'usage_hourly', ['window_start'], unique=False, schema=S)
    op.create_table('usage_daily',
    sa.Column('day', sa.DateTime(timezone=True), nullable=False),
    sa.Column('job_id', sa.String(length=255), nullable=False),
    sa.Column('queue', sa.String(length=63), nullable=False),
    sa.Column('tenant', sa.String(length=63), nullable=False),
    sa.Column('flavor', sa.String(length=63), nullable=False),
    sa.Column('capacity_type', sa.String(length=16), nullable=False),
    *_sums(),
    sa.PrimaryKeyConstraint('day', 'job_id', 'queue', 'tenant', 'flavor', 'capacity_type', name='pk_usage_daily'),
    schema=S
    )
    op.create_index('ix_usage_daily_tenant_day', 'usage_daily', ['tenant', 'day'], unique=False, schema=S)
    op.create_table('rightsizing_findings',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=True), nullable=False),
    sa.Column('gpu_uuid', sa.String(length=64), nullable=False),
    sa.Column('namespace', sa.String(length=253), nullable=False),
    sa.Column('pod', sa.String(length=253), nullable=False),
    sa.Column('container', sa.String(length=253), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('job_id', sa.String(length=255), nullable=False),
    sa.Column('tenant', sa.String(length=63), nullable=False),
    sa.Column('since', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('detail', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    schema=S
    )
    op.create_index('ux_rightsizing_findings_open', 'rightsizing_findings', ['gpu_uuid', 'namespace', 'pod', 'container', 'kind'], unique=True, schema=S, postgresql_where=sa.text('ended_at IS NULL'))


def downgrade() -> None:
    op.drop_index('ux_rightsizing_findings_open', table_name='rightsizing_findings', schema=S, postgresql_where=sa.text('ended_at IS NULL'))
    op.drop_table('rightsizing_findings', schema=S)
    op.drop_index('ix_usage_daily_tenant_day', table_name='usage_daily', schema=S)
    op.drop_table('usage_daily', schema=S)
    op.drop_index('ix_usage_hourly_window_start', table_name='usage_hourly', schema=S)
    op.drop_index('ix_usage_hourly_tenant_window', table_name='usage_hourly', schema=S)
    op.drop_table('usage_hourly', schema=S)
    op.drop_index('ix_pod_placements_job_id', table_name='pod_placements', schema=S)
    op.drop_table('pod_placements', schema=S)
    op.drop_table('jobs', schema=S)
