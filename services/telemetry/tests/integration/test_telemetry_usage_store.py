"""The usage repository's one-statement writes on real Postgres: a flush's hourly rows replace the
stored ones (one row per key, the last given winning), and rebuilding a day leaves exactly the sums of
its hours, so a group whose hours were all billed elsewhere (a pod's job learnt late) disappears."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import text

from tessera.core.db.engine import make_engine, make_session_factory
from tessera.core.db.migrations import migrate
from tessera.telemetry.adapters import orm
from tessera.telemetry.domain.attribution import UNKNOWN
from tessera.telemetry.domain.directory import PlacedPod
from tessera.telemetry.domain.rightsizing import FindingKind, Recommendation
from tessera.telemetry.domain.usage_report import GroupBy
from tessera.telemetry.domain.usage_rows import UsageKey, UsageRow
from tessera.telemetry.service_layer.unit_of_work import TelemetryUnitOfWork
from tessera.telemetry.service_layer.usage import record_usage

pytestmark = pytest.mark.integration

DAY = datetime(2026, 11, 20, tzinfo=UTC)


@pytest.fixture
async def units(fresh_database: str) -> AsyncIterator[Any]:
    await asyncio.to_thread(migrate, "telemetry", fresh_database)
    engine = make_engine(fresh_database, pool_size=1)
    sessions = make_session_factory(engine)
    try:
        yield lambda: TelemetryUnitOfWork(sessions, orm.outbox, orm.inbox, "tessera/telemetry")
    finally:
        await engine.dispose()


def row(hour: int, pod: str, job: str, allocated: float, day: datetime = DAY) -> UsageRow:
    at = day + timedelta(hours=hour)
    key = UsageKey(at, "n0", f"GPU-{pod}", "ml", pod, "main")
    return UsageRow(
        key, job, "research", "team-a", "a100", "on-demand", "requested", allocated, allocated / 2,
        1000.0, 0.0, allocated / 900, 10, at, at + timedelta(minutes=5),
    )  # fmt: skip


async def query(units: Any, sql: str) -> list[tuple[Any, ...]]:
    async with units() as uow:
        return [tuple(r) for r in await uow.session.execute(text(sql))]


async def save(units: Any, rows: list[UsageRow]) -> None:
    async with units() as uow:
        await record_usage(uow, rows)
        await uow.commit()


DAILY = "SELECT day, job_id, allocated_gpu_s, samples FROM telemetry.usage_daily ORDER BY 1, 2"


async def test_a_day_rebuilt_holds_exactly_its_hours_sums(units: Any) -> None:
    # first flush: the pod's job is not known yet; the next day has a row of its own
    await save(
        units,
        [
            row(1, "p", UNKNOWN, 100.0),
            row(2, "q", "job-b", 50.0),
            row(1, "q", "job-b", 5.0, DAY + timedelta(days=1)),
        ],
    )
    assert await query(units, DAILY) == [
        (DAY, "job-b", 50.0, 10),
        (DAY, UNKNOWN, 100.0, 10),
        (DAY + timedelta(days=1), "job-b", 5.0, 10),
    ]
    # the placement arrived: the same hour, now billed to its job, and more of it
    await save(units, [row(1, "p", "job-a", 130.0)])
    assert await query(units, DAILY) == [
        (DAY, "job-a", 130.0, 10),
        (DAY, "job-b", 50.0, 10),
        (DAY + timedelta(days=1), "job-b", 5.0, 10),  # a day not touched stays as it was
    ]
    # the same rows again change nothing
    await save(units, [row(1, "p", "job-a", 130.0), row(2, "q", "job-b", 50.0)])
    assert await query(units, DAILY) == [
        (DAY, "job-a", 130.0, 10),
        (DAY, "job-b", 50.0, 10),
        (DAY + timedelta(days=1), "job-b", 5.0, 10),
    ]


async def test_hourly_rows_replace_the_stored_ones_and_the_last_of_a_key_wins(units: Any) -> None:
    first = row(3, "p", "job-a", 10.0)
    await save(units, [first])
    # the later row is in an idle run (since 03:01:00.5) with 90 s of it not yet counted as idle
    since = (first.key.window_start + timedelta(minutes=1, milliseconds=500)).timestamp()
    later = replace(
        first, allocated_gpu_s=20.0, samples=11, split="memory", idle_run_since=since, idle_pending_s=90.0
    )
    await save(units, [replace(first, allocated_gpu_s=15.0), later])
    hourly = await query(
        units,
        "SELECT window_start, pod, job_id, allocated_gpu_s, samples, split, first_at, last_at FROM telemetry.usage_hourly",
    )
    assert hourly == [
        (first.key.window_start, "p", "job-a", 20.0, 11, "memory", first.first_at, first.last_at)
    ]
    async with units() as uow:
        restored = await uow.usage.rows_since(DAY)
    assert restored == [later]


async def test_two_instances_rebuilding_one_day_at_once_leave_the_sums_of_both(fresh_database: str) -> None:
    """Telemetry runs on every node: two instances may close the same hour at once. The second's
    rebuild waits for the first to commit and then reads its hours too; without that, it would read
    the day before the first committed and overwrite the first's day with its own hours alone."""
    await asyncio.to_thread(migrate, "telemetry", fresh_database)
    engine = make_engine(fresh_database, pool_size=3)
    sessions = make_session_factory(engine)

    def unit() -> TelemetryUnitOfWork:
        return TelemetryUnitOfWork(sessions, orm.outbox, orm.inbox, "tessera/telemetry")

    async def waiting() -> int:
        async with unit() as uow:
            found = await uow.session.execute(text("SELECT count(*) FROM pg_locks WHERE NOT granted"))
            return int(found.scalar_one())

    async def second() -> None:
        async with unit() as uow:
            await record_usage(uow, [row(1, "q", "job-a", 40.0)])
            await uow.commit()

    try:
        async with unit() as first:
            await record_usage(first, [row(1, "p", "job-a", 100.0)])
            other = asyncio.create_task(second())
            for _ in range(200):  # until the second instance waits on the first
                if await waiting() or other.done():
                    break
                await asyncio.sleep(0.02)
            await first.commit()
        await other
        async with unit() as uow:
            days = [tuple(r) for r in await uow.session.execute(text(DAILY))]
        assert days == [(DAY, "job-a", 140.0, 20)]
    finally:
        await engine.dispose()


