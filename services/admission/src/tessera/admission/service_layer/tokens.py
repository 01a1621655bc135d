"""Bearer tokens: random 32-byte strings, stored as their sha256 (see ADR 0007). Each has a public
id (for lists and revocation), may expire, and may be revoked; a revoked or expired token is refused."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

from tessera.admission.domain.tokens import TokenRecord, tenant_error
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork


@dataclass(frozen=True)
class Grant:
    """What a token allows: acting for one tenant, or for everyone (admin)."""

    tenant: str | None
    admin: bool


class TokenRefused(Exception):
    """The token is unknown, revoked or expired; the message says which."""


class InvalidTenant(ValueError):
    pass


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "tsr_" + secrets.token_urlsafe(32)


def now() -> datetime:
    return datetime.now(UTC)


async def issue_token(
    uow: AdmissionUnitOfWork, tenant: str, expires_at: datetime | None = None
) -> tuple[str, TokenRecord]:
    """A new token for ``tenant`` (a name a job may carry; InvalidTenant otherwise); only its hash is
    kept, so it is shown once. The caller commits."""
    if (why := tenant_error(tenant)) is not None:
        raise InvalidTenant(why)
    token = new_token()
    return token, await uow.tokens.add(hash_token(token), tenant, admin=False, expires_at=expires_at)


async def issue_admin_token(uow: AdmissionUnitOfWork) -> tuple[str, TokenRecord]:
    """A new admin token (what `tessera up` makes at first start). The caller commits."""
    token = new_token()
    return token, await uow.tokens.add(hash_token(token), None, admin=True)


async def grant_of(uow: AdmissionUnitOfWork, token: str, at: datetime | None = None) -> Grant:
    """What ``token`` may do at ``at`` (now by default); TokenRefused when it is unknown, revoked
    or expired."""
    found = await uow.tokens.find(hash_token(token))
    if found is None:
        raise TokenRefused("unknown bearer token")
    if (why := found.refusal(at or now())) is not None:
        raise TokenRefused(why)
    return Grant(found.tenant, found.admin)


async def revoke_token(
    uow: AdmissionUnitOfWork, token_id: str, at: datetime | None = None
) -> TokenRecord | None:
    """Revoke the token with this id; None when there is none. The caller commits."""
    return await uow.tokens.revoke(token_id, at or now())
