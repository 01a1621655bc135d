"""REST over bearer tokens: create (for a tenant, optionally expiring), list, revoke. Every route
needs the admin token, even with auth disabled: tokens made now must still be right once auth is
turned on. A token is shown once, at creation; lists name tokens by their public id."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal, Self

from fastapi import APIRouter, Request, status
from pydantic import AwareDatetime, BaseModel, Field, StrictInt, model_validator

from tessera.admission.domain.tokens import TENANT_MAX, TokenRecord
from tessera.admission.entrypoints.auth import AdminCaller, deps_of
from tessera.admission.entrypoints.errors import ERRORS, ApiError
from tessera.admission.service_layer.tokens import InvalidTenant, issue_token, revoke_token
from tessera.contracts.jobs import DNS_LABEL

router = APIRouter(prefix="/v1", tags=["tokens"], responses=ERRORS)

TTL_MAX_S = 10 * 365 * 24 * 3600


class TokenIn(BaseModel):
    tenant: Annotated[
        str,
        Field(min_length=1, max_length=TENANT_MAX, pattern=DNS_LABEL, description="the tenant it acts for"),
    ]
    ttl_seconds: Annotated[
        StrictInt | None, Field(ge=1, le=TTL_MAX_S, description="it expires this many seconds from now")
    ] = None
    expires_at: Annotated[
        AwareDatetime | None, Field(description="it expires then (with a time zone; not with ttl_seconds)")
    ] = None

    @model_validator(mode="after")
    def _one_expiry(self) -> Self:
        if self.ttl_seconds is not None and self.expires_at is not None:
            raise ValueError("give ttl_seconds or expires_at, not both")
        return self

    def expiry(self, at: datetime) -> datetime | None:
        if self.ttl_seconds is not None:
            return at + timedelta(seconds=self.ttl_seconds)
        return self.expires_at


class TokenInfo(BaseModel):
    """A token as lists show it: never the secret."""

    id: str = Field(description="its public name, for `POST /v1/tokens/{id}/revoke`")
    tenant: str | None = Field(description="the tenant it acts for; none for an admin token")
    admin: bool
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    state: Literal["active", "expired", "revoked"]


class TokenOut(TokenInfo):
    token: str = Field(description="the bearer token; shown this once, admission keeps only its hash")


def _info(record: TokenRecord, at: datetime) -> TokenInfo:
    state: Literal["active", "expired", "revoked"] = "active"
    if record.revoked_at is not None and record.revoked_at <= at:
        state = "revoked"
    elif record.expires_at is not None and record.expires_at <= at:
        state = "expired"
    return TokenInfo(
        id=record.id,
        tenant=record.tenant,
        admin=record.admin,
        created_at=record.created_at,
        expires_at=record.expires_at,
        revoked_at=record.revoked_at,
        state=state,
    )


@router.post("/tokens", response_model=TokenOut, status_code=status.HTTP_201_CREATED)
async def create_token(request: Request, caller: AdminCaller, body: TokenIn) -> TokenOut:
    """A new bearer token for a tenant (admin token only); shown once, stored hashed."""
    at = datetime.now(UTC)
    expires_at = body.expiry(at)
    if expires_at is not None and expires_at <= at:
        raise ApiError(422, "invalid", "expires_at is in the past", "expires_at")
    async with deps_of(request).uow() as uow:
        try:
            token, record = await issue_token(uow, body.tenant, expires_at)
        except InvalidTenant as exc:
            raise ApiError(422, "invalid", f"tenant: {exc}", "tenant") from None
        await uow.commit()
    return TokenOut(**_info(record, at).model_dump(), token=token)


@router.get("/tokens", response_model=list[TokenInfo])
async def list_tokens(request: Request, caller: AdminCaller, tenant: str | None = None) -> list[TokenInfo]:
    """Every token (admin token only), oldest first, without secrets; `tenant` keeps one tenant's."""
    async with deps_of(request).uow() as uow:
        found = await uow.tokens.list(tenant=tenant)
    at = datetime.now(UTC)
    return [_info(record, at) for record in found]


@router.post("/tokens/{token_id}/revoke", response_model=TokenInfo)
async def revoke(request: Request, caller: AdminCaller, token_id: str) -> TokenInfo:
    """Revoke a token (admin token only): from now on it is answered 401. Revoking twice is harmless."""
    async with deps_of(request).uow() as uow:
        record = await revoke_token(uow, token_id)
        await uow.commit()
    if record is None:
        raise ApiError(404, "not_found", f"no token with id {token_id!r}", "token_id")
    return _info(record, datetime.now(UTC))
