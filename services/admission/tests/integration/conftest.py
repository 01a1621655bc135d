"""Admission on real Postgres and NATS: a migrated fresh database, an empty JetStream, and the
service's whole FastAPI app (lifespan included) behind an httpx client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tessera.admission.bootstrap import build
from tessera.admission.config import AdmissionSettings
from tessera.core.db.engine import async_url
from tessera.core.db.migrations import migrate
from tessera.core.runner import ServiceContext, create_app
from tessera.testing.services import reset_jetstream, settings_for


@pytest.fixture
async def admission_db(nats_url: str, fresh_database: str) -> AsyncIterator[tuple[str, str]]:
    await reset_jetstream(nats_url)
    await asyncio.to_thread(migrate, "admission", fresh_database)
    yield nats_url, fresh_database


@dataclass
class Api:
    client: httpx.AsyncClient
    ctx: ServiceContext
    db: str

    async def scalar(self, query: str, **params: Any) -> Any:
        return await scalar(self.db, query, **params)


async def scalar(db: str, query: str, **params: Any) -> Any:
    engine = create_async_engine(async_url(db))
    try:
        async with engine.connect() as conn:
            return (await conn.execute(text(query), params)).scalar_one()
    finally:
        await engine.dispose()


async def start_api(nats_url: str, db: str, **overrides: Any) -> AsyncIterator[Api]:
    settings = settings_for(AdmissionSettings, nats_url, db, cycle_interval_s=0.05, **overrides)
    app = create_app(build(settings), settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://admission") as client:
            yield Api(client, app.state.ctx, db)


@pytest.fixture
async def api(admission_db: tuple[str, str]) -> AsyncIterator[Api]:
    async for a in start_api(*admission_db, auth="disabled"):
        yield a


@pytest.fixture
async def secured_api(admission_db: tuple[str, str]) -> AsyncIterator[Api]:
    async for a in start_api(*admission_db, auth="required", admin_token="admin-secret"):
        yield a
