"""Bearer tokens as admission keeps them: who a token acts for, until when, and whether it was
revoked. The secret itself is never kept, only its sha256 (see ADR 0007). Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from tessera.contracts.jobs import DNS_LABEL

TENANT_MAX = 63
TENANT = re.compile(DNS_LABEL)
"""A token's tenant is a name a job may carry (`JobSpec.tenant`): a DNS label."""

RESERVED_TENANTS = {"unknown": "reserved for usage no job is known for"}
"""Names no tenant may take, with why. Telemetry bills GPU use it finds no job for to tenant
`unknown`: a token for that tenant would read everyone's unattributed usage (GET /v1/usage)."""


def reserved_tenant(tenant: str) -> str | None:
    """Why ``tenant`` is a reserved name, or None."""
    why = RESERVED_TENANTS.get(tenant)
    return None if why is None else f"{tenant!r} is {why}"


def tenant_error(tenant: str) -> str | None:
    """Why ``tenant`` cannot be a token's tenant, or None."""
    if not tenant or len(tenant) > TENANT_MAX:
        return f"a tenant is 1 to {TENANT_MAX} characters"
    if not TENANT.fullmatch(tenant):
        return "a tenant is a DNS label: lowercase letters, digits and '-', starting and ending alphanumeric"
    return reserved_tenant(tenant)


def token_id(sha256: str) -> str:
    """The public name of a token (in lists and revocations): the start of its hash."""
    return sha256[:16]


@dataclass(frozen=True)
class TokenRecord:
    id: str
    tenant: str | None
    admin: bool
    created_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None

    def refusal(self, at: datetime) -> str | None:
        """Why the token no longer works at ``at`` (revoked or expired), or None while it does."""
        if self.revoked_at is not None and self.revoked_at <= at:
            return f"the token was revoked at {self.revoked_at.isoformat()}"
        if self.expires_at is not None and self.expires_at <= at:
            return f"the token expired at {self.expires_at.isoformat()}"
        return None
