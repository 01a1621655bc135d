"""The judged errors a restarted forecaster reads back: the newest, oldest first, with their origins."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from tessera.core.db.engine import async_url
from tessera.core.db.migrations import migrate
from tessera.forecaster.adapters.repository import SqlErrorRepository, SqlSeriesRepository
from tessera.forecaster.domain.series import SeriesKey

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


async def test_recent_errors_come_back_oldest_first_with_their_origins(fresh_database: str) -> None:
    await asyncio.to_thread(migrate, "forecaster", fresh_database)
    engine = create_async_engine(async_url(fresh_database))
    try:
        async with AsyncSession(engine) as session, session.begin():
            series = await SqlSeriesRepository(session).get_or_add(
                SeriesKey.of("requests_per_s", {"app": "chat"}), 60.0, "mean", None
            )
            errors = SqlErrorRepository(session)
            for i in (3, 0, 2, 1):  # stored out of order
                at = T0 + timedelta(minutes=i)
                await errors.add(series.id, at, "level", 10.0, 10.0 + i, float(i))
        async with AsyncSession(engine) as session:
            recent = await SqlErrorRepository(session).recent(series.id, 3)
        assert recent == [(T0 + timedelta(minutes=i), float(i)) for i in (1, 2, 3)]
    finally:
        await engine.dispose()
