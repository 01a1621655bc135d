"""Alembic, one environment per service in `migrations/<service>/`, each with its version table in its schema."""

from __future__ import annotations

import asyncio
import logging
import os
import zlib
from pathlib import Path

from sqlalchemy import MetaData, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from tessera.contracts.subjects import SERVICES
from tessera.core.db.engine import async_url

log = logging.getLogger(__name__)


def migrations_root() -> Path:
    """`TESSERA_MIGRATIONS_DIR`, else the `migrations/` folder of the checkout this package lives in."""
    configured = os.environ.get("TESSERA_MIGRATIONS_DIR")
    if configured:
        return Path(configured)
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "migrations"
        if (candidate / "admission" / "env.py").exists():
            return candidate
    raise FileNotFoundError("cannot find the migrations folder; set TESSERA_MIGRATIONS_DIR")


def alembic_config(service: str, database_url: str) -> object:
    from alembic.config import Config

    if service not in SERVICES:
        raise ValueError(f"unknown service {service!r}; expected one of {', '.join(SERVICES)}")
    config = Config()
    config.set_main_option("script_location", str(migrations_root() / service))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    config.attributes["schema"] = service
    return config


def migrate(service: str, database_url: str, revision: str = "head") -> None:
    """Upgrade one service's schema. Safe to run from several processes at once (advisory lock)."""
    from alembic import command
    from alembic.config import Config

    config = alembic_config(service, database_url)
    assert isinstance(config, Config)
    command.upgrade(config, revision)


def migrate_all(database_url: str) -> None:
    for service in SERVICES:
        migrate(service, database_url)
        log.info("migrated", extra={"schema": service})


def run_env(metadata: MetaData, schema: str) -> None:
    """The body of every `migrations/<service>/env.py`."""
    from alembic import context

    url = context.config.get_main_option("sqlalchemy.url")
    assert url is not None
    if context.is_offline_mode():
        context.configure(
            url=url,
            target_metadata=metadata,
            version_table_schema=schema,
            include_schemas=True,
            literal_binds=True,
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    asyncio.run(_run_online(url, metadata, schema))


async def _run_online(url: str, metadata: MetaData, schema: str) -> None:
    engine = create_async_engine(async_url(url), poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _lock_key(schema)})
            await conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
            await conn.commit()
            await conn.run_sync(_run_sync, metadata, schema)
            await conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _lock_key(schema)})
            await conn.commit()
    finally:
        await engine.dispose()


def _run_sync(conn: Connection, metadata: MetaData, schema: str) -> None:
    from alembic import context

    def include_name(name: str | None, type_: str, parent_names: object) -> bool:
        return type_ != "schema" or name == schema

    context.configure(
        connection=conn,
        target_metadata=metadata,
        version_table_schema=schema,
        include_schemas=True,
        include_name=include_name,
    )
    with context.begin_transaction():
        context.run_migrations()


def _lock_key(schema: str) -> int:
    return zlib.crc32(f"tessera-migrate-{schema}".encode())
