"""Tenants' bearer tokens, checked with admission, for a service's tenant-facing reads.

Admission issues the tokens and keeps only their hashes; no other service reads its tables. A service
asks admission instead, with the caller's own token, as telemetry's usage API does (ADR 0016):

* auth `disabled` (the local stack), or the configured admin token itself: every tenant;
* `GET {admission}/v1/jobs?tenant=<t>&limit=1` with the caller's token answers whether the token may act
  for tenant `t` (200), is a tenant's token for another tenant (403) or unknown (401). Without a tenant,
  a probe for a tenant name that cannot exist tells an admin token (200) from a tenant's (403); a
  tenant's token is then scoped to the tenant of its own jobs (no jobs: no tenant);
* `GET {admission}/v1/jobs/<id>` with the caller's token answers whether it may see that job: 200, or
  404 for another tenant's job as for an unknown one, or 401.

Verdicts are cached per token hash (and what was asked) for `CACHE_S`, so a revoked token stops reading
within it; a refusal only for `NEGATIVE_CACHE_S`. Grants and refusals are bounded apart (`CACHE_MAX`,
`NEGATIVE_CACHE_MAX`), dropping expired entries first and then the oldest, so made-up tokens cannot
grow the cache or push a valid token's grant out. Without an admission URL only the admin token reads.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

import httpx
from fastapi import HTTPException, Request
from pydantic import BaseModel

#: how long admission's grant of a token is trusted: a revoked token reads for at most this
CACHE_S = 60.0
#: how long a refusal is remembered
NEGATIVE_CACHE_S = 5.0
#: the most grants and, apart, refusals kept (each entry is a hash and a verdict, some 200 bytes)
CACHE_MAX = 4096
NEGATIVE_CACHE_MAX = 1024
#: not a DNS label, so no tenant has this name: a probe that only the admin may read
_PROBE_TENANT = "-probe-"

AuthMode = Literal["required", "disabled"]


class ErrorDetail(BaseModel):
    """FastAPI's own error body."""

    detail: str


#: the answers of a route that checks tokens with admission, for its OpenAPI document
AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorDetail, "description": "no bearer token, or one admission does not know"},
    403: {"model": ErrorDetail, "description": "the token may not read this (or only the admin may here)"},
    503: {"model": ErrorDetail, "description": "admission, which checks tokens, does not answer"},
}


@dataclass(frozen=True)
class Scope:
    """What the caller may see: every tenant (`tenant` None) or one."""

    tenant: str | None
    #: a tenant's token whose tenant is not known (it has no jobs): it sees no tenant's
    nothing: bool = False


ALL = Scope(None)
#: a grant of one job: the caller may see it
SEEN = Scope(None)


class VerdictCache:
    """Admission's verdicts by key, each until it expires: grants (a Scope) and refusals (the status)
    apart, each bounded. Entries of one kind share a TTL and a refreshed one moves to the end, so the
    oldest is also the first to expire: eviction takes from the front, expired ones first."""

    def __init__(self) -> None:
        self.granted: OrderedDict[str, tuple[float, Scope]] = OrderedDict()
        self.refused: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self.granted) + len(self.refused)

    def get(self, key: str, now: float) -> Scope | int | None:
        for entries in (self.granted, self.refused):
            found = entries.get(key)
            if found is not None:
                if found[0] > now:
                    return found[1]
                del entries[key]
        return None

    def put(self, key: str, verdict: Scope | int, now: float) -> None:
        self.granted.pop(key, None)
        self.refused.pop(key, None)
        if isinstance(verdict, Scope):
            self.granted[key] = (now + CACHE_S, verdict)
            _bound(self.granted, CACHE_MAX, now)
        else:
            self.refused[key] = (now + NEGATIVE_CACHE_S, verdict)
            _bound(self.refused, NEGATIVE_CACHE_MAX, now)


def _bound(entries: OrderedDict[str, tuple[float, Any]], most: int, now: float) -> None:
    while entries and next(iter(entries.values()))[0] <= now:
        entries.popitem(last=False)
    while len(entries) > most:
        entries.popitem(last=False)


def unauthorized(message: str) -> HTTPException:
    return HTTPException(401, message, headers={"WWW-Authenticate": "Bearer"})


