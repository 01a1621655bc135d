"""Telemetry's use cases through its unit of work, on in-memory repositories: what is stored, what is
announced, and what a restart restores."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from tessera.contracts.events import GpuIdle, GpuInventory, GpuUnhealthy, InventoryChanged, NodeInventory
from tessera.telemetry.domain.health import HealthPolicy
from tessera.telemetry.domain.idle import IdlePolicy
from tessera.telemetry.domain.model import Announcement, FindingKind, GpuFinding, Reading
from tessera.telemetry.domain.monitor import Monitor
from tessera.telemetry.domain.rollups import Rollup
from tessera.telemetry.service_layer.handlers import sync_inventory
from tessera.telemetry.service_layer.monitoring import record_observation, restore_findings
from tessera.telemetry.service_layer.unit_of_work import TelemetryUnitOfWork
from tessera.testing.fakes import FakeUnitOfWork

T0 = datetime(2026, 11, 23, 3, 0, tzinfo=UTC)
REPUBLISH = timedelta(minutes=10)


@dataclass
class StoredGpu:
    node: str
    index: int
    healthy: bool
    updated_at: datetime | None = None


@dataclass
class FakeInventory:
    gpus: dict[str, StoredGpu] = field(default_factory=dict)
    announcements: dict[str, Announcement] = field(default_factory=dict)

    async def last_announcement(self, source: str) -> Announcement | None:
        return self.announcements.get(source)

    async def replace_nodes(self, nodes: Sequence[NodeInventory]) -> None:
        names = {n.name for n in nodes}
        self.gpus = {uuid: gpu for uuid, gpu in self.gpus.items() if gpu.node not in names}
        self.gpus.update({g.uuid: StoredGpu(n.name, g.index, g.healthy) for n in nodes for g in n.gpus})

    async def record_announcement(self, source: str, announcement: Announcement) -> None:
        self.announcements[source] = announcement

    async def set_gpu_health(self, gpu_uuid: str, healthy: bool, at: datetime) -> None:
        if gpu_uuid in self.gpus:
            self.gpus[gpu_uuid] = replace(self.gpus[gpu_uuid], healthy=healthy, updated_at=at)


@dataclass
class FakeRollups:
    windows: dict[tuple[str, datetime], Rollup] = field(default_factory=dict)

    async def save(self, rollups: Sequence[Rollup]) -> None:
        self.windows.update({(r.gpu_uuid, r.window_start): r for r in rollups})


@dataclass
class FakeFindings:
    all: list[tuple[GpuFinding, datetime | None]] = field(default_factory=list)
    """Every finding with when it ended (None: still open)."""

    async def open(self, finding: GpuFinding) -> None:
        if not any(
            f.gpu_uuid == finding.gpu_uuid and f.kind == finding.kind for f in await self.open_findings()
        ):
            self.all.append((finding, None))

    async def end(self, kind: FindingKind, gpu_uuid: str, at: datetime) -> None:
        self.all = [
            (f, at if ended is None and (f.kind, f.gpu_uuid) == (kind, gpu_uuid) else ended)
            for f, ended in self.all
        ]

    async def open_findings(self) -> list[GpuFinding]:
        return [f for f, ended in self.all if ended is None]


@dataclass
class Store:
    inventory: FakeInventory = field(default_factory=FakeInventory)
    rollups: FakeRollups = field(default_factory=FakeRollups)
    findings: FakeFindings = field(default_factory=FakeFindings)


class FakeTelemetryUnitOfWork(FakeUnitOfWork, TelemetryUnitOfWork):
    """Each unit works on a copy of what was committed; a commit keeps the copy, anything else drops it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stored = self._working = Store()

    def open_repositories(self, session: object) -> None:
        self._working = copy.deepcopy(self.stored)
        self.inventory, self.rollups, self.findings = (
            self._working.inventory,
            self._working.rollups,
            self._working.findings,
        )

    async def commit(self) -> None:
        await super().commit()
        self.stored = self._working


def node(name: str, *uuids: str, unhealthy: frozenset[str] = frozenset()) -> NodeInventory:
    gpus = [
        GpuInventory(index=i, uuid=u, model="A100-80GB", memory_mib=81920, healthy=u not in unhealthy)
        for i, u in enumerate(uuids)
    ]
    return NodeInventory(name=name, cpu_milli=64000, memory_mib=524288, gpus=gpus)


