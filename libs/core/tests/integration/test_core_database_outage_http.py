"""With its PostgreSQL down, a service's API answers JSON 503 with Retry-After (not a plain-text 500),
its readiness fails, and both come back by themselves when the server does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Request
from sqlalchemy import MetaData, text

from tessera.core.db.messaging_tables import add_messaging_tables
from tessera.core.runner import ServiceDefinition, context_only, create_app
from tessera.core.settings import ServiceSettings
from tessera.testing.restartable_postgres import RestartablePostgres
from tessera.testing.services import eventually, settings_for

pytestmark = pytest.mark.integration

outbox, inbox = add_messaging_tables(MetaData(schema="outage_http"))
router = APIRouter()


@router.get("/v1/now")
async def now(request: Request) -> dict[str, str]:
    async with request.app.state.ctx.engine.connect() as conn:
        return {"now": str((await conn.execute(text("SELECT now()"))).scalar_one())}


@asynccontextmanager
async def serving(database_url: str, nats_url: str) -> AsyncIterator[httpx.AsyncClient]:
    definition: ServiceDefinition[object] = ServiceDefinition(
        name="admission",
        outbox=outbox,
        inbox=inbox,
        dependencies=context_only,
        routers=[router],
    )
    app: FastAPI = create_app(definition, settings_for(ServiceSettings, nats_url, database_url))
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://svc") as client,
    ):
        yield client


async def test_postgres_down_is_a_json_503_with_retry_after_until_it_returns(
    restartable_postgres: RestartablePostgres, nats_url: str
) -> None:
    async with serving(restartable_postgres.url, nats_url) as client:
        assert (await client.get("/v1/now")).status_code == 200

        restartable_postgres.kill()
        down = await client.get("/v1/now")
        assert down.status_code == 503, down.text
        assert down.headers["content-type"] == "application/json"
        assert down.json() == {"code": "unavailable", "message": "the database is unavailable; retry shortly"}
        assert int(down.headers["Retry-After"]) > 0
        ready = await client.get("/readyz")
        assert ready.status_code == 503 and "database" in ready.json()["problems"]

        restartable_postgres.start()
        back = await eventually(lambda: _ok(client), timeout=30)
        assert back
        assert (await client.get("/readyz")).status_code == 200


async def _ok(client: httpx.AsyncClient) -> bool:
    return (await client.get("/v1/now")).status_code == 200
