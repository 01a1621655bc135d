"""Who reads what through `GET /v1/usage` and `GET /v1/usage/series`, with the tokens telemetry's settings
build (the shared `tessera.core.tenant_tokens` check) and an in-memory admission: 401 without a token or
with an unknown one, the admin every tenant or the one named, a tenant's token its own tenant only (403
for another's, no usage while it has no jobs), 503 while admission does not answer, only the admin
without an admission URL, everyone with auth disabled."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from types import SimpleNamespace, TracebackType
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr

from tessera.telemetry.config import TelemetrySettings
from tessera.telemetry.domain.usage_report import GroupBy, UsageTotal
from tessera.telemetry.domain.usage_series import HourSum
from tessera.telemetry.entrypoints.usage_api import router
from tessera.testing.fake_admission import FakeAdmission

ADMIN = "admin-secret-token"
HOUR = datetime(2026, 11, 20, 10, tzinfo=UTC)
WINDOW = {"from": HOUR.isoformat(), "to": HOUR.replace(hour=11).isoformat()}
TENANTS = ("team-a", "team-b")


class Usage:
    """Each tenant's usage, as the repository answers it, filtered by the tenant the route asks for."""

    def __init__(self) -> None:
        self.asked: list[str | None] = []

    async def totals(
        self, by: GroupBy, start: datetime, end: datetime, tenant: str | None
    ) -> list[UsageTotal]:
        self.asked.append(tenant)
        return [UsageTotal(t, 1.0, 0.5, 0.5, 8.0, 4.0, tenant=t) for t in TENANTS if tenant in (None, t)]

    async def hour_sums(
        self, by: GroupBy, start: datetime, end: datetime, tenant: str | None
    ) -> list[HourSum]:
        self.asked.append(tenant)
        return [HourSum(HOUR, t, 3600.0, 1800.0, 1800.0, 4.0) for t in TENANTS if tenant in (None, t)]


class UnitOfWork:
    def __init__(self, usage: Usage) -> None:
        self.usage = usage

    async def __aenter__(self) -> UnitOfWork:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


@pytest.fixture
def admission() -> FakeAdmission:
    # tok-a's tenant has a job, tok-b's none; issued-admin is an admin token admission issued
    return FakeAdmission(
        tokens={"tok-a": "team-a", "tok-b": "team-b", "issued-admin": None}, jobs={"job-a": "team-a"}
    )


def client(
    usage: Usage, transport: httpx.AsyncBaseTransport | None = None, **settings: Any
) -> Callable[..., Any]:
    """A GET of telemetry's usage routes, its tokens built from `settings` as bootstrap builds them."""
    tokens = TelemetrySettings(**settings).tokens()
    tokens.transport = transport
    app = FastAPI()
    app.include_router(router)
    app.state.deps = SimpleNamespace(tokens=tokens, uow=lambda: UnitOfWork(usage), currency="USD")

    async def get(token: str | None, path: str = "/v1/usage", **params: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
            return await http.get(path, params={**WINDOW, **params}, headers=headers)

    return get


def groups(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    body = response.json()
    return [r["group"] for r in body.get("rows", body.get("series", []))]


async def test_tokens_are_checked_with_admission(admission: FakeAdmission) -> None:
    usage = Usage()
    get = client(
        usage,
        admission.transport(),
        admission_url="http://admission",
        admin_token=SecretStr(ADMIN),
    )
    assert (await get(None)).status_code == 401
    assert (await get("tsr_not-a-token")).status_code == 401
    assert groups(await get(ADMIN)) == ["team-a", "team-b"]
    assert groups(await get(ADMIN, tenant="team-b")) == ["team-b"]
    assert groups(await get("issued-admin")) == ["team-a", "team-b"]
    assert groups(await get("tok-a")) == ["team-a"]
    assert (await get("tok-a")).json()["tenant"] == "team-a"
    assert (await get("tok-a", tenant="team-b")).status_code == 403
    assert groups(await get("tok-a", "/v1/usage/series")) == ["team-a"]
    assert (await get("tok-a", "/v1/usage/series", tenant="team-b")).status_code == 403
    # a tenant's token without jobs: no tenant is known, so no usage is read at all; named, its own
    asked = len(usage.asked)
    nothing = await get("tok-b")
    assert groups(nothing) == [] and nothing.json()["tenant"] is None and len(usage.asked) == asked
    assert groups(await get("tok-b", tenant="team-b")) == ["team-b"]


async def test_an_admission_that_does_not_answer_is_503() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    get = client(
        Usage(), httpx.MockTransport(down), admission_url="http://admission", admin_token=SecretStr(ADMIN)
    )
    assert (await get("tok-a")).status_code == 503
    assert groups(await get(ADMIN)) == ["team-a", "team-b"]  # the admin token is not asked about


async def test_without_an_admission_url_only_the_admin_token_reads() -> None:
    get = client(Usage(), admin_token=SecretStr(ADMIN))
    refused = await get("tok-a")
    assert refused.status_code == 403 and "admin token" in refused.json()["detail"]
    assert groups(await get(ADMIN)) == ["team-a", "team-b"]
    assert (await client(Usage())(ADMIN)).status_code == 403  # no admin token configured either


async def test_with_auth_disabled_everyone_reads_every_tenant_or_the_one_named() -> None:
    get = client(Usage(), auth="disabled")
    assert groups(await get(None)) == ["team-a", "team-b"]
    assert groups(await get(None, tenant="team-a")) == ["team-a"]
    assert groups(await get(None, "/v1/usage/series", tenant="team-b")) == ["team-b"]
