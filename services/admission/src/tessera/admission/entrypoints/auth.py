"""Bearer tokens: a tenant's token acts for that tenant alone; the admin token for everyone.
Tokens are random 32-byte strings stored as their sha256 (see ADR 0007). With auth disabled a
caller without a token acts as the admin (a token sent anyway is checked and acts as itself), except
on the token routes, which always need the admin token."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from tessera.admission.config import AuthMode
from tessera.admission.entrypoints.errors import ApiError
from tessera.admission.service_layer.dependencies import AdmissionDeps
from tessera.admission.service_layer.tokens import TokenRefused, grant_of


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


async def _authenticated(request: Request) -> Principal:
    """Who the bearer token in the request acts for; 401 without one, or with one that is unknown,
    revoked or expired."""
    deps = deps_of(request)
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise ApiError(401, "unauthorized", "send `Authorization: Bearer <token>`", "Authorization")
    admin = deps.admin_token
    if admin is not None and hmac.compare_digest(admin.get_secret_value().encode(), token.encode()):
        return ADMIN
    async with deps.uow() as uow:
        try:
            grant = await grant_of(uow, token)
        except TokenRefused as exc:
            raise ApiError(401, "unauthorized", str(exc), "Authorization") from None
    return Principal(grant.tenant, grant.admin)


async def principal(request: Request) -> Principal:
    if deps_of(request).auth is AuthMode.DISABLED and "Authorization" not in request.headers:
        return ADMIN  # only when configured so; a token sent anyway is checked and acts as itself
    return await _authenticated(request)


async def admin_principal(request: Request) -> Principal:
    """The admin, proven by the admin token even when auth is disabled: whoever makes tokens makes
    tenants' identities, which must hold once auth is turned on."""
    caller = await _authenticated(request)
    caller.require_admin("manage tokens")
    return caller


Caller = Annotated[Principal, Depends(principal)]
AdminCaller = Annotated[Principal, Depends(admin_principal)]
