"""When a flush rebuilds the daily rows (when an hour of the day closes, on the last flush, after a
restart), and the attributor's holders kept per node while the kubelet answers the same grants."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from tessera.telemetry.domain.attribution import DeviceGrant, Holder, HolderCache, split_reading
from tessera.telemetry.domain.directory import JobDirectory, PlacedPod
from tessera.telemetry.domain.model import Reading
from tessera.telemetry.service_layer.usage import UsageLedger, flush_usage, restore_usage

from .test_telemetry_usage_handlers import FakeUsageUnitOfWork, a_ledger

H0 = datetime(2026, 11, 23, 22, 0, tzinfo=UTC)
DAY = H0.replace(hour=0)
GPU = "GPU-0"


def count(ledger: UsageLedger, start: datetime, seconds: int) -> None:
    for i in range(seconds // 10):
        at = start + timedelta(seconds=10 * i)
        reading = Reading("n0", 0, GPU, at, 50.0, 1000, 100, 40, "A100-80GB", 81920)
        ledger.count(reading, split_reading(50.0, 1000, [Holder("ns", "p", "main", GPU)]), None)


async def test_a_day_is_rebuilt_when_one_of_its_hours_closes_not_at_every_flush() -> None:
    ledger, uow = a_ledger(), FakeUsageUnitOfWork()
    count(ledger, H0, 600)
    flushed = await flush_usage(lambda: uow, ledger, H0 + timedelta(minutes=10))
    assert flushed.rows == 1 and len(uow.usage_store.rows) == 1
    assert uow.usage_store.days == []  # the hour is open: its day is not summed again yet

    count(ledger, H0 + timedelta(minutes=10), 3000)  # to the end of the hour
    await flush_usage(lambda: uow, ledger, H0 + timedelta(minutes=71))
    assert uow.usage_store.days == []  # ended, but held for idle runs and late readings 12 minutes

    count(ledger, H0 + timedelta(hours=1), 780)
    await flush_usage(lambda: uow, ledger, H0 + timedelta(hours=1, minutes=12, seconds=30))
    assert uow.usage_store.days == [DAY]  # the hour closed: its day rebuilt with its last rows
    assert ledger.accountant.closed_before == H0 + timedelta(hours=1)
    stored = sorted(uow.usage_store.rows.values(), key=lambda r: r.key.window_start)
    assert [r.allocated_gpu_s for r in stored] == [3600, 780]


async def test_an_hour_closing_without_new_readings_still_rebuilds_its_day() -> None:
    ledger, uow = a_ledger(), FakeUsageUnitOfWork()
    count(ledger, H0, 600)
    await flush_usage(lambda: uow, ledger, H0 + timedelta(minutes=10))
    flushed = await flush_usage(lambda: uow, ledger, H0 + timedelta(hours=1, minutes=15))
    assert flushed.rows == 0 and uow.usage_store.days == [DAY]


async def test_the_last_flush_rebuilds_the_open_hours_days_too() -> None:
    ledger, uow = a_ledger(), FakeUsageUnitOfWork()
    count(ledger, H0 + timedelta(hours=1, minutes=50), 1200)  # 23:50 to 00:10, across midnight
    await flush_usage(lambda: uow, ledger, H0 + timedelta(hours=2, minutes=10), final=True)
    assert uow.usage_store.days == [DAY, DAY + timedelta(days=1)]


async def test_the_last_flush_rebuilds_the_open_hours_days_even_with_nothing_new() -> None:
    ledger, uow = a_ledger(), FakeUsageUnitOfWork()
    count(ledger, H0, 600)
    await flush_usage(lambda: uow, ledger, H0 + timedelta(minutes=10))
    assert uow.usage_store.days == []
    flushed = await flush_usage(lambda: uow, ledger, H0 + timedelta(minutes=10, seconds=5), final=True)
    assert flushed.rows == 0 and uow.usage_store.days == [DAY]


async def test_a_restart_rolls_in_the_hours_that_closed_while_it_was_down() -> None:
    ledger, uow = a_ledger(), FakeUsageUnitOfWork()
    count(ledger, H0 + timedelta(hours=1, minutes=30), 1800)  # 23:30 to midnight, then it dies
    await flush_usage(lambda: uow, ledger, H0 + timedelta(hours=1, minutes=59))
    assert uow.usage_store.days == []

    restarted = a_ledger()
    restored = await restore_usage(uow, restarted, H0 + timedelta(hours=5), None)
    assert restored == 0  # nothing open any more
    assert uow.usage_store.days == [DAY]  # 23:00, closed while it was down, is in its day


def grants(*pods: str) -> list[DeviceGrant]:
    return [DeviceGrant("ns", pod, "main", "nvidia.com/gpu", f"{GPU}::{i}") for i, pod in enumerate(pods)]


def test_a_nodes_holders_are_derived_again_only_when_its_grants_or_placements_change() -> None:
    cache, directory = HolderCache(), JobDirectory()
    directory.place([PlacedPod("a", "job", "n0", {GPU: 300}), PlacedPod("b", "job", "n0", {GPU: 700})])

    def holders(node_grants: list[DeviceGrant], parents: dict[str, str] | None = None) -> list[Holder]:
        by_gpu, _ = cache.holders(
            "n0", node_grants, parents or {}, directory.placed_milli, directory.placements
        )
        return by_gpu[GPU]

    first = holders(grants("a", "b"))
    assert [(h.pod, h.milli, h.replica) for h in first] == [("a", 300, True), ("b", 700, True)]
    assert holders(grants("a", "b")) is first  # the same answer (new objects, equal): kept

    directory.place([PlacedPod("a", "job", "n0", {GPU: 500})])
    moved = holders(grants("a", "b"))
    assert moved is not first and [h.milli for h in moved] == [500, 700]

    assert [h.pod for h in holders(grants("a"))] == ["a"]  # b let the GPU go
    assert holders(grants("a"), {"MIG-1": GPU}) is not holders(grants("a"))  # MIG parents changed

    cache.keep_only(["n1"])
    assert holders(grants("a")) is not holders(grants("a", "b"))


def test_a_directory_loaded_after_a_restart_never_repeats_an_earlier_placements_number() -> None:
    before, after = JobDirectory(), JobDirectory()
    before.place([PlacedPod("a", "job", "n0", {GPU: 300})])
    assert len({before.placements, after.placements, JobDirectory().placements}) == 3


async def test_containers_gone_for_a_closed_hour_are_forgotten_and_count_afresh_if_they_return() -> None:
    ledger, uow = a_ledger(), FakeUsageUnitOfWork()

    def read(pod: str, gpu: str, start: datetime, seconds: int) -> None:
        for i in range(seconds // 10):
            at = start + timedelta(seconds=10 * i)
            reading = Reading("n0", 0, gpu, at, 50.0, 1000, 100, 40, "A100-80GB", 81920)
            ledger.count(reading, split_reading(50.0, 1000, [Holder("ns", pod, "main", gpu)]), None)

    read("stays", "GPU-0", H0, 3600 + 900)
    read("leaves", "GPU-1", H0, 1800)  # gone at 22:30
    assert {h[2] for h in ledger.rightsizing.holders()} == {"stays", "leaves"}
    await flush_usage(lambda: uow, ledger, H0 + timedelta(hours=1, minutes=15))  # 22:00 closes
    assert {h[2] for h in ledger.rightsizing.holders()} == {"stays"}

    read("leaves", "GPU-1", H0 + timedelta(hours=1, minutes=20), 10)  # back: one reading
    await flush_usage(lambda: uow, ledger, H0 + timedelta(hours=1, minutes=21))
    back = [r for r in uow.usage_store.rows.values() if r.key.pod == "leaves" and r.key.window_start > H0]
    assert [r.allocated_gpu_s for r in back] == [10.0]  # one interval, as a first reading


async def test_a_node_whose_clock_lags_keeps_its_rightsizing_windows_across_closes() -> None:
    ledger, uow = a_ledger(), FakeUsageUnitOfWork()
    lag = timedelta(minutes=20)  # the node's clock, against telemetry's: clamped to telemetry's
    recommended = []
    for i in range(int(2.5 * 360)):
        now = H0 + timedelta(seconds=10 * i)
        reading = Reading("n0", 0, GPU, now - lag, 50.0, 1000, 100, 40, "A100-80GB", 81920)
        ledger.count(reading, split_reading(50.0, 1000, [Holder("ns", "p", "main", GPU)]), now)
        if i % 3 == 2:
            recommended += (await flush_usage(lambda: uow, ledger, now)).recommendations
    assert ledger.accountant.stats.clamped == int(2.5 * 360)
    assert ledger.accountant.closed_before == H0 + timedelta(hours=2)  # 22:00 and 23:00 closed
    # one window's recommendation, made once: the window was not dropped (and its finding with it)
    # at the close, as it was when rightsizing kept the node's own clock
    assert [(r.pod, r.window_start) for r in recommended] == [("p", H0)]


def idle(ledger: UsageLedger, start: datetime, readings: int) -> None:
    for i in range(readings):
        at = start + timedelta(seconds=10 * i)
        reading = Reading("n0", 0, GPU, at, 1.0, 1000, 100, 40, "A100-80GB", 81920)
        ledger.count(reading, split_reading(1.0, 1000, [Holder("ns", "p", "main", GPU)]), None)


async def test_an_idle_run_split_by_a_restart_is_flagged_whole() -> None:
    """Idle from 22:56 for 8 minutes, a restart, then 7 more: one run of 15 minutes, longer than the
    10-minute window, so all of it (in both hours) is idle, as without the restart."""
    ledger, uow = a_ledger(), FakeUsageUnitOfWork()
    start = H0 + timedelta(minutes=56)
    idle(ledger, start, 48)
    await flush_usage(lambda: uow, ledger, start + timedelta(minutes=8))
    assert sum(r.idle_gpu_s for r in uow.usage_store.rows.values()) == 0  # 8 minutes: not yet
    # what was stored, apart from the rows the stopped service held
    uow.usage_store.rows = {k: replace(r) for k, r in uow.usage_store.rows.items()}

    restarted = a_ledger()
    assert await restore_usage(uow, restarted, start + timedelta(minutes=8), None) == 2
    idle(restarted, start + timedelta(minutes=8), 42)
    await flush_usage(lambda: uow, restarted, start + timedelta(minutes=15))
    by_hour = {r.key.window_start: r for r in uow.usage_store.rows.values()}
    assert {h: (r.idle_gpu_s, r.allocated_gpu_s) for h, r in by_hour.items()} == {
        H0: (240.0, 240.0),
        H0 + timedelta(hours=1): (660.0, 660.0),
    }
    assert [r.idle_pending_s for r in by_hour.values()] == [0.0, 0.0]


async def test_an_idle_run_that_ended_before_a_restart_is_not_continued_by_it() -> None:
    ledger, uow = a_ledger(), FakeUsageUnitOfWork()
    idle(ledger, H0, 30)  # 5 minutes idle
    count(ledger, H0 + timedelta(minutes=5), 100)  # then busy to 6:30: the run ends short
    await flush_usage(lambda: uow, ledger, H0 + timedelta(minutes=7))
    (stored,) = uow.usage_store.rows.values()
    assert (stored.idle_run_since, stored.idle_pending_s) == (None, 0.0)
    restarted = a_ledger()
    await restore_usage(uow, restarted, H0 + timedelta(minutes=7), None)
    idle(restarted, H0 + timedelta(minutes=6, seconds=40), 50)  # idle again: 8 minutes and 20 s
    await flush_usage(lambda: uow, restarted, H0 + timedelta(minutes=16))
    assert stored.idle_gpu_s == 0 and stored.idle_pending_s == 500.0


async def test_idle_seconds_pending_in_an_hour_that_closed_while_the_service_was_down_are_credited() -> None:
    """Idle from 22:57:30 to 23:01, the service down until 23:15 (22:00 closes meanwhile), idle on: the
    run is over the 10-minute window, so its seconds in 22:00 count as well, as they do without a
    restart (into the open hour: the closed one is not written again). A stale row of an earlier run
    adds nothing."""
    ledger, uow = a_ledger(), FakeUsageUnitOfWork()
    idle(ledger, H0 - timedelta(minutes=30), 6)  # 21:30, a run ended short (its row made stale below)
    count(ledger, H0 - timedelta(minutes=29), 60)
    idle(ledger, H0 + timedelta(minutes=58), 18)
    await flush_usage(lambda: uow, ledger, H0 + timedelta(minutes=61))
    uow.usage_store.rows = {k: replace(r) for k, r in uow.usage_store.rows.items()}
    stale = uow.usage_store.rows[next(k for k in uow.usage_store.rows if k.window_start < H0)]
    stale.idle_run_since, stale.idle_pending_s = (H0 - timedelta(minutes=30)).timestamp(), 50.0
    pending = {r.key.window_start: r.idle_pending_s for r in uow.usage_store.rows.values()}
    assert pending == {H0 - timedelta(hours=1): 50.0, H0: 140.0, H0 + timedelta(hours=1): 60.0}

    restarted, given_all = a_ledger(), a_ledger()
    assert await restore_usage(uow, restarted, H0 + timedelta(minutes=75), None) == 1  # 23:00 only
    given_all.accountant.restore([replace(r) for r in uow.usage_store.rows.values()], H0 + timedelta(hours=1))
    for ledger in (restarted, given_all):
        idle(ledger, H0 + timedelta(minutes=75), 1)
        (row,) = ledger.accountant.rows.values()
        assert row.idle_gpu_s == pytest.approx(140.0 + 60.0 + 30.0)  # 22:00's, 23:00's, this reading's
