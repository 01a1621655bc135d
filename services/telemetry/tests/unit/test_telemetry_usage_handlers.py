"""Usage's handlers and use cases on in-memory repositories: the job directory from admission's and the
scheduler's events, rows stored and days rebuilt, rightsizing findings published once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tessera.contracts.events import (
    GangFinished,
    GangPlaced,
    GpuAssignment,
    JobAccepted,
    PodPlacement,
    PodsEvicted,
    RightsizingRecommended,
)
from tessera.telemetry.domain.attribution import Holder, split_reading
from tessera.telemetry.domain.directory import JobDirectory, PlacedPod
from tessera.telemetry.domain.model import Reading
from tessera.telemetry.domain.pricing import PriceBook
from tessera.telemetry.domain.rightsizing import FindingKind, Recommendation, RightsizingTracker
from tessera.telemetry.domain.usage import Accountant
from tessera.telemetry.domain.usage_report import GroupBy, UsageTotal, totals
from tessera.telemetry.domain.usage_rows import UsageRow
from tessera.telemetry.entrypoints.metrics import usage_metrics
from tessera.telemetry.service_layer.unit_of_work import TelemetryUnitOfWork
from tessera.telemetry.service_layer.usage import (
    UsageLedger,
    days_of,
    flush_usage,
    on_gang_placed,
    on_job_announced,
    on_pods_released,
    record_recommendations,
    record_usage,
)
from tessera.testing.builders import an_envelope
from tessera.testing.fakes import FakeUnitOfWork

T0 = datetime(2026, 11, 23, 23, 30, tzinfo=UTC)


@dataclass
class FakeDirectory:
    jobs: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    placed: dict[tuple[str, str], tuple[PlacedPod, datetime | None]] = field(default_factory=dict)

    async def upsert_job(self, job_id: str, name: str, tenant: str, queue: str, at: datetime) -> None:
        self.jobs[job_id] = (name, tenant, queue)

    async def place(self, pods: Sequence[PlacedPod], at: datetime) -> None:
        self.placed.update({p.key: (p, None) for p in pods})

    async def end_pods(self, job_id: str, pods: Sequence[str] | None, at: datetime) -> None:
        for key, (p, ended) in list(self.placed.items()):
            if p.job_id == job_id and ended is None and (pods is None or p.pod in pods):
                self.placed[key] = (p, at)

    async def load(self) -> JobDirectory:
        directory = JobDirectory()
        for job_id, (_, tenant, queue) in self.jobs.items():
            directory.add_job(job_id, tenant, queue)
        directory.place(p for p, ended in self.placed.values() if ended is None)
        return directory


@dataclass
class FakeUsage:
    rows: dict[Any, UsageRow] = field(default_factory=dict)
    days: list[datetime] = field(default_factory=list)

    async def save(self, rows: Sequence[UsageRow]) -> None:
        self.rows.update({r.key: r for r in rows})

    async def rows_since(self, since: datetime, nodes: Sequence[str] | None = None) -> list[UsageRow]:
        return [r for r in self.rows.values() if r.key.window_start >= since]

    async def latest_hour(self, before: datetime, nodes: Sequence[str] | None = None) -> datetime | None:
        return max((k.window_start for k in self.rows if k.window_start < before), default=None)

    async def rollup_days(self, days: Sequence[datetime]) -> None:
        self.days.extend(days)

    async def totals(
        self, by: GroupBy, start: datetime, end: datetime, tenant: str | None = None
    ) -> list[UsageTotal]:
        return totals((r for r in self.rows.values() if tenant in (None, r.tenant)), by)


@dataclass
class FakeRightsizing:
    open_: dict[tuple[str, str, str, str, str], tuple[str, datetime | None]] = field(default_factory=dict)

    async def open(
        self, job_id: str, tenant: str, recommendation: Recommendation, detail: dict[str, object]
    ) -> bool:
        r = recommendation
        key = (r.gpu_uuid, r.namespace, r.pod, r.container, r.kind.value)
        if key in self.open_ and self.open_[key][1] is None:
            return False
        self.open_[key] = (job_id, None)
        return True

    async def open_findings(self) -> list[tuple[str, str, str, str, str]]:
        return [k for k, (_, ended) in self.open_.items() if ended is None]

    async def end_for_pods(self, job_id: str, pods: Sequence[str], at: datetime) -> None:
        for key, (job, ended) in list(self.open_.items()):
            if key[2] in pods and job in (job_id, "unknown") and ended is None:
                self.open_[key] = (job, at)


class FakeUsageUnitOfWork(FakeUnitOfWork, TelemetryUnitOfWork):
    def __init__(self) -> None:
        super().__init__()
        self.directory_store = FakeDirectory()
        self.usage_store = FakeUsage()
        self.rightsizing_store = FakeRightsizing()

    def open_repositories(self, session: object) -> None:
        self.directory = self.directory_store
        self.usage = self.usage_store
        self.rightsizing = self.rightsizing_store


def a_ledger() -> UsageLedger:
    return UsageLedger(Accountant(), PriceBook(), RightsizingTracker())


async def handle(handler: Any, uow: FakeUsageUnitOfWork, message: Any) -> None:
    async with uow:
        await handler(an_envelope(message), uow)
        await uow.commit()


async def test_jobs_and_placements_name_what_a_pod_is_billed_to_and_the_share_it_was_given() -> None:
    uow, ledger = FakeUsageUnitOfWork(), a_ledger()
    await handle(
        on_job_announced(ledger),
        uow,
        JobAccepted(job_id="j1", name="train", tenant="team-a", queue="research"),
    )
    placed = GangPlaced(
        job_id="j1",
        placements=[
            PodPlacement(
                pod="train-0",
                namespace="ml",
                group="w",
                node="n0",
                gpus=[GpuAssignment(index=0, uuid="GPU-0", milli=250)],
            )
        ],
    )
    await handle(on_gang_placed(ledger), uow, placed)
    ref = ledger.directory.job_of("ml", "train-0")
    assert ref is not None and (ref.job_id, ref.tenant, ref.queue) == ("j1", "team-a", "research")
    assert ledger.directory.placed_milli("ml", "train-0", "GPU-0") == 250
    assert ledger.directory.job_of("other", "train-0") is None
    assert uow.directory_store.jobs == {"j1": ("train", "team-a", "research")}
    restored = await uow.directory_store.load()  # what a restart would load
    assert restored.refs() == ledger.directory.refs()

    await handle(
        on_pods_released(ledger),
        uow,
        GangFinished(job_id="j1", succeeded=True, pods={"train-0": "Succeeded"}),
    )
    assert ledger.directory.job_of("ml", "train-0") is None
    assert (await uow.directory_store.load()).pods == {}


async def test_evicted_pods_end_and_their_open_findings_with_them() -> None:
    uow, ledger = FakeUsageUnitOfWork(), a_ledger()
    ledger.directory.place(
        [
            PlacedPod("p-0", "j2", "n0", {"GPU-0": 1000}, "ns"),
            PlacedPod("p-1", "j2", "n0", {"GPU-1": 1000}, "ns"),
        ]
    )
    await uow.directory_store.place(list(ledger.directory.pods.values()), T0)
    rec = Recommendation(
        FindingKind.FITS_SMALLER_SHARE,
        "n0",
        "GPU-0",
        "A100-80GB",
        "ns",
        "p-0",
        "main",
        T0,
        T0,
        40,
        1000,
        10.0,
        2048,
        150,
        "1g.10gb",
    )
    async with uow:
        await record_recommendations(uow, [rec], ledger.directory)
        await uow.commit()
    await handle(on_pods_released(ledger), uow, PodsEvicted(job_id="j2", pods=["ns/p-0"], reason="node_lost"))
    assert set(ledger.directory.pods) == {("ns", "p-1")}
    assert uow.rightsizing_store.open_ and all(
        ended is not None for _, ended in uow.rightsizing_store.open_.values()
    )


async def test_a_recommendation_is_published_once_with_the_job_it_belongs_to() -> None:
    uow, ledger = FakeUsageUnitOfWork(), a_ledger()
    ledger.directory.add_job("j3", "team-b", "serving")
    ledger.directory.place([PlacedPod("web-0", "j3", "n0", {"GPU-0": 1000}, "ns")])
    rec = Recommendation(
        FindingKind.WHOLE_GPU_UNDERUSED,
        "n0",
        "GPU-0",
        "A100-80GB",
        "ns",
        "web-0",
        "main",
        T0,
        T0 + timedelta(hours=4),
        1440,
        1000,
        3.0,
        1024,
        50,
        "1g.10gb",
    )
    for _ in range(2):
        async with uow:
            await record_recommendations(uow, [rec], ledger.directory)
            await uow.commit()
    (event,) = uow.events_of(RightsizingRecommended)
    assert (event.kind, event.job_id, event.tenant, event.queue) == (
        "whole_gpu_underused",
        "j3",
        "team-b",
        "serving",
    )
    assert (event.recommended_milli, event.recommended_mig_profile, event.saving_gpu_hours_per_day) == (
        50,
        "1g.10gb",
        22.8,
    )


async def test_rows_are_stored_and_the_days_they_touch_rebuilt() -> None:
    uow, ledger = FakeUsageUnitOfWork(), a_ledger()
    for i in range(360):  # an hour that straddles midnight
        at = T0 + timedelta(seconds=10 * i)
        reading = Reading("n0", 0, "GPU-0", at, 50.0, 1000, 100, 40, "A100-80GB", 81920)
        ledger.count(reading, split_reading(50.0, 1000, [Holder("ns", "p", "main", "GPU-0")]), None)
    rows = ledger.accountant.dirty()
    assert days_of(rows) == [T0.replace(hour=0, minute=0), T0.replace(hour=0, minute=0) + timedelta(days=1)]
    async with uow:
        await record_usage(uow, rows)
        await uow.commit()
    assert len(uow.usage_store.rows) == 2 and len(uow.usage_store.days) == 2
    assert sum(r.allocated_gpu_s for r in uow.usage_store.rows.values()) == 3600


class FailingUsage(FakeUsage):
    async def save(self, rows: Sequence[UsageRow]) -> None:
        raise ConnectionError("database down")


async def test_a_failed_flush_keeps_the_rows_for_the_next_one() -> None:
    ledger = a_ledger()
    for i in range(6):
        reading = Reading(
            "n0", 0, "GPU-0", T0 + timedelta(seconds=10 * i), 50.0, 1000, 100, 40, "A100-80GB", 81920
        )
        ledger.count(reading, split_reading(50.0, 1000, [Holder("ns", "p", "main", "GPU-0")]), None)
    down = FakeUsageUnitOfWork()
    down.usage_store = FailingUsage()
    try:
        await flush_usage(lambda: down, ledger, T0 + timedelta(minutes=1))
    except ConnectionError:
        pass
    else:
        raise AssertionError("the flush's error was swallowed")
    up = FakeUsageUnitOfWork()
    flushed = await flush_usage(lambda: up, ledger, T0 + timedelta(minutes=2))
    assert flushed.rows == 1 and len(up.usage_store.rows) == 1
    assert sum(r.allocated_gpu_s for r in up.usage_store.rows.values()) == 60
    assert (await flush_usage(lambda: up, ledger, T0 + timedelta(minutes=3))).rows == 0


def llama(job_id: str, namespace: str, uuid: str) -> GangPlaced:
    gpus = [GpuAssignment(index=0, uuid=uuid, milli=1000)]
    return GangPlaced(
        job_id=job_id,
        placements=[PodPlacement(pod="llama-0", namespace=namespace, group="w", node="n0", gpus=gpus)],
    )


def count_llamas(ledger: UsageLedger, start: datetime, n: int) -> None:
    """`n` readings of each tenant's `llama-0` (team-a's on GPU-a, team-b's on GPU-b)."""
    for i in range(n):
        at = start + timedelta(seconds=10 * i)
        for namespace, uuid in (("team-a", "GPU-a"), ("team-b", "GPU-b")):
            reading = Reading("n0", 0, uuid, at, 50.0, 1000, 100, 40, "A100-80GB", 81920)
            holders = [Holder(namespace, "llama-0", "main", uuid, 1000)]
            ledger.count(reading, split_reading(50.0, 1000, holders), None)


