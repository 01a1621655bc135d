"""Slicing on real NATS and Postgres: events of both its consumers leave once older than its retention."""

from __future__ import annotations

import asyncio

import pytest

from tessera.contracts.events import DemandChanged, GpuDemand, InventoryChanged, NodeInventory
from tessera.core.db.migrations import migrate
from tessera.slicing import bootstrap
from tessera.slicing.adapters import orm
from tessera.slicing.config import SlicingSettings
from tessera.testing.recording import assert_observed_events_expire
from tessera.testing.services import reset_jetstream, running, settings_for

pytestmark = pytest.mark.integration


async def test_scheduler_events_and_inventory_are_kept_for_the_retention_only(
    nats_url: str, fresh_database: str
) -> None:
    await reset_jetstream(nats_url)
    await asyncio.to_thread(migrate, "slicing", fresh_database)
    settings = settings_for(SlicingSettings, nats_url, fresh_database)
    empty_node = NodeInventory(name="gpu-node-0", cpu_milli=1000, memory_mib=1024, gpus=[])
    async with running(bootstrap.build(settings), settings) as service:
        await assert_observed_events_expire(
            service,
            nats_url,
            orm.observed_events,
            old=[
                DemandChanged(pending_gangs=1, demand=[GpuDemand(gpus=1, milli=1000, pods=2)]),
                InventoryChanged(source="telemetry", nodes=[empty_node]),
            ],
            new=[DemandChanged(pending_gangs=0)],
        )
