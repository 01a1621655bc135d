"""Bearer tokens: a tenant's token acts for that tenant alone; the admin token for everyone.
Tokens are random 32-byte strings stored as their sha256 (see ADR 0007)."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from tessera.admission.config import AuthMode
from tessera.admission.entrypoints.errors import ApiError
from tessera.admission.service_layer.dependencies import AdmissionDeps
from tessera.admission.service_layer.tokens import grant_of


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


def deps_of(request: Request) -> AdmissionDeps:
    deps: AdmissionDeps = request.app.state.deps
    return deps


async def principal(request: Request) -> Principal:
    deps = deps_of(request)
    if deps.auth is AuthMode.DISABLED:  # only when configured so; every other mode needs a token
        return ADMIN
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise ApiError(401, "unauthorized", "send `Authorization: Bearer <token>`", "Authorization")
    admin = deps.admin_token
    if admin is not None and hmac.compare_digest(admin.get_secret_value(), token):
        return ADMIN
    async with deps.uow() as uow:
        grant = await grant_of(uow, token)
    if grant is None:
        raise ApiError(401, "unauthorized", "unknown bearer token", "Authorization")
    return Principal(grant.tenant, grant.admin)


Caller = Annotated[Principal, Depends(principal)]