async def test_pods_of_one_name_in_two_tenants_namespaces_are_each_billed_to_their_own_job() -> None:
    uow, ledger = FakeUsageUnitOfWork(), a_ledger()
    for job_id, tenant in (("ja", "team-a"), ("jb", "team-b")):
        announced = JobAccepted(job_id=job_id, name="llama", tenant=tenant, queue=f"{tenant}-q")
        await handle(on_job_announced(ledger), uow, announced)
        await handle(on_gang_placed(ledger), uow, llama(job_id, tenant, f"GPU-{tenant[-1]}"))
    assert (await uow.directory_store.load()).refs() == ledger.directory.refs()  # after a restart too
    count_llamas(ledger, T0, 6)
    billed = {(r.key.namespace, r.job_id, r.tenant) for r in ledger.accountant.rows.values()}
    assert billed == {("team-a", "ja", "team-a"), ("team-b", "jb", "team-b")}

    # team-a's job ends: team-b's pod of the same name is still placed and billed to team-b
    finished = GangFinished(job_id="ja", succeeded=True, pods={"llama-0": "Succeeded"})
    await handle(on_pods_released(ledger), uow, finished)
    assert set(ledger.directory.pods) == {("team-b", "llama-0")}
    assert set((await uow.directory_store.load()).pods) == {("team-b", "llama-0")}
    count_llamas(ledger, T0 + timedelta(hours=1), 6)  # the next hour's rows are made afresh
    next_hour = [r for r in ledger.accountant.rows.values() if r.key.window_start > T0]
    billed = {(r.key.namespace, r.job_id, r.tenant) for r in next_hour}
    assert billed == {("team-a", "unknown", "unknown"), ("team-b", "jb", "team-b")}


