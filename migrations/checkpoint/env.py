"""Alembic environment of the checkpoint schema."""

from tessera.checkpoint.adapters.orm import metadata
from tessera.core.db.migrations import run_env

run_env(metadata, "checkpoint")
