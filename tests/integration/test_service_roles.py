"""Each service's PostgreSQL role is limited to its own schema: the scheduler's role writes the
scheduler's tables and is refused admission's (permission denied), as `tessera up` grants them."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg  # type: ignore[import-untyped]
import pytest

from tessera.core.db.migrations import migrate
from tessera.core.db.roles import ServiceRole, ensure_service_roles

pytestmark = pytest.mark.integration


def as_role(url: str, role: ServiceRole) -> str:
    parts = urlsplit(url)
    netloc = f"{role.role}:{role.password}@{parts.netloc.rpartition('@')[2]}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


@pytest.fixture
async def roles(fresh_database: str) -> AsyncIterator[dict[str, ServiceRole]]:
    for schema in ("admission", "scheduler"):
        await asyncio.to_thread(migrate, schema, fresh_database)
    tag = uuid.uuid4().hex[:8]  # roles belong to the whole server, which other tests share
    made = {s: ServiceRole(s, f"t{tag}_{s}", uuid.uuid4().hex) for s in ("admission", "scheduler")}
    await ensure_service_roles(fresh_database, made.values())
    await ensure_service_roles(fresh_database, made.values())  # again, as every start does
    yield made
    admin = await asyncpg.connect(fresh_database)
    try:
        for role in made.values():
            await admin.execute(f'DROP OWNED BY "{role.role}"')
            await admin.execute(f'DROP ROLE "{role.role}"')
    finally:
        await admin.close()


OUTBOX_ROW = "INSERT INTO {schema}.outbox (event_id, subject, headers, body) VALUES ($1, 's', '{{}}', 'b')"


async def test_the_schedulers_role_writes_its_tables_and_is_refused_admissions(
    fresh_database: str, roles: dict[str, ServiceRole]
) -> None:
    conn = await asyncpg.connect(as_role(fresh_database, roles["scheduler"]))
    try:
        await conn.execute(OUTBOX_ROW.format(schema="scheduler"), "own")
        assert await conn.fetchval("SELECT count(*) FROM scheduler.outbox") == 1
        await conn.execute("DELETE FROM scheduler.outbox")

        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="permission denied"):
            await conn.execute(OUTBOX_ROW.format(schema="admission"), "theirs")
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="permission denied"):
            await conn.fetchval("SELECT count(*) FROM admission.jobs")
        # nor may it make tables anywhere: its schema's or public
        for schema in ("scheduler", "public"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError, match="permission denied"):
                await conn.execute(f"CREATE TABLE {schema}.mine (x int)")
    finally:
        await conn.close()

    admission = await asyncpg.connect(as_role(fresh_database, roles["admission"]))
    try:
        await admission.execute(OUTBOX_ROW.format(schema="admission"), "own")
        assert await admission.fetchval("SELECT count(*) FROM admission.outbox") == 1
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="permission denied"):
            await admission.execute("DELETE FROM scheduler.outbox")
    finally:
        await admission.close()


async def test_a_table_a_later_migration_adds_is_the_services_too(
    fresh_database: str, roles: dict[str, ServiceRole]
) -> None:
    admin = await asyncpg.connect(fresh_database)
    try:  # made by the admin role, as a migration would, after the grants
        await admin.execute("CREATE TABLE scheduler.later (id serial PRIMARY KEY, x int)")
    finally:
        await admin.close()
    conn = await asyncpg.connect(as_role(fresh_database, roles["scheduler"]))
    try:
        await conn.execute("INSERT INTO scheduler.later (x) VALUES (1)")
        assert await conn.fetchval("SELECT x FROM scheduler.later") == 1
    finally:
        await conn.close()