async def test_ending_a_job_ends_only_its_own_pods_findings() -> None:
    uow, ledger = FakeUsageUnitOfWork(), a_ledger()
    for job_id, tenant in (("ja", "team-a"), ("jb", "team-b")):
        ledger.directory.add_job(job_id, tenant, "q")
        ledger.directory.place([PlacedPod("trainer", job_id, "n0", {f"GPU-{tenant}": 1000}, tenant)])
    kind = FindingKind.FITS_SMALLER_SHARE
    recs = [
        Recommendation(
            kind,
            "n0",
            f"GPU-{ns}",
            "A100-80GB",
            ns,
            "trainer",
            "main",
            T0,
            T0,
            40,
            1000,
            10.0,
            2048,
            150,
            None,
        )
        for ns in ("team-a", "team-b")
    ]
    async with uow:
        published = await record_recommendations(uow, recs, ledger.directory)
        await uow.commit()
    assert [(e.namespace, e.job_id, e.tenant) for e in published] == [
        ("team-a", "ja", "team-a"),
        ("team-b", "jb", "team-b"),
    ]
    await handle(on_pods_released(ledger), uow, PodsEvicted(job_id="ja", pods=["team-a/trainer"], reason="x"))
    assert {k[1]: ended is None for k, (_, ended) in uow.rightsizing_store.open_.items()} == {
        "team-a": False,
        "team-b": True,
    }


