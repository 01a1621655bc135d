"""One PostgreSQL role per service, allowed into its own schema alone.

Migrations run as the admin role, which owns every table; :func:`ensure_service_roles` then (again
after each migration, so new tables are covered) lets each service's role log in, use its schema,
and read and write its tables and sequences there, and nothing anywhere else: PostgreSQL grants no
schema but ``public`` to everyone, and ``public``'s CREATE is taken away. Idempotent; safe to run on
every start (``tessera up`` does) or from a migration job.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tessera.core.db.engine import sync_url


@dataclass(frozen=True)
class ServiceRole:
    service: str
    """The schema the role may use (each service's schema is named after it)."""
    role: str
    password: str


def role_name(service: str, prefix: str = "tessera_") -> str:
    return f"{prefix}{service}"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def grants(schema: str, role: str) -> list[str]:
    """What the role may do in its schema: use it; read, insert, update and delete its rows; use its
    sequences (serial ids); the same on tables and sequences the admin role creates there later."""
    s, r = _ident(schema), _ident(role)
    return [
        f"CREATE SCHEMA IF NOT EXISTS {s}",  # as the migrations do: the admin role owns it
        f"GRANT USAGE ON SCHEMA {s} TO {r}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {s} TO {r}",
        f"GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA {s} TO {r}",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {s} GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {r}",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {s} GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO {r}",
    ]


async def ensure_service_roles(admin_url: str, roles: Iterable[ServiceRole]) -> None:
    """Create or update each role (its password included) and grant it its schema, connected as the
    admin role on ``admin_url``'s database. The schemas must exist (run the migrations first)."""
    import asyncpg  # type: ignore[import-untyped]

    conn: Any = await asyncpg.connect(sync_url(admin_url))
    try:
        async with conn.transaction():
            # two starts at once must not both see a role missing
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext('tessera-service-roles'))")
            await conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
            for role in roles:
                exists = await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", role.role)
                verb = "ALTER" if exists else "CREATE"
                statement = await conn.fetchval(
                    f"SELECT format('{verb} ROLE %I WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE "
                    "PASSWORD %L', $1::text, $2::text)",
                    role.role,
                    role.password,
                )
                await conn.execute(statement)
                for grant in grants(role.service, role.role):
                    await conn.execute(grant)
    finally:
        await conn.close()
