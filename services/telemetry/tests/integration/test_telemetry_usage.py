"""Usage accounting on real Postgres with a controlled clock (hourly and daily rows, a replayed window
counted once, totals per tenant and job), and GET /v1/usage scoped by tokens that the real admission
service issued and checks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text

from tessera.core.db.migrations import migrate
from tessera.core.runner import RunningService, start_context
from tessera.core.tenant_tokens import TenantTokens
from tessera.telemetry import bootstrap
from tessera.telemetry.config import TelemetrySettings
from tessera.telemetry.domain.attribution import Holder, split_reading
from tessera.telemetry.domain.directory import JobDirectory, PlacedPod
from tessera.telemetry.domain.model import NodeInventory, Reading
from tessera.telemetry.domain.pricing import Flavor, PriceBook
from tessera.telemetry.domain.rightsizing import RightsizingTracker
from tessera.telemetry.domain.usage import Accountant
from tessera.telemetry.domain.usage_report import GroupBy
from tessera.telemetry.domain.usage_rows import AccountingPolicy
from tessera.telemetry.entrypoints.usage_api import router
from tessera.telemetry.service_layer.dependencies import Telemetry
from tessera.telemetry.service_layer.unit_of_work import TelemetryUnitOfWork
from tessera.telemetry.service_layer.usage import UsageLedger, flush_usage, record_usage, restore_usage
from tessera.testing.services import ServiceProcess, settings_for

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 20, 23, 0, tzinfo=UTC)  # two hours that straddle midnight
ADMIN = "admin-secret-token"


class NoGpus:
    name = "none"

    async def inventory(self) -> list[NodeInventory]:
        return []

    async def read(self, now: datetime) -> list[Reading]:
        return []

    async def close(self) -> None:
        return None


@pytest.fixture
async def telemetry(nats_url: str, fresh_database: str) -> AsyncIterator[RunningService[Any]]:
    await asyncio.to_thread(migrate, "telemetry", fresh_database)
    settings = settings_for(TelemetrySettings, nats_url, fresh_database)
    definition = bootstrap.build(settings, source=NoGpus())
    service = RunningService(definition, await start_context(definition, settings))
    try:
        yield service
    finally:
        await service.stop()


def uow(service: RunningService[Any]) -> TelemetryUnitOfWork:
    unit: TelemetryUnitOfWork = service.ctx.uow()
    return unit


def ledger() -> UsageLedger:
    directory = JobDirectory()
    directory.add_job("job-a", "team-a", "research")
    directory.add_job("job-b", "team-b", "serving")
    directory.place(
        [
            PlacedPod("pod-a", "job-a", "n0", {"GPU-0": 1000}),
            PlacedPod("pod-b", "job-b", "n0", {"GPU-1": 500}),
        ]
    )
    return UsageLedger(
        Accountant(AccountingPolicy(interval_s=10, idle_window_s=600)),
        PriceBook((Flavor("a100", "A100-80GB", None, 4.0, 1.5),)),
        RightsizingTracker(),
        directory,
    )


def readings(start: datetime, minutes: int) -> list[tuple[Reading, list[Any]]]:
    out = []
    for i in range(minutes * 6):
        at = start + timedelta(seconds=10 * i)
        busy = Reading("n0", 0, "GPU-0", at, 80.0, 40000, 300, 60, "A100-80GB", 81920)
        idle = Reading("n0", 1, "GPU-1", at, 1.0, 1000, 80, 35, "A100-80GB", 81920)
        out.append((busy, split_reading(80.0, 40000, [Holder("ml", "pod-a", "main", "GPU-0", 1000)])))
        out.append((idle, split_reading(1.0, 1000, [Holder("web", "pod-b", "main", "GPU-1", 500)])))
    return out


async def stored(service: RunningService[Any], query: str) -> list[tuple[Any, ...]]:
    async with service.ctx.engine.connect() as conn:
        return [tuple(r) for r in await conn.execute(text(query))]


async def test_two_hours_are_stored_hourly_and_daily_and_a_replayed_hour_counts_once(
    telemetry: RunningService[Any],
) -> None:
    first = ledger()
    for reading, shares in readings(T0, 120):
        first.count(reading, shares, reading.at)
    async with uow(telemetry) as unit:
        await record_usage(unit, first.accountant.dirty())
        await unit.commit()

    hourly = "SELECT tenant, window_start, round(allocated_gpu_s::numeric, 3), round(used_gpu_s::numeric, 3), round(idle_gpu_s::numeric, 3), round(cost::numeric, 4) FROM telemetry.usage_hourly ORDER BY 1, 2"
    before = await stored(telemetry, hourly)
    assert [(r[0], r[1]) for r in before] == [
        ("team-a", T0),
        ("team-a", T0 + timedelta(hours=1)),
        ("team-b", T0),
        ("team-b", T0 + timedelta(hours=1)),
    ]
    a_first = before[0]
    assert float(a_first[2]) == pytest.approx(3600, abs=1) and float(a_first[3]) == pytest.approx(
        0.8 * 3600, abs=1
    )
    assert float(a_first[5]) == pytest.approx(4.0, abs=0.01)  # a whole GPU-hour at 4.0
    b_first = before[2]
    assert float(b_first[2]) == pytest.approx(1800, abs=1)  # half a GPU for an hour
    assert float(b_first[4]) == pytest.approx(1800, abs=1)  # idle from the start: the whole run counts
    daily = await stored(
        telemetry,
        "SELECT day, tenant, round(allocated_gpu_s::numeric) FROM telemetry.usage_daily ORDER BY 1, 2",
    )
    assert daily == [
        (T0.replace(hour=0), "team-a", 3600),
        (T0.replace(hour=0), "team-b", 1800),
        (T0.replace(hour=0) + timedelta(days=1), "team-a", 3600),
        (T0.replace(hour=0) + timedelta(days=1), "team-b", 1800),
    ]

    # a restart during the second hour, then the second hour's readings arrive again
    restarted = ledger()
    async with uow(telemetry) as unit:
        assert await restore_usage(unit, restarted, T0 + timedelta(hours=1, minutes=59), None) == 2
    for reading, shares in readings(T0 + timedelta(hours=1), 60):
        restarted.count(reading, shares, reading.at)
    for reading, shares in readings(T0, 60):  # and the first, closed hour too: late
        restarted.count(reading, shares, reading.at)
    assert restarted.accountant.stats.duplicates == 720 and restarted.accountant.stats.late == 720
    async with uow(telemetry) as unit:
        await record_usage(unit, list(restarted.accountant.rows.values()))
        await unit.commit()
    assert await stored(telemetry, hourly) == before

    async with uow(telemetry) as unit:
        by_tenant = await unit.usage.totals(GroupBy.TENANT, T0, T0 + timedelta(hours=2))
        by_job = await unit.usage.totals(GroupBy.JOB, T0, T0 + timedelta(hours=2), tenant="team-b")
    assert [t.group for t in by_tenant] == ["team-a", "team-b"]  # the most expensive first
    assert by_tenant[0].allocated_gpu_hours == pytest.approx(2.0, abs=0.01)
    assert by_tenant[1].idle_gpu_hours == pytest.approx(1.0, abs=0.01)
    assert [(j.group, j.tenant, j.queue) for j in by_job] == [("job-b", "team-b", "serving")]
    assert by_job[0].cost == pytest.approx(4.0, abs=0.01)  # 1 GPU-hour at 4.0


async def test_a_restart_after_the_open_hours_closed_rolls_them_into_their_days(
    telemetry: RunningService[Any],
) -> None:
    first = ledger()
    for reading, shares in readings(T0, 90):  # an hour and a half, flushed, then telemetry dies
        first.count(reading, shares, reading.at)
    await flush_usage(telemetry.ctx.uow, first, T0 + timedelta(minutes=90))
    daily = "SELECT day, tenant, round(allocated_gpu_s::numeric) FROM telemetry.usage_daily ORDER BY 1, 2"
    assert await stored(telemetry, daily) == [  # 23:00 had closed, midnight had not
        (T0.replace(hour=0), "team-a", 3600),
        (T0.replace(hour=0), "team-b", 1800),
    ]

    restarted = ledger()
    async with uow(telemetry) as unit:  # hours later: nothing is open any more
        assert await restore_usage(unit, restarted, T0 + timedelta(hours=6), None) == 0
    assert await stored(telemetry, daily) == [  # midnight's hour too, committed by the restore
        (T0.replace(hour=0), "team-a", 3600),
        (T0.replace(hour=0), "team-b", 1800),
        (T0.replace(hour=0) + timedelta(days=1), "team-a", 1800),
        (T0.replace(hour=0) + timedelta(days=1), "team-b", 900),
    ]


# ---- GET /v1/usage, scoped by admission's tokens --------------------------------------------------


@pytest.fixture
async def admission(nats_url: str, fresh_database: str, tmp_path: Path) -> AsyncIterator[ServiceProcess]:
    await asyncio.to_thread(migrate, "admission", fresh_database)
    process = ServiceProcess(
        "admission",
        {
            "TESSERA_NATS_URL": nats_url,
            "TESSERA_DATABASE_URL": fresh_database,
            "TESSERA_ADMISSION_AUTH": "required",
            "TESSERA_ADMISSION_ADMIN_TOKEN": ADMIN,
        },
        tmp_path,
    )
    process.start()
    try:
        await process.wait_ready()
        yield process
    finally:
        assert process.proc is not None
        process.proc.terminate()
        await process.wait_exit()


async def tokens_with_a_job(admission: ServiceProcess, tenants: list[str]) -> dict[str, str]:
    """A token per tenant from admission, and a job of the first tenant submitted with its token (a
    tenant token is scoped by its most recent job)."""
    async with httpx.AsyncClient(
        base_url=admission.url, headers={"Authorization": f"Bearer {ADMIN}"}
    ) as http:
        tokens = {t: (await http.post("/v1/tokens", json={"tenant": t})).json()["token"] for t in tenants}
    job = {
        "name": "train",
        "tenant": tenants[0],
        "pod_groups": [{"name": "w", "replicas": 1, "gpu": {"count": 1}}],
    }
    async with httpx.AsyncClient(
        base_url=admission.url, headers={"Authorization": f"Bearer {tokens[tenants[0]]}"}
    ) as http:
        assert (await http.post("/v1/jobs", json=job)).status_code < 300
    return tokens


async def usage_app(telemetry: RunningService[Any], admission: ServiceProcess) -> FastAPI:
    """Telemetry's usage routes, asking admission who a token may act for."""
    deps: Telemetry = await telemetry.definition.dependencies(telemetry.ctx)
    deps.tokens = TenantTokens(admission.url, "required", ADMIN)
    app = FastAPI()
    app.include_router(router)
    app.state.deps = deps
    return app


