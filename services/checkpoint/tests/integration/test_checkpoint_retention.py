"""Checkpoint on real NATS and Postgres: placements it recorded leave once older than its retention."""

from __future__ import annotations

import asyncio

import pytest

from tessera.checkpoint import bootstrap
from tessera.checkpoint.adapters import orm
from tessera.checkpoint.config import CheckpointSettings
from tessera.contracts.events import GangPlaced, PodPlacement
from tessera.core.db.migrations import migrate
from tessera.testing.recording import assert_observed_events_expire
from tessera.testing.services import reset_jetstream, running, settings_for

pytestmark = pytest.mark.integration


async def test_placements_older_than_the_retention_are_deleted(nats_url: str, fresh_database: str) -> None:
    await reset_jetstream(nats_url)
    await asyncio.to_thread(migrate, "checkpoint", fresh_database)
    settings = settings_for(CheckpointSettings, nats_url, fresh_database, observed_retention_h=48)

    def placed(job_id: str) -> GangPlaced:
        return GangPlaced(job_id=job_id, placements=[PodPlacement(pod=f"{job_id}-0", group="w", node="n0")])

    async with running(bootstrap.build(settings), settings) as service:
        await assert_observed_events_expire(
            service, nats_url, orm.observed_events, old=[placed("a"), placed("b")], new=[placed("c")]
        )