def test_a_placement_from_before_namespaces_matches_its_pod_by_name_in_any_namespace() -> None:
    old = {"pod": "trainer", "group": "w", "node": "n0", "gpus": []}  # a version-1 event as first sent
    assert PodPlacement.model_validate(old).namespace == ""
    directory = JobDirectory()
    directory.add_job("j", "team-a", "q")
    directory.place([PlacedPod("trainer", "j", "n0", {"GPU-0": 300})])
    ref = directory.job_of("anywhere", "trainer")
    assert ref is not None and ref.tenant == "team-a"
    assert directory.placed_milli("anywhere", "trainer", "GPU-0") == 300
    directory.place([PlacedPod("trainer", "k", "n0", {"GPU-0": 700}, "team-b")])  # named: it wins there
    assert directory.placed_milli("team-b", "trainer", "GPU-0") == 700
    assert directory.placed_milli("team-a", "trainer", "GPU-0") == 300


def count_a_llama(ledger: UsageLedger, start: datetime, n: int) -> None:
    """`n` readings of team-a's `llama-0` on GPU-a, half busy."""
    for i in range(n):
        at = start + timedelta(seconds=10 * i)
        reading = Reading("n0", 0, "GPU-a", at, 50.0, 1000, 100, 40, "A100-80GB", 81920)
        holders = [Holder("team-a", "llama-0", "main", "GPU-a", 1000)]
        ledger.count(reading, split_reading(50.0, 1000, holders), None)


