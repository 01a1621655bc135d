"""Telemetry's repositories on real Postgres, through its unit of work: the inventory and its
announcements, findings opened once and ended, rollups replaced by window and deleted by retention."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from tessera.contracts.events import GpuInventory, NodeInventory
from tessera.core.db.migrations import migrate
from tessera.core.runner import RunningService, start_context
from tessera.telemetry import bootstrap
from tessera.telemetry.config import TelemetrySettings
from tessera.telemetry.domain.health import HealthPolicy
from tessera.telemetry.domain.idle import IdlePolicy
from tessera.telemetry.domain.model import Reading
from tessera.telemetry.domain.monitor import Monitor, Observation
from tessera.telemetry.domain.rollups import Rollup, window_start
from tessera.telemetry.service_layer.handlers import sync_inventory
from tessera.telemetry.service_layer.monitoring import record_observation, restore_findings
from tessera.telemetry.service_layer.unit_of_work import TelemetryUnitOfWork
from tessera.testing.services import settings_for

pytestmark = pytest.mark.integration

NOW = window_start(datetime.now(UTC))


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
    """The service connected but not started, so nothing but the test writes."""
    await asyncio.to_thread(migrate, "telemetry", fresh_database)
    settings = settings_for(TelemetrySettings, nats_url, fresh_database, rollup_retention_h=24)
    definition = bootstrap.build(settings, source=NoGpus())
    service = RunningService(definition, await start_context(definition, settings))
    try:
        yield service
    finally:
        await service.stop()


async def rows(service: RunningService[Any], query: str) -> list[tuple[Any, ...]]:
    async with service.ctx.engine.connect() as conn:
        return [tuple(row) for row in await conn.execute(text(query))]


def uow(service: RunningService[Any]) -> TelemetryUnitOfWork:
    unit: TelemetryUnitOfWork = service.ctx.uow()
    return unit


async def test_the_inventory_is_stored_and_announced_when_changed_or_due(
    telemetry: RunningService[Any],
) -> None:
    gpus = [GpuInventory(index=i, uuid=f"GPU-{i}", model="T4", memory_mib=15360) for i in range(2)]
    node = NodeInventory(name="n0", cpu_milli=1000, memory_mib=1024, gpus=gpus)
    republish = timedelta(minutes=10)
    answers = []
    for nodes, at in (
        ([node], NOW),
        ([node], NOW + timedelta(minutes=1)),
        ([node.model_copy(update={"gpus": gpus[:1]})], NOW + timedelta(minutes=2)),
        ([node.model_copy(update={"gpus": gpus[:1]})], NOW + timedelta(minutes=12)),
    ):
        async with uow(telemetry) as unit:
            answers.append(await sync_inventory(unit, "telemetry/n0", nodes, republish, at))
            await unit.commit()
    assert answers == [True, False, True, True]
    assert await rows(telemetry, "SELECT node, gpu_index, uuid FROM telemetry.gpus") == [("n0", 0, "GPU-0")]
    assert await rows(telemetry, "SELECT published_at FROM telemetry.published_inventory") == [
        (NOW + timedelta(minutes=12),)
    ]
    assert await rows(telemetry, "SELECT count(*) FROM telemetry.outbox") == [(3,)]


async def test_findings_open_once_end_and_come_back_after_a_restart(telemetry: RunningService[Any]) -> None:
    node = NodeInventory(
        name="n0",
        cpu_milli=1000,
        memory_mib=1024,
        gpus=[GpuInventory(index=i, uuid=f"GPU-{i}", model="T4", memory_mib=15360) for i in range(2)],
    )
    async with uow(telemetry) as unit:
        await sync_inventory(unit, "telemetry/n0", [node], timedelta(minutes=10), NOW)
        await unit.commit()
    monitor = Monitor.with_policies(HealthPolicy(recover_after=1, xid_hold_s=0), IdlePolicy(idle_after_s=0))

    def read(index: int, seconds: float, **values: Any) -> Reading:
        base: dict[str, Any] = {
            "utilization_pct": 50.0,
            "memory_used_mib": 1,
            "power_w": 1.0,
            "temperature_c": 40.0,
        }
        return Reading("n0", index, f"GPU-{index}", NOW + timedelta(seconds=seconds), **{**base, **values})

    for readings in (
        [read(0, 1, xid_errors=(79,)), read(1, 1, utilization_pct=0.0, pods=("team-a/sleepy",))],
        [read(0, 2)],  # recovered
        [read(0, 3, ecc_uncorrected=1)],  # unhealthy again: a second finding
    ):
        async with uow(telemetry) as unit:
            await record_observation(unit, monitor.observe(readings, readings[0].at))
            await unit.commit()
    findings = await rows(
        telemetry, "SELECT gpu_uuid, kind, ended_at IS NULL FROM telemetry.gpu_findings ORDER BY id"
    )
    assert findings == [("GPU-0", "unhealthy", False), ("GPU-1", "idle", True), ("GPU-0", "unhealthy", True)]
    assert await rows(telemetry, "SELECT uuid, healthy FROM telemetry.gpus ORDER BY uuid") == [
        ("GPU-0", False),
        ("GPU-1", True),
    ]

    restarted = Monitor.with_policies(HealthPolicy(), IdlePolicy(idle_after_s=0))
    async with uow(telemetry) as unit:
        assert await restore_findings(unit, restarted) == 2
    assert restarted.health.unhealthy() == {"GPU-0"} and restarted.idle.idle() == {"GPU-1"}
    again = restarted.observe([read(1, 10, utilization_pct=0.0, pods=("team-a/sleepy",))], NOW)
    assert again.idle == []  # the same pods hold it: still the finding restored, not a new one


def rollup(start: datetime, samples: int) -> Rollup:
    return Rollup("GPU-0", "n0", 0, start, samples, 50.0, 60.0, 1.0, 1, 1.0, 1.0, 40.0, 41.0)


async def test_rollups_are_replaced_by_window_and_deleted_past_the_retention_with_the_inbox(
    telemetry: RunningService[Any],
) -> None:
    old, recent = NOW - timedelta(hours=3), NOW - timedelta(hours=1)
    async with uow(telemetry) as unit:
        await record_observation(unit, Observation(rollups=[rollup(old, 1), rollup(recent, 1)]))
        await unit.seen("telemetry-test", "message-1")
        await unit.commit()
    async with uow(telemetry) as unit:
        await record_observation(unit, Observation(rollups=[rollup(recent, 7)]))
        await unit.commit()
    assert await rows(telemetry, "SELECT window_start, samples FROM telemetry.gpu_rollups ORDER BY 1") == [
        (old, 1),
        (recent, 7),
    ]

    telemetry.clock = lambda: NOW + timedelta(hours=22)  # 24 hours after a moment between the two
    deleted = await telemetry.purge()
    assert {table: n for table, n in deleted.items() if n} == {
        "telemetry.inbox": 1,
        "telemetry.gpu_rollups": 1,
    }
    assert await rows(telemetry, "SELECT window_start FROM telemetry.gpu_rollups") == [(recent,)]


async def test_a_window_without_a_known_utilisation_is_stored_with_a_null_mean_and_max(
    telemetry: RunningService[Any],
) -> None:
    unknown = replace(rollup(NOW, 2), utilization_mean_pct=None, utilization_max_pct=None)
    async with uow(telemetry) as unit:
        await record_observation(unit, Observation(rollups=[unknown]))
        await unit.commit()
    query = (
        "SELECT samples, utilization_mean_pct, utilization_max_pct, power_mean_w FROM telemetry.gpu_rollups"
    )
    assert await rows(telemetry, query) == [(2, None, None, 1.0)]
