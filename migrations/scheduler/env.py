"""Alembic environment of the scheduler schema."""

from tessera.core.db.migrations import run_env
from tessera.scheduler.adapters.orm import metadata

run_env(metadata, "scheduler")
