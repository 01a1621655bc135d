"""Alembic environment of the telemetry schema."""

from tessera.core.db.migrations import run_env
from tessera.telemetry.adapters.orm import metadata

run_env(metadata, "telemetry")
