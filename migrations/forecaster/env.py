"""Alembic environment of the forecaster schema."""

from tessera.core.db.migrations import run_env
from tessera.forecaster.adapters.orm import metadata

run_env(metadata, "forecaster")
