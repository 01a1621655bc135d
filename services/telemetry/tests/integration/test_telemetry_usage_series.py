"""GET /v1/usage/series on real Postgres with a controlled clock: per tenant and hour the mean GPUs
allocated, used and idle, the busiest groups with the rest as `other`, the same sums as the rows in
memory give, and scoping by tokens that the real admission service issued and checks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import httpx
import pytest

from tessera.core.runner import RunningService
from tessera.telemetry.domain.attribution import Holder, split_reading
from tessera.telemetry.domain.directory import JobDirectory, PlacedPod
from tessera.telemetry.domain.model import Reading
from tessera.telemetry.domain.pricing import Flavor, PriceBook
from tessera.telemetry.domain.rightsizing import RightsizingTracker
from tessera.telemetry.domain.usage import Accountant
from tessera.telemetry.domain.usage_report import GroupBy
from tessera.telemetry.domain.usage_rows import AccountingPolicy
from tessera.telemetry.domain.usage_series import hour_sums
from tessera.telemetry.service_layer.usage import UsageLedger, record_usage
from tessera.testing.services import ServiceProcess

from .test_telemetry_usage import ADMIN, admission, telemetry, tokens_with_a_job, usage_app

pytestmark = pytest.mark.integration

__all__ = ["admission", "telemetry"]  # the fixtures, used by name

T0 = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)


def two_tenants() -> UsageLedger:
    """team-a holds a whole GPU at 80 % for two hours; team-b half a GPU at 1 % for the first hour."""
    directory = JobDirectory()
    directory.add_job("job-a", "team-a", "research")
    directory.add_job("job-b", "team-b", "serving")
    directory.place(
        [
            PlacedPod("pod-a", "job-a", "n0", {"GPU-0": 1000}),
            PlacedPod("pod-b", "job-b", "n0", {"GPU-1": 500}),
        ]
    )
    ledger = UsageLedger(
        Accountant(AccountingPolicy(interval_s=10, idle_window_s=600)),
        PriceBook((Flavor("a100", "A100-80GB", None, 4.0, 1.5),)),
        RightsizingTracker(),
        directory,
    )
    for i in range(2 * 360):
        at = T0 + timedelta(seconds=10 * i)
        busy = Reading("n0", 0, "GPU-0", at, 80.0, 40000, 300, 60, "A100-80GB", 81920)
        ledger.count(busy, split_reading(80.0, 40000, [Holder("ml", "pod-a", "main", "GPU-0", 1000)]), at)
        if i < 360:
            idle = Reading("n0", 1, "GPU-1", at, 1.0, 1000, 80, 35, "A100-80GB", 81920)
            ledger.count(idle, split_reading(1.0, 1000, [Holder("web", "pod-b", "main", "GPU-1", 500)]), at)
    return ledger


def points(series: dict[str, Any]) -> list[tuple[float, float, float]]:
    return [
        (round(p["allocated_gpus"], 2), round(p["used_gpus"], 2), round(p["idle_gpus"], 2))
        for p in series["points"]
    ]


async def test_the_series_per_tenant_and_hour_scoped_by_the_token(
    telemetry: RunningService[Any], admission: ServiceProcess
) -> None:
    ledger = two_tenants()
    rows = ledger.accountant.dirty()
    async with telemetry.ctx.uow() as unit:
        await record_usage(unit, rows)
        await unit.commit()
    async with telemetry.ctx.uow() as unit:  # the one query sums what the rows in memory sum
        stored = await unit.usage.hour_sums(GroupBy.TENANT, T0, T0 + timedelta(hours=3))
    expected = hour_sums(rows, GroupBy.TENANT)
    assert [(s.hour, s.group) for s in stored] == [(s.hour, s.group) for s in expected]
    assert [s.allocated_gpu_s for s in stored] == pytest.approx([s.allocated_gpu_s for s in expected])

    token_a = (await tokens_with_a_job(admission, ["team-a"]))["team-a"]
    app = await usage_app(telemetry, admission)
    # three hours, the first asked from half past: it starts on the hour; the third holds nothing
    window = {"from": (T0 + timedelta(minutes=30)).isoformat(), "to": (T0 + timedelta(hours=3)).isoformat()}

    async def get(token: str, **params: str) -> httpx.Response:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://telemetry"
        ) as http:
            return await http.get(
                "/v1/usage/series", params={**window, **params}, headers={"Authorization": f"Bearer {token}"}
            )

    everyone = await get(ADMIN)
    assert everyone.status_code == 200, everyone.text
    body = everyone.json()
    assert body["from"] == T0.isoformat() and body["currency"] == app.state.deps.currency
    a, b = body["series"]
    assert [p["hour"] for p in a["points"]] == [(T0 + timedelta(hours=h)).isoformat() for h in range(3)]
    assert (a["group"], b["group"]) == ("team-a", "team-b")  # the most allocated first
    assert points(a) == [(1.0, 0.8, 0.0), (1.0, 0.8, 0.0), (0.0, 0.0, 0.0)]
    assert points(b) == [(0.5, 0.01, 0.5), (0.0, 0.0, 0.0), (0.0, 0.0, 0.0)]  # idle all its hour
    assert a["allocated_gpu_hours"] == pytest.approx(2.0, abs=0.01)
    assert a["cost"] == pytest.approx(8.0, abs=0.02)  # two GPU-hours at 4.0

    # the same window written at +05:30 answers the same hours, on the stored rows' UTC grid
    india = timezone(timedelta(hours=5, minutes=30))
    shifted = {k: datetime.fromisoformat(v).astimezone(india).isoformat() for k, v in window.items()}
    offset = (await get(ADMIN, **shifted)).json()
    assert offset["from"] == T0.isoformat()
    assert [points(s) for s in offset["series"]] == [points(a), points(b)]

    top_one = (await get(ADMIN, top="1")).json()["series"]
    assert [s["group"] for s in top_one] == ["team-a", "other"]
    assert points(top_one[1]) == points(b)

    own = await get(token_a)  # team-a's token: only team-a, never team-b
    assert own.status_code == 200, own.text
    assert own.json()["tenant"] == "team-a"
    assert [s["group"] for s in own.json()["series"]] == ["team-a"]
    assert (await get(token_a, tenant="team-b")).status_code == 403

    backwards = await get(ADMIN, to=T0.isoformat())
    assert backwards.status_code == 422
    assert backwards.json()["detail"][0]["loc"] == ["query", "from"]
    assert (await get(ADMIN, top="0")).status_code == 422
    too_long = await get(ADMIN, **{"from": (T0 - timedelta(days=100)).isoformat()})
    assert too_long.status_code == 422 and "at most" in too_long.json()["detail"][0]["msg"]
