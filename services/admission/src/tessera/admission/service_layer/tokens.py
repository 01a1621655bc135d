"""Bearer tokens: random 32-byte strings, stored as their sha256 (see ADR 0007)."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork


@dataclass(frozen=True)
class Grant:
    """What a token allows: acting for one tenant, or for everyone (admin)."""

    tenant: str | None
    admin: bool


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "tsr_" + secrets.token_urlsafe(32)


async def issue_token(uow: AdmissionUnitOfWork, tenant: str) -> str:
    """A new token for `tenant`; only its hash is kept, so it is shown once. The caller commits."""
    token = new_token()
    await uow.tokens.add(hash_token(token), tenant, admin=False)
    return token


async def grant_of(uow: AdmissionUnitOfWork, token: str) -> Grant | None:
    found = await uow.tokens.find(hash_token(token))
    return None if found is None else Grant(*found)
