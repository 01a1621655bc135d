"""Who ``tessera up``'s parts connect as: NATS users and PostgreSQL roles, one per service.

When ``tessera up`` runs NATS itself, the server runs with ``credentials/nats.conf``: each service
connects as its own user, allowed its own stream and the events it consumes
(:mod:`tessera.core.messaging.permissions`); the devcluster's trainers as theirs; each tenant of
the queue configuration (``admission.tenant_queues``) gets a user that may publish only
``tessera.admission.cmd.submit_job.<tenant>``, its credentials in ``credentials/tenants/<tenant>.json``.
Tenants added later (``tessera queues apply``) get theirs within seconds: :class:`TenantWatch` writes
the configuration again and has the server reload it. ``endpoints.json`` gives the admin user's URL.

When it runs PostgreSQL itself, migrations run as the admin role, then each service gets its role,
limited to its schema (:mod:`tessera.core.db.roles`), and connects with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from tessera.core.db.roles import ServiceRole, ensure_service_roles, role_name
from tessera.core.embedded import NatsServer, PostgresServer, StateDir, database_url
from tessera.core.embedded.credentials import PasswordFile
from tessera.core.embedded.nats_auth import NatsAuth
from tessera.core.messaging.permissions import ADMIN_USER, DEVCLUSTER_USER, inbox_prefix, service_user

log = logging.getLogger(__name__)

Sink = Callable[[str, str], None]


@dataclass(frozen=True)
class ServiceAccess:
    """How one service reaches NATS and PostgreSQL."""

    nats_url: str
    database_url: str
    nats_inbox_prefix: str | None = None


async def queue_tenants(admin_url: str, timeout: float = 5.0) -> set[str]:
    """The tenants of the queue configuration; none before admission's schema exists."""
    import asyncpg  # type: ignore[import-untyped]

    conn = await asyncpg.connect(admin_url, timeout=timeout)
    try:
        rows = await conn.fetch("SELECT tenant FROM admission.tenant_queues")
    except (asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError):
        return set()
    finally:
        await conn.close()
    return {str(row["tenant"]) for row in rows}


def tenants_now(admin_url: str) -> set[str]:
    """:func:`queue_tenants` from sync code; none when the database cannot say."""
    from tessera.core.embedded.postgres import run_async

    try:
        return run_async(lambda: queue_tenants(admin_url))
    except Exception as err:  # a fresh cluster, a database starting up: the watch catches up later
        log.info("tenants not read: %s", err)
        return set()


class StackAuth:
    """The stack's credentials under ``state.credentials``: NATS users when ``tessera up`` runs NATS,
    PostgreSQL roles when it runs PostgreSQL."""

    def __init__(self, state: StateDir, services: Sequence[str]) -> None:
        self.state = state
        self.services = tuple(services)
        self.nats = NatsAuth(state.credentials)
        self.pg_passwords = PasswordFile(state.credentials / "postgres-roles.json")
        self.tenants: set[str] = set()
        self._nats_base: str | None = None
        self._server_config: dict[str, object] = {}
        self._pg: PostgresServer | None = None

    # -- NATS -----------------------------------------------------------------------------------------
    def nats_server(self, server: NatsServer, tenants: Iterable[str]) -> NatsServer:
        """``server`` set to run with the users' configuration, written now."""
        self.tenants = set(tenants)
        self._server_config = server.base_config()
        self._write_nats(server.url)
        server.config_file = self.nats.config_file
        self._nats_base = server.url
        return server

    def _write_nats(self, base_url: str) -> None:
        self.nats.write_config(self._server_config, self.services, self.tenants)
        self.nats.write_tenant_credentials(base_url, self.tenants)

    def admin_nats_url(self, given: str) -> str:
        return self.nats.url(given, ADMIN_USER) if self._nats_base is not None else given

    def devcluster_nats_url(self, given: str) -> str:
        return self.nats.url(given, DEVCLUSTER_USER) if self._nats_base is not None else given

    def update_tenants(self, tenants: set[str]) -> bool:
        """Write users for ``tenants`` when they differ from the last written; ``True`` when so."""
        if self._nats_base is None or tenants == self.tenants:
            return False
        self.tenants = set(tenants)
        self._write_nats(self._nats_base)
        return True

    # -- PostgreSQL -----------------------------------------------------------------------------------
    def service_roles(self) -> list[ServiceRole]:
        return [
            ServiceRole(name, role_name(name), self.pg_passwords.password(role_name(name)))
            for name in self.services
        ]

    def grant_roles(self, pg: PostgresServer, admin_url: str) -> None:
        """Each service's role, limited to its schema (run after the migrations)."""
        from tessera.core.embedded.postgres import run_async

        run_async(lambda: ensure_service_roles(admin_url, self.service_roles()))
        self._pg = pg

    # -- per service ----------------------------------------------------------------------------------
    def access(self, name: str, nats_url: str, admin_database_url: str) -> ServiceAccess:
        nats, prefix = nats_url, None
        if self._nats_base is not None:
            nats = self.nats.url(self._nats_base, service_user(name))
            prefix = inbox_prefix(service_user(name))
        db = admin_database_url
        if self._pg is not None:
            pg, role = self._pg, role_name(name)
            db = database_url(pg.host, pg.port, pg.database, role, self.pg_passwords.password(role))
        return ServiceAccess(nats, db, prefix)


class TenantWatch:
    """Gives tenants added to the queue configuration their NATS users while the stack runs: reads
    the tenants every ``interval_s``, and on a change writes the configuration and the tenants'
    credentials again and has the server reload them."""

    def __init__(
        self, auth: StackAuth, server: NatsServer, admin_url: str, sink: Sink, interval_s: float = 2.0
    ) -> None:
        self.auth = auth
        self.server = server
        self.admin_url = admin_url
        self.sink = sink
        self.interval_s = interval_s

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.interval_s)
            if stop.is_set():
                return
            try:
                tenants = await queue_tenants(self.admin_url)
            except Exception:  # PostgreSQL away: its own watch restarts it; try again next time
                continue
            await self.apply(tenants)

    async def apply(self, tenants: set[str]) -> bool:
        added = sorted(tenants - self.auth.tenants)
        if not await asyncio.to_thread(self.auth.update_tenants, tenants):
            return False
        self.server.reload()
        where = self.auth.nats.tenant_file("<tenant>").relative_to(self.auth.state.root)
        said = f"users for tenants {', '.join(added)} " if added else "tenant users "
        self.sink("nats", f"{said}written ({where}); configuration reloaded")
        return True
