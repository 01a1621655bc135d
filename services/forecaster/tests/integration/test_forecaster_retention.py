"""The forecaster on real NATS and Postgres: samples it recorded leave once older than its retention."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from tessera.contracts.events import GpuSample
from tessera.core.db.migrations import migrate
from tessera.forecaster import bootstrap
from tessera.forecaster.adapters import orm
from tessera.forecaster.config import ForecasterSettings
from tessera.testing.recording import assert_observed_events_expire
from tessera.testing.services import reset_jetstream, running, settings_for

pytestmark = pytest.mark.integration


def sample(node: str, utilization_pct: float) -> GpuSample:
    return GpuSample(
        node=node,
        gpu_index=0,
        gpu_uuid=f"GPU-{node}",
        at=datetime.now(UTC),
        utilization_pct=utilization_pct,
        memory_used_mib=1024,
        power_w=120.0,
        temperature_c=50.0,
    )


async def test_samples_older_than_the_retention_are_deleted_and_newer_ones_kept(
    nats_url: str, fresh_database: str
) -> None:
    await reset_jetstream(nats_url)
    await asyncio.to_thread(migrate, "forecaster", fresh_database)
    settings = settings_for(ForecasterSettings, nats_url, fresh_database, observed_retention_h=6)
    async with running(bootstrap.build(settings), settings) as service:
        await assert_observed_events_expire(
            service,
            nats_url,
            orm.observed_events,
            old=[sample("gpu-node-0", 10.0), sample("gpu-node-1", 20.0)],
            new=[sample("gpu-node-0", 30.0)],
        )