def bearer_of(request: Request) -> str:
    """The bearer token the request sends; 401 without one."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise unauthorized("send `Authorization: Bearer <token>` (a token admission issued)")
    return token


@dataclass
class TenantTokens:
    """Who a request's bearer token reads for, as admission says. One per service, built at start."""

    admission_url: str | None = None
    auth: AuthMode = "required"
    admin_token: str | None = None
    #: what the service answers about when only the admin may read (telling the operator why)
    service: str = "this service"
    transport: httpx.AsyncBaseTransport | None = None
    clock: Callable[[], float] = time.monotonic
    cache: VerdictCache = field(default_factory=VerdictCache)

    def _is_admin(self, token: str) -> bool:
        return self.admin_token is not None and hmac.compare_digest(self.admin_token.encode(), token.encode())

    async def _ask(self, token: str, path: str, params: dict[str, Any] | None = None) -> httpx.Response:
        assert self.admission_url is not None
        async with httpx.AsyncClient(
            base_url=self.admission_url, timeout=5.0, transport=self.transport
        ) as client:
            try:
                answer = await client.get(path, params=params, headers={"Authorization": f"Bearer {token}"})
            except httpx.HTTPError as exc:
                raise HTTPException(503, f"admission, which checks tokens, does not answer: {exc}") from exc
        if answer.status_code >= 500:  # not a verdict on the token: not cached
            raise HTTPException(503, f"admission, which checks tokens, answered {answer.status_code}")
        return answer

    async def _verdict(self, token: str, what: str, check: Callable[[], Awaitable[Scope | int]]) -> Scope:
        if self.admission_url is None:
            raise HTTPException(
                403, f"only the admin token may read {self.service} (it has no admission URL)"
            )
        key = hashlib.sha256(f"{token}\0{what}".encode()).hexdigest()
        verdict = self.cache.get(key, self.clock())
        if verdict is None:
            verdict = await check()
            self.cache.put(key, verdict, self.clock())
        if isinstance(verdict, int):
            message = {401: "unknown bearer token", 403: "the token may not read this", 404: "not found"}
            if verdict == 401:
                raise unauthorized(message[401])
            raise HTTPException(verdict, message.get(verdict, "the token was refused"))
        return verdict

    async def scope(self, request: Request, tenant: str | None = None) -> Scope:
        """The tenants the caller may read: `tenant` alone when named (403 for another tenant's token),
        else every tenant for the admin and its own for a tenant's token. An empty `tenant` (a
        `?namespace=` left empty) names none, as if absent."""
        tenant = tenant or None
        if self.auth == "disabled":
            return Scope(tenant)
        token = bearer_of(request)
        if self._is_admin(token):
            return Scope(tenant)
        scope = await self._verdict(
            token, f"tenant\0{tenant or ''}", lambda: self._tenant_check(token, tenant)
        )
        if scope.tenant is None and tenant is not None and not scope.nothing:
            return Scope(tenant)  # the admin narrows to one tenant
        return scope

    async def _tenant_check(self, token: str, tenant: str | None) -> Scope | int:
        if tenant is not None:
            answer = await self._ask(token, "/v1/jobs", {"tenant": tenant, "limit": 1})
            return Scope(tenant) if answer.status_code == 200 else answer.status_code
        probe = await self._ask(token, "/v1/jobs", {"tenant": _PROBE_TENANT, "limit": 1})
        if probe.status_code == 200:
            return ALL
        if probe.status_code != 403:
            return probe.status_code
        own = await self._ask(token, "/v1/jobs", {"limit": 1})
        if own.status_code != 200:
            return own.status_code
        jobs = own.json()
        return Scope(str(jobs[0]["tenant"])) if jobs else Scope(None, nothing=True)

    async def require_job(self, request: Request, job_id: str) -> None:
        """Pass when the caller may see the job; another tenant's job is 404, as admission answers it
        (a tenant's token cannot learn which ids exist or whose they are)."""
        if await self.scope(request) == ALL:
            return  # auth disabled, or the admin: every job's, admission's or not
        token = bearer_of(request)
        await self._verdict(token, f"job\0{job_id}", lambda: self._job_check(token, job_id))

    async def _job_check(self, token: str, job_id: str) -> Scope | int:
        answer = await self._ask(token, f"/v1/jobs/{quote(job_id, safe='')}")
        if answer.status_code == 200:
            return SEEN
        return 401 if answer.status_code == 401 else 404  # a job id admission refuses is none it knows
