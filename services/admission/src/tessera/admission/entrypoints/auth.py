"""Bearer tokens: a tenant's token acts for that tenant alone; the admin token for everyone.
Tokens are random 32-byte strings stored as their sha256 (see ADR 0007)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import select

from tessera.admission.adapters.orm import tokens
from tessera.admission.config import AuthMode
from tessera.admission.entrypoints.errors import ApiError
from tessera.admission.service_layer.dependencies import AdmissionDeps
from tessera.core.runner import ServiceContext


@dataclass(frozen=True)
class Principal:
    tenant: str | None
    admin: bool

    def require_admin(self, action: str) -> None:
        if not self.admin:
            raise ApiError(403, "forbidden", f"only the admin token may {action}")

    def require_tenant(self, tenant: str, action: str, field: str | None = "tenant") -> None:
        if not self.admin and self.tenant != tenant:
            raise ApiError(
                403, "forbidden", f"tenant {self.tenant!r} may not {action} of tenant {tenant!r}", field
            )


ADMIN = Principal(None, True)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "tsr_" + secrets.token_urlsafe(32)


def deps_of(request: Request) -> AdmissionDeps:
    deps: AdmissionDeps = request.app.state.deps
    return deps


def ctx_of(request: Request) -> ServiceContext:
    return deps_of(request).ctx


async def principal(request: Request) -> Principal:
    deps = deps_of(request)
    ctx = deps.ctx
    if deps.auth is AuthMode.DISABLED:  # only when configured so; every other mode needs a token
        return ADMIN
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise ApiError(401, "unauthorized", "send `Authorization: Bearer <token>`", "Authorization")
    admin = deps.admin_token
    if admin is not None and hmac.compare_digest(admin.get_secret_value(), token):
        return ADMIN
    async with ctx.engine.connect() as conn:
        row = (
            await conn.execute(
                select(tokens.c.tenant, tokens.c.admin).where(tokens.c.sha256 == hash_token(token))
            )
        ).first()
    if row is None:
        raise ApiError(401, "unauthorized", "unknown bearer token", "Authorization")
    return Principal(row.tenant, bool(row.admin))


Caller = Annotated[Principal, Depends(principal)]
