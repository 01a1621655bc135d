"""The scheduler's repository on real Postgres: the shapes of the latest GPU placements, which the
fragmentation score learns its typical workload from."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from tessera.core.db.engine import async_url
from tessera.core.db.migrations import migrate
from tessera.scheduler.adapters.repository import PlacementRow, SchedulerRepository
from tessera.scheduler.domain.placement import OPENB_TYPICAL_WORKLOAD, PodShape
from tessera.scheduler.service_layer.rebuild import learn_typical_workload

pytestmark = pytest.mark.integration


@pytest.fixture
async def sessions(fresh_database: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    await asyncio.to_thread(migrate, "scheduler", fresh_database)
    engine = create_async_engine(async_url(fresh_database))
    try:
        yield async_sessionmaker(engine, expire_on_commit=False)
    finally:
        await engine.dispose()


def row(job: str, pod: str, gpus: tuple[tuple[int, int], ...], cpu_milli: int = 4_000) -> PlacementRow:
    return PlacementRow(job, pod, "workers", "gpu-0", gpus, cpu_milli, 16_384)


async def test_recent_gpu_shapes_are_the_latest_gpu_placements_newest_first(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    async with sessions() as session, session.begin():
        await SchedulerRepository(session).record_placements(
            [
                row("job-a", "default/a-0", ((0, 1000), (1, 1000))),
                row("job-a", "default/a-1", ((2, 1000), (3, 1000))),
                row("job-a", "default/a-cpu", (), cpu_milli=500),  # CPU only (or MIG): no GPU milli
            ]
        )
    async with sessions() as session, session.begin():
        await SchedulerRepository(session).record_placements([row("job-b", "default/b-0", ((4, 250),))])

    async with sessions() as session, session.begin():
        repo = SchedulerRepository(session)
        latest = await repo.recent_gpu_shapes(10)
        only_newest = await repo.recent_gpu_shapes(1)
        learnt = await learn_typical_workload(repo)

    pair = PodShape(4_000, 16_384, 2, 1000)
    assert latest == [PodShape(4_000, 16_384, 1, 250), pair, pair]
    assert only_newest == [PodShape(4_000, 16_384, 1, 250)]
    assert learnt == OPENB_TYPICAL_WORKLOAD, "three GPU pods are too few: the cold-start workload stays"