async def sync(uow: FakeTelemetryUnitOfWork, nodes: list[NodeInventory], at: datetime) -> bool:
    async with uow:
        announced = await sync_inventory(uow, "telemetry/n", nodes, REPUBLISH, at)
        await uow.commit()
    return announced


# -- the inventory -------------------------------------------------------------------------------------
async def test_the_first_inventory_is_stored_and_announced() -> None:
    uow = FakeTelemetryUnitOfWork()
    nodes = [node("n0", "GPU-0", "GPU-1")]
    assert await sync(uow, nodes, T0)
    assert uow.events_of(InventoryChanged) == [InventoryChanged(source="telemetry/n", nodes=nodes)]
    assert {u: (g.node, g.index) for u, g in uow.stored.inventory.gpus.items()} == {
        "GPU-0": ("n0", 0),
        "GPU-1": ("n0", 1),
    }


async def test_an_unchanged_inventory_is_announced_again_only_once_the_republish_time_passed() -> None:
    uow = FakeTelemetryUnitOfWork()
    nodes = [node("n0", "GPU-0")]
    assert await sync(uow, nodes, T0)
    assert not await sync(uow, nodes, T0 + REPUBLISH - timedelta(seconds=1))
    assert len(uow.outbox) == 1
    assert await sync(uow, nodes, T0 + REPUBLISH)
    assert len(uow.events_of(InventoryChanged)) == 2
    assert uow.stored.inventory.announcements["telemetry/n"].at == T0 + REPUBLISH


async def test_a_changed_inventory_is_announced_at_once_and_replaces_only_the_gpus_of_its_nodes() -> None:
    uow = FakeTelemetryUnitOfWork()
    assert await sync(uow, [node("n0", "GPU-0", "GPU-1"), node("n1", "GPU-2")], T0)
    assert await sync(uow, [node("n0", "GPU-0", unhealthy=frozenset({"GPU-0"}))], T0 + timedelta(seconds=15))
    gpus = uow.stored.inventory.gpus
    assert {u: (g.node, g.healthy) for u, g in gpus.items()} == {
        "GPU-0": ("n0", False),
        "GPU-2": ("n1", True),
    }
    assert len(uow.events_of(InventoryChanged)) == 2


# -- what the monitor observed -------------------------------------------------------------------------
def reading(uuid: str, seconds: float, **overrides: Any) -> Reading:
    values: dict[str, Any] = {
        "node": "n0",
        "gpu_index": int(uuid.rsplit("-", 1)[1]),
        "utilization_pct": 60.0,
        "memory_used_mib": 2048,
        "power_w": 250.0,
        "temperature_c": 55.0,
        "pods": ("team-a/train-0",),
        **overrides,
    }
    return Reading(gpu_uuid=uuid, at=T0 + timedelta(seconds=seconds), **values)


def a_monitor() -> Monitor:
    return Monitor.with_policies(HealthPolicy(recover_after=1), IdlePolicy(idle_after_s=0))


async def observe(uow: FakeTelemetryUnitOfWork, monitor: Monitor, *readings: Reading) -> None:
    observation = monitor.observe(list(readings), max(r.at for r in readings))
    async with uow:
        await record_observation(uow, observation)
        await uow.commit()


async def test_rollups_are_saved_and_a_window_saved_again_replaces_it() -> None:
    uow, monitor = FakeTelemetryUnitOfWork(), a_monitor()
    await observe(
        uow, monitor, reading("GPU-0", 1, utilization_pct=20.0), reading("GPU-0", 4, utilization_pct=40.0)
    )
    await observe(uow, monitor, reading("GPU-0", 12))  # a reading in the next window closes the first
    (first,) = uow.stored.rollups.windows.values()
    assert (first.window_start, first.samples, first.utilization_mean_pct) == (T0, 2, 30.0)
    async with uow:
        await uow.rollups.save([replace(first, samples=3)])
        await uow.commit()
    assert [r.samples for r in uow.stored.rollups.windows.values()] == [3]