async def test_pods_of_one_name_in_two_namespaces_are_two_placements(fresh_database: str) -> None:
    """Two tenants run `llama-0` in their namespaces: both placements are stored and loaded, and
    ending one job's pods (and its findings) leaves the other's. A placement stored before placements
    named their namespace (telemetry_0004) is kept, with namespace "" (matched by name alone)."""
    await asyncio.to_thread(migrate, "telemetry", fresh_database, "telemetry_0004")
    engine = make_engine(fresh_database, pool_size=1)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO telemetry.pod_placements (pod, job_id, node, gpus, placed_at) "
                    """VALUES ('old-0', 'j-old', 'n0', '[{"uuid": "GPU-o", "milli": 500}]', now())"""
                )
            )
    finally:
        await engine.dispose()
    await asyncio.to_thread(migrate, "telemetry", fresh_database)
    engine = make_engine(fresh_database, pool_size=1)
    sessions = make_session_factory(engine)

    def unit() -> TelemetryUnitOfWork:
        return TelemetryUnitOfWork(sessions, orm.outbox, orm.inbox, "tessera/telemetry")

    try:
        async with unit() as uow:
            await uow.directory.place(
                [
                    PlacedPod("llama-0", "ja", "n0", {"GPU-a": 1000}, "team-a"),
                    PlacedPod("llama-0", "jb", "n1", {"GPU-b": 1000}, "team-b"),
                ],
                DAY,
            )
            for namespace, job_id in (("team-a", "ja"), ("team-b", "jb")):
                rec = Recommendation(
                    FindingKind.FITS_SMALLER_SHARE, "n0", f"GPU-{namespace}", "A100-80GB", namespace,
                    "llama-0", "main", DAY, DAY, 40, 1000, 10.0, 2048, 150, None,
                )  # fmt: skip
                assert await uow.rightsizing.open(job_id, namespace, rec, {})
            await uow.commit()
        async with unit() as uow:
            loaded = await uow.directory.load()
        assert {k: p.job_id for k, p in loaded.pods.items()} == {
            ("", "old-0"): "j-old",
            ("team-a", "llama-0"): "ja",
            ("team-b", "llama-0"): "jb",
        }
        async with unit() as uow:
            await uow.directory.end_pods("ja", ["llama-0"], DAY)
            await uow.rightsizing.end_for_pods("ja", ["llama-0"], DAY)
            await uow.commit()
        async with unit() as uow:
            loaded = await uow.directory.load()
            findings = await uow.rightsizing.open_findings()
        assert set(loaded.pods) == {("", "old-0"), ("team-b", "llama-0")}
        assert [(ns, pod) for _, ns, pod, _, _ in findings] == [("team-b", "llama-0")]
    finally:
        await engine.dispose()


async def test_totals_from_within_an_hour_count_that_whole_hour_on_the_utc_grid(units: Any) -> None:
    """`tessera usage --from 24h` starts within an hour: that hour's row counts, as in the series."""
    await save(units, [row(4, "p", "job-a", 100.0), row(3, "p", "job-a", 7.0)])
    india = timezone(timedelta(hours=5, minutes=30))  # 10:00 there is 04:30 UTC, on no UTC hour
    starts = [DAY + timedelta(hours=4, minutes=30), datetime(2026, 11, 20, 10, 0, tzinfo=india)]
    for start in starts:
        async with units() as uow:
            (total,) = await uow.usage.totals(GroupBy.JOB, start, DAY + timedelta(hours=6))
        assert (total.group, total.allocated_gpu_hours) == ("job-a", 100.0 / 3600)
