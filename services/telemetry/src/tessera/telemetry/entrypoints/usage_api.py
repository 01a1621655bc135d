"""`GET /v1/usage`: GPU-hours allocated, used and idle, memory and cost, per tenant, queue, job or
flavor over a period, with the top wasters (jobs by idle GPU-hours). `GET /v1/usage/series`: the
same over time, one point per hour (mean GPUs allocated, used and idle) for the busiest groups.

Tenant scoping. Admission issues the bearer tokens and keeps only their hashes; telemetry does not
read admission's tables. It asks admission instead, with the caller's own token (ADR 0015):

* auth `disabled` (the local stack), or the admin token itself: every tenant;
* otherwise `GET {admission}/v1/jobs?tenant=<t>&limit=1` with the caller's token answers whether the
  token may act for tenant `t` (200), is a tenant's token for another tenant (403) or unknown (401).
  Without `tenant=`, a probe for a tenant name that cannot exist tells an admin token (200) from a
  tenant's (403); a tenant's token is then scoped to the tenant of its own jobs (no jobs: no usage).

Answers are cached per token hash (and `tenant=`) for `CACHE_S`, so a revoked token stops reading within
it; a refusal only for `NEGATIVE_CACHE_S`, so a token issued just after a first try works soon. The cache
holds at most `CACHE_MAX` grants and, apart, `NEGATIVE_CACHE_MAX` refusals, dropping expired entries
first and then the oldest: made-up tokens cannot grow it or push a valid token's grant out. Without an
admission URL only the admin token reads.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import httpx
from fastapi import APIRouter, HTTPException, Query, Request

from tessera.telemetry.domain.usage_report import GroupBy, UsageTotal
from tessera.telemetry.domain.usage_series import MAX_HOURS, HourSum, Series, hour_floor, shape_series
from tessera.telemetry.service_layer.dependencies import Telemetry

router = APIRouter(prefix="/v1", tags=["usage"])
#: how long admission's grant of a token is trusted (ADR 0016): a revoked token reads for at most this
CACHE_S = 60.0
#: how long a refusal is remembered
NEGATIVE_CACHE_S = 5.0
#: the most grants and, apart, refusals kept (each entry is a hash and a verdict, some 200 bytes)
CACHE_MAX = 4096
NEGATIVE_CACHE_MAX = 1024
#: not a DNS label, so no tenant has this name: a probe that only the admin may read
_PROBE_TENANT = "-probe-"


@dataclass(frozen=True)
class Scope:
    """What the caller may see: every tenant (`tenant` None) or one."""

    tenant: str | None
    #: a tenant's token whose tenant is not known (it has no jobs): it sees nothing
    nothing: bool = False


ALL = Scope(None)


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


_cache = VerdictCache()
_now = time.monotonic


def _deps(request: Request) -> Telemetry:
    deps: Telemetry = request.app.state.deps
    return deps


async def _ask_admission(deps: Telemetry, token: str, params: dict[str, Any]) -> httpx.Response:
    assert deps.admission_url is not None
    async with httpx.AsyncClient(base_url=deps.admission_url, timeout=5.0) as client:
        try:
            return await client.get("/v1/jobs", params=params, headers={"Authorization": f"Bearer {token}"})
        except httpx.HTTPError as exc:
            raise HTTPException(503, f"admission, which checks tokens, does not answer: {exc}") from exc


async def _resolve(deps: Telemetry, token: str, tenant: str | None) -> Scope:
    if deps.admin_token is not None and hmac.compare_digest(deps.admin_token, token):
        return ALL
    if deps.admission_url is None:
        raise HTTPException(403, "only the admin token may read usage here (telemetry has no admission URL)")
    key = hashlib.sha256(f"{token}\0{tenant or ''}".encode()).hexdigest()
    verdict = _cache.get(key, _now())
    if verdict is None:
        verdict = await _check(deps, token, tenant)
        _cache.put(key, verdict, _now())
    if isinstance(verdict, int):
        message = {401: "unknown bearer token", 403: f"the token may not read tenant {tenant!r}"}
        raise HTTPException(verdict, message.get(verdict, "the token was refused"))
    return verdict


async def _check(deps: Telemetry, token: str, tenant: str | None) -> Scope | int:
    if tenant is not None:
        answer = await _ask_admission(deps, token, {"tenant": tenant, "limit": 1})
        return Scope(tenant) if answer.status_code == 200 else answer.status_code
    probe = await _ask_admission(deps, token, {"tenant": _PROBE_TENANT, "limit": 1})
    if probe.status_code == 200:
        return ALL
    if probe.status_code != 403:
        return probe.status_code
    own = await _ask_admission(deps, token, {"limit": 1})
    if own.status_code != 200:
        return own.status_code
    jobs = own.json()
    if not jobs:
        return Scope(None, nothing=True)
    return Scope(str(jobs[0]["tenant"]))


async def caller_scope(request: Request, tenant: str | None) -> Scope:
    deps = _deps(request)
    if deps.auth == "disabled":
        return Scope(tenant)
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise HTTPException(401, "send `Authorization: Bearer <token>` (a token admission issued)")
    scope = await _resolve(deps, token, tenant)
    if scope.tenant is None and tenant is not None and not scope.nothing:
        return Scope(tenant)  # the admin narrows to one tenant
    return scope


def _out(t: UsageTotal) -> dict[str, Any]:
    return {
        "group": t.group,
        "tenant": t.tenant,
        "queue": t.queue,
        "allocated_gpu_hours": round(t.allocated_gpu_hours, 6),
        "used_gpu_hours": round(t.used_gpu_hours, 6),
        "idle_gpu_hours": round(t.idle_gpu_hours, 6),
        "memory_gib_hours": round(t.memory_gib_hours, 6),
        "cost": round(t.cost, 6),
        "utilisation_pct": round(t.utilisation_pct, 2),
    }


def _invalid(field: str, message: str) -> HTTPException:
    """A 422 shaped as FastAPI's own validation errors, which the OpenAPI document describes."""
    return HTTPException(422, [{"loc": ["query", field], "msg": message, "type": "value_error"}])


