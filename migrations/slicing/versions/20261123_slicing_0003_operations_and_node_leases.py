"""reconfiguration operations with their steps, and per-node leases

Revision ID: slicing_0003
Revises: slicing_0002
Create Date: 2026-11-23 06:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = 'slicing_0003'
down_revision: str | None = 'slicing_0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OPEN_OPERATION = sa.text("state IN ('planned', 'cordoned', 'draining', 'applying', 'verifying')")


def upgrade() -> None:
    op.create_table('operations',
    sa.Column('operation_id', sa.String(length=64), nullable=False),
    sa.Column('node', sa.String(length=255), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('config', sa.String(length=64), nullable=False),
    sa.Column('body', sa.Text(), nullable=False),
    sa.Column('gpus', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('expected_resources', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('previous_config', sa.String(length=64), nullable=True),
    sa.Column('drain', sa.Boolean(), nullable=False),
    sa.Column('change_reason', sa.Text(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('written', sa.Boolean(), nullable=False),
    sa.Column('retry_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('deadline', sa.DateTime(timezone=True), nullable=True),
    sa.Column('cordoned_by_us', sa.Boolean(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('operation_id'),
    schema='slicing'
    )
    op.create_index('uq_slicing_operations_open_node', 'operations', ['node'], unique=True, schema='slicing', postgresql_where=OPEN_OPERATION)
    op.create_index('ix_slicing_operations_updated_at', 'operations', ['updated_at'], unique=False, schema='slicing')
    op.create_table('operation_steps',
    sa.Column('seq', sa.BigInteger(), sa.Identity(always=True), nullable=False),
    sa.Column('operation_id', sa.String(length=64), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['operation_id'], ['slicing.operations.operation_id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('seq'),
    schema='slicing'
    )
    op.create_index('ix_slicing_operation_steps_operation', 'operation_steps', ['operation_id', 'seq'], unique=False, schema='slicing')
    op.create_table('node_leases',
    sa.Column('node', sa.String(length=255), nullable=False),
    sa.Column('holder', sa.String(length=128), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('acquired_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('node'),
    schema='slicing'
    )


def downgrade() -> None:
    op.drop_table('node_leases', schema='slicing')
    op.drop_index('ix_slicing_operation_steps_operation', table_name='operation_steps', schema='slicing')
    op.drop_table('operation_steps', schema='slicing')
    op.drop_index('ix_slicing_operations_updated_at', table_name='operations', schema='slicing')
    op.drop_index('uq_slicing_operations_open_node', table_name='operations', schema='slicing', postgresql_where=OPEN_OPERATION)
    op.drop_table('operations', schema='slicing')
