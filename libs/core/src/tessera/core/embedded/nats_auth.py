"""The embedded NATS server's users: one per service, one per tenant, the devcluster's and an admin.

Passwords are made once and kept in ``credentials/nats-users.json``; the server's configuration
(``nats.conf``) and each tenant's credentials (``credentials/tenants/<tenant>.json``) are written
beside them, every file readable by its owner only (0600). Permissions come from
:mod:`tessera.core.messaging.permissions`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from tessera.contracts import subjects
from tessera.core.embedded.credentials import PasswordFile, write_private
from tessera.core.messaging.permissions import (
    ADMIN_USER,
    DEVCLUSTER_USER,
    Permissions,
    devcluster_permissions,
    inbox_prefix,
    service_permissions,
    service_user,
    tenant_permissions,
    tenant_user,
)


@dataclass(frozen=True)
class NatsUser:
    name: str
    password: str
    permissions: Permissions | None
    """``None``: everything (the admin, for operators and tools)."""

    def to_config(self) -> dict[str, object]:
        entry: dict[str, object] = {"user": self.name, "password": self.password}
        if self.permissions is not None:
            entry["permissions"] = self.permissions.to_config()
        return entry


def with_credentials(url: str, user: str, password: str) -> str:
    """``url`` with ``user:password@`` in front of its host (replacing any given)."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class NatsAuth:
    """Users of one embedded NATS server, their passwords kept under ``credentials_dir``."""

    def __init__(self, credentials_dir: Path) -> None:
        self.credentials_dir = credentials_dir

    @property
    def passwords_file(self) -> Path:
        return self.credentials_dir / "nats-users.json"

    @property
    def config_file(self) -> Path:
        """nats-server's configuration: it holds the passwords too, so it lives here."""
        return self.credentials_dir / "nats.conf"

    def tenant_file(self, tenant: str) -> Path:
        return self.credentials_dir / "tenants" / f"{tenant}.json"

    def password(self, user: str) -> str:
        """The user's password, made (and kept) the first time it is asked for."""
        return PasswordFile(self.passwords_file).password(user)

    def users(self, services: Iterable[str], tenants: Iterable[str]) -> list[NatsUser]:
        users = [
            NatsUser(ADMIN_USER, self.password(ADMIN_USER), None),
            NatsUser(DEVCLUSTER_USER, self.password(DEVCLUSTER_USER), devcluster_permissions()),
        ]
        for service in services:
            name = service_user(service)
            users.append(NatsUser(name, self.password(name), service_permissions(service)))
        for tenant in sorted(set(tenants)):
            name = tenant_user(tenant)
            users.append(NatsUser(name, self.password(name), tenant_permissions(tenant)))
        return users

    def url(self, base_url: str, user: str) -> str:
        return with_credentials(base_url, user, self.password(user))

    def write_config(
        self, server: Mapping[str, object], services: Iterable[str], tenants: Iterable[str]
    ) -> Path:
        """nats-server's configuration file (JSON is valid NATS configuration): ``server``'s own
        settings (``NatsServer.base_config()``) and the users."""
        users = [u.to_config() for u in self.users(services, tenants)]
        document = {**server, "authorization": {"users": users}}
        write_private(self.config_file, json.dumps(document, indent=2) + "\n")
        return self.config_file

    def write_tenant_credentials(self, base_url: str, tenants: Iterable[str]) -> list[Path]:
        """One file per tenant for its external publishers: the URL with its credentials, the one
        subject it may publish, and the inbox prefix its client must use to receive PubAcks."""
        written = []
        for tenant in sorted(set(tenants)):
            user = tenant_user(tenant)
            document = {
                "tenant": tenant,
                "user": user,
                "password": self.password(user),
                "url": self.url(base_url, user),
                "subject": subjects.tenant_submit_job(tenant),
                "inbox_prefix": inbox_prefix(user),
            }
            path = self.tenant_file(tenant)
            write_private(path, json.dumps(document, indent=2) + "\n")
            written.append(path)
        return written
