"""Alembic environment of the slicing schema."""

from tessera.core.db.migrations import run_env
from tessera.slicing.adapters.orm import metadata

run_env(metadata, "slicing")
