"""Alembic environment of the admission schema."""

from tessera.admission.adapters.orm import metadata
from tessera.core.db.migrations import run_env

run_env(metadata, "admission")