async def test_usage_is_scoped_to_the_tenant_of_the_token(
    telemetry: RunningService[Any], admission: ServiceProcess
) -> None:
    usage = ledger()
    for reading, shares in readings(T0, 60):
        usage.count(reading, shares, reading.at)
    async with uow(telemetry) as unit:
        await record_usage(unit, usage.accountant.dirty())
        await unit.commit()

    tokens = await tokens_with_a_job(admission, ["team-a", "team-b"])
    app = await usage_app(telemetry, admission)
    window = {"from": T0.isoformat(), "to": (T0 + timedelta(hours=1)).isoformat()}

    async def get(token: str | None, **params: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://telemetry"
        ) as http:
            return await http.get("/v1/usage", params={**window, **params}, headers=headers)

    def groups(response: httpx.Response) -> list[str]:
        assert response.status_code == 200, response.text
        return [r["group"] for r in response.json()["rows"]]

    assert (await get(None)).status_code == 401
    assert (await get("tsr_not-a-token")).status_code == 401
    assert groups(await get(ADMIN)) == ["team-a", "team-b"]
    assert groups(await get(ADMIN, tenant="team-b")) == ["team-b"]
    # team-a's token: its own tenant, found from its own jobs, and never another's
    assert groups(await get(tokens["team-a"])) == ["team-a"]
    assert groups(await get(tokens["team-a"], by="job")) == ["job-a"]
    assert (await get(tokens["team-a"], tenant="team-b")).status_code == 403
    # team-b's token: it has no jobs, so without naming itself it sees nothing; named, its own usage
    assert groups(await get(tokens["team-b"])) == []
    only_b = await get(tokens["team-b"], tenant="team-b")
    assert groups(only_b) == ["team-b"]
    assert only_b.json()["top_wasters"][0]["group"] == "job-b"  # idle all hour
    # from within the hour: that hour counts, and the answer says where the period began
    mid_hour = await get(ADMIN, **{"from": (T0 + timedelta(minutes=30)).isoformat()})
    assert groups(mid_hour) == ["team-a", "team-b"] and mid_hour.json()["from"] == T0.isoformat()