async def test_an_unhealthy_gpu_is_announced_with_its_finding_and_marked_in_the_inventory() -> None:
    uow, monitor = FakeTelemetryUnitOfWork(), a_monitor()
    await sync(uow, [node("n0", "GPU-0")], T0)
    await observe(uow, monitor, reading("GPU-0", 1, xid_errors=(79,)))
    await observe(uow, monitor, reading("GPU-0", 2, xid_errors=(79,)))  # the same fault again
    (event,) = uow.events_of(GpuUnhealthy)
    assert (event.gpu_uuid, event.faults, event.xid, event.at) == (
        "GPU-0",
        ["xid"],
        79,
        T0 + timedelta(seconds=1),
    )
    (finding,) = await uow.stored.findings.open_findings()
    assert (finding.kind, finding.since, finding.detail) == (
        FindingKind.UNHEALTHY,
        T0 + timedelta(seconds=1),
        event.model_dump(mode="json"),
    )
    assert uow.stored.inventory.gpus["GPU-0"].healthy is False


async def test_a_recovered_gpu_ends_its_finding_and_is_healthy_again_without_an_event() -> None:
    uow, monitor = (
        FakeTelemetryUnitOfWork(),
        Monitor.with_policies(HealthPolicy(recover_after=1, xid_hold_s=0), IdlePolicy()),
    )
    await sync(uow, [node("n0", "GPU-0")], T0)
    await observe(uow, monitor, reading("GPU-0", 1, ecc_uncorrected=1))
    published = len(uow.outbox)
    await observe(uow, monitor, reading("GPU-0", 2))
    assert len(uow.outbox) == published
    assert await uow.stored.findings.open_findings() == []
    assert uow.stored.findings.all[0][1] == T0 + timedelta(seconds=2)
    assert uow.stored.inventory.gpus["GPU-0"] == StoredGpu("n0", 0, True, T0 + timedelta(seconds=2))


async def test_an_idle_gpu_is_announced_with_who_holds_it_and_its_finding_ends_when_it_works() -> None:
    uow, monitor = FakeTelemetryUnitOfWork(), a_monitor()
    await observe(uow, monitor, reading("GPU-1", 1, utilization_pct=0.5, pods=("team-a/sleepy",)))
    (event,) = uow.events_of(GpuIdle)
    assert (event.gpu_uuid, event.pods, event.idle_since) == (
        "GPU-1",
        ["team-a/sleepy"],
        T0 + timedelta(seconds=1),
    )
    (finding,) = await uow.stored.findings.open_findings()
    assert (finding.kind, finding.pods) == (FindingKind.IDLE, ("team-a/sleepy",))
    await observe(uow, monitor, reading("GPU-1", 5, utilization_pct=90.0, pods=("team-a/sleepy",)))
    assert await uow.stored.findings.open_findings() == []
    assert len(uow.events_of(GpuIdle)) == 1


async def test_nothing_is_stored_or_published_when_the_unit_is_not_committed() -> None:
    uow, monitor = FakeTelemetryUnitOfWork(), a_monitor()
    async with uow:
        await record_observation(uow, monitor.observe([reading("GPU-0", 1, xid_errors=(79,))], T0))
    assert uow.outbox == [] and await uow.stored.findings.open_findings() == []


# -- a restart -----------------------------------------------------------------------------------------
async def test_findings_still_open_are_restored_so_a_restart_does_not_report_them_again() -> None:
    uow, before = FakeTelemetryUnitOfWork(), a_monitor()
    faulty, sleepy = reading("GPU-0", 1, xid_errors=(79,)), reading("GPU-1", 1, utilization_pct=0.0)
    await observe(uow, before, faulty, sleepy, reading("GPU-2", 1, ecc_uncorrected=1))
    await observe(uow, before, reading("GPU-2", 2))  # GPU-2 recovered: its finding ended
    published = list(uow.outbox)
    assert len(published) == 3

    after = a_monitor()
    async with uow:
        assert await restore_findings(uow, after) == 2
    assert after.health.unhealthy() == {"GPU-0"} and after.idle.idle() == {"GPU-1"}
    later = T0 + timedelta(seconds=20)
    await observe(uow, after, replace(faulty, at=later), replace(sleepy, at=later))
    assert uow.outbox == published
