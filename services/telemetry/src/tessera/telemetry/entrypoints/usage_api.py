"""`GET /v1/usage`: GPU-hours allocated, used and idle, memory and cost, per tenant, queue, job or
flavor over a period, with the top wasters (jobs by idle GPU-hours). `GET /v1/usage/series`: the
same over time, one point per hour (mean GPUs allocated, used and idle) for the busiest groups.

Tenant scoping: a bearer token is checked with admission by the shared `tessera.core.tenant_tokens`
(ADR 0016), as the checkpoint service's and the forecaster's reads are. Auth `disabled` (the local
stack) or the admin token reads every tenant, or the one `tenant=` names; a tenant's token reads its own
tenant (the tenant of its own jobs; none, no usage) and is refused another's (403); an unknown token or
none is 401, and an admission that does not answer is 503. Without an admission URL only the admin token
reads.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request

from tessera.telemetry.domain.usage_report import GroupBy, UsageTotal
from tessera.telemetry.domain.usage_series import MAX_HOURS, HourSum, Series, hour_floor, shape_series
from tessera.telemetry.service_layer.dependencies import Telemetry

router = APIRouter(prefix="/v1", tags=["usage"])


def _deps(request: Request) -> Telemetry:
    deps: Telemetry = request.app.state.deps
    return deps


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
    scope = await _deps(request).tokens.scope(request, tenant)
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
    scope = await _deps(request).tokens.scope(request, tenant)
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