@pytest.mark.parametrize(
    "released",
    [
        GangFinished(job_id="ja", succeeded=True, pods={"llama-0": "Succeeded"}),
        PodsEvicted(job_id="ja", pods=["team-a/llama-0"], reason="node_lost"),
    ],
    ids=["gang_finished", "pods_evicted"],
)
async def test_readings_of_a_pod_after_its_job_ended_are_billed_to_unknown_counted_and_stored(
    released: GangFinished | PodsEvicted,
) -> None:
    """The pod is gone as far as telemetry knows (its gang finished, or it was evicted), yet a node
    still reports it: its next hour's readings go to job, queue and tenant `unknown`, are counted in
    the stats and the metric, and are stored, not dropped."""
    uow, ledger = FakeUsageUnitOfWork(), a_ledger()
    announced = JobAccepted(job_id="ja", name="llama", tenant="team-a", queue="team-a-q")
    await handle(on_job_announced(ledger), uow, announced)
    await handle(on_gang_placed(ledger), uow, llama("ja", "team-a", "GPU-a"))
    count_a_llama(ledger, T0, 6)
    assert ledger.accountant.stats.unknown_pod_shares == 0
    await handle(on_pods_released(ledger), uow, released)
    assert ledger.directory.job_of("team-a", "llama-0") is None
    hour = T0.replace(minute=0)
    count_a_llama(ledger, hour + timedelta(hours=1), 6)

    by_hour = {r.key.window_start: r for r in ledger.accountant.rows.values()}
    before, after = by_hour[hour], by_hour[hour + timedelta(hours=1)]
    assert (before.job_id, before.queue, before.tenant) == ("ja", "team-a-q", "team-a")
    assert (after.job_id, after.queue, after.tenant) == ("unknown", "unknown", "unknown")
    assert after.samples == 6 and after.allocated_gpu_s > 0
    assert ledger.accountant.stats.unknown_pod_shares == 6

    registry = CollectorRegistry()
    usage_metrics(registry).record(ledger.accountant.take_sums(), "USD", ledger.accountant.stats, 0)
    exposed = generate_latest(registry).decode()
    assert "tessera_usage_unknown_pod_shares 6.0" in exposed
    unknown_hours = [
        float(line.rsplit(" ", 1)[1])
        for line in exposed.splitlines()
        if line.startswith("tessera_gpu_allocated_hours_total{")
        and 'queue="unknown",tenant="unknown"' in line
    ]
    assert unknown_hours and unknown_hours[0] > 0

    await flush_usage(lambda: uow, ledger, hour + timedelta(hours=1, minutes=1))
    stored = {(k.window_start, r.job_id) for k, r in uow.usage_store.rows.items()}
    assert (hour + timedelta(hours=1), "unknown") in stored