def _time(value: str | None, default: datetime, field: str) -> datetime:
    if value is None:
        return default
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise _invalid(field, f"not an ISO 8601 time: {value!r}") from exc
    # in UTC, whatever offset the caller wrote: hours are floored on the stored rows' UTC grid
    return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)


From = Annotated[str | None, Query(alias="from", description="ISO 8601; default: `to` minus 24 h")]
To = Annotated[str | None, Query(alias="to", description="ISO 8601; default: now")]
TenantQuery = Annotated[str | None, Query(description="only this tenant")]


def _period(start: str | None, end: str | None) -> tuple[datetime, datetime]:
    to = _time(end, datetime.now(UTC), "to")
    since = _time(start, to - timedelta(hours=24), "from")
    if since >= to:
        raise _invalid("from", "must be before to")
    return since, to


@router.get("/usage")
async def get_usage(
    request: Request,
    by: GroupBy = GroupBy.TENANT,
    start: From = None,
    end: To = None,
    tenant: TenantQuery = None,
    top: Annotated[int, Query(ge=0, le=100, description="top wasters to list")] = 5,
) -> dict[str, Any]:
    """GPU-hours allocated, used and idle, GPU memory and cost per tenant, queue, job or flavor."""
    scope = await caller_scope(request, tenant)
    since, to = _period(start, end)
    deps = _deps(request)
    rows: list[UsageTotal] = []
    wasters: list[UsageTotal] = []
    if not scope.nothing:
        async with deps.uow() as uow:
            rows = await uow.usage.totals(by, since, to, scope.tenant)
            jobs = rows if by is GroupBy.JOB else await uow.usage.totals(GroupBy.JOB, since, to, scope.tenant)
        wasters = sorted(
            (j for j in jobs if j.idle_gpu_hours > 0 or j.waste_gpu_hours > 0),
            key=lambda j: (-j.idle_gpu_hours, -j.waste_gpu_hours, j.group),
        )[:top]
    return {
        "by": by.value,
        "from": hour_floor(since).isoformat(),  # the hour it falls in counts (rows are whole hours)
        "to": to.isoformat(),
        "tenant": scope.tenant,
        "currency": deps.currency,
        "rows": [_out(r) for r in rows],
        "top_wasters": [_out(w) for w in wasters],
    }


def series_out(s: Series) -> dict[str, Any]:
    """One series as `GET /v1/usage/series` answers it (and `tessera usage report` draws it)."""
    return {
        "group": s.group,
        "allocated_gpu_hours": round(s.allocated_gpu_hours, 6),
        "used_gpu_hours": round(s.used_gpu_hours, 6),
        "cost": round(s.cost, 6),
        "points": [
            {
                "hour": p.hour.isoformat(),
                "allocated_gpus": round(p.allocated_gpus, 6),
                "used_gpus": round(p.used_gpus, 6),
                "idle_gpus": round(p.idle_gpus, 6),
            }
            for p in s.points
        ],
    }


@router.get("/usage/series")
async def get_usage_series(
    request: Request,
    by: GroupBy = GroupBy.TENANT,
    start: From = None,
    end: To = None,
    tenant: TenantQuery = None,
    top: Annotated[
        int, Query(ge=1, le=20, description="groups with the most allocated GPU-hours; the rest as `other`")
    ] = 5,
) -> dict[str, Any]:
    """Per group and hour, the mean GPUs allocated, used and idle (GPU-seconds / 3600)."""
    scope = await caller_scope(request, tenant)
    since, to = _period(start, end)
    if to - hour_floor(since) > timedelta(hours=MAX_HOURS):
        raise _invalid("from", f"a series covers at most {MAX_HOURS} hours; ask for a shorter period")
    deps = _deps(request)
    sums: list[HourSum] = []
    if not scope.nothing:
        async with deps.uow() as uow:
            sums = await uow.usage.hour_sums(by, hour_floor(since), to, scope.tenant)
    return {
        "by": by.value,
        "from": hour_floor(since).isoformat(),
        "to": to.isoformat(),
        "tenant": scope.tenant,
        "currency": deps.currency,
        "series": [series_out(s) for s in shape_series(sums, since, to, top)],
    }
