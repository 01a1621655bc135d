"""B7's PostgreSQL side: a migrated telemetry database, the service's usage flush on it, the rows read
back, and the CPU the database server spends (from /proc, when the server runs on this machine).

`flush` calls the service layer's `flush_usage`, which the sampler calls every
`usage.flush_interval_s`: the accountant's changed rows and the new rightsizing recommendations go
through `record_usage` and `record_recommendations` in one telemetry unit of work
(hourly rows replaced, the touched days rebuilt, findings opened and published through the outbox),
then the hours that ended are closed in memory.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import DateTime, delete, func, insert, literal, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from tessera.core.db.engine import make_engine, make_session_factory
from tessera.telemetry.adapters import orm
from tessera.telemetry.adapters.orm import usage_daily, usage_hourly
from tessera.telemetry.adapters.usage_repository import (
    _HOURLY_KEY,
    _SUM_COLUMNS,
    SqlUsageRepository,
    _row_values,
)
from tessera.telemetry.domain.directory import JobDirectory, PlacedPod
from tessera.telemetry.domain.rightsizing import Recommendation
from tessera.telemetry.domain.usage import UsageRow
from tessera.telemetry.service_layer.unit_of_work import TelemetryUnitOfWork
from tessera.telemetry.service_layer.usage import UsageLedger, flush_usage, record_usage


@asynccontextmanager
async def telemetry_database(server_url: str | None) -> AsyncIterator[str]:
    """A new, migrated telemetry database on `server_url`, or on an embedded (or testcontainers)
    PostgreSQL started for the run when None (as bench.admission does); dropped afterwards."""
    from tessera.core.db.migrations import migrate
    from tessera.testing.infra import create_database, drop_database, resolve_postgres, with_database

    handle = None
    if not server_url:
        handle = resolve_postgres()
        handle.start()
        server_url = handle.url
    name = create_database(server_url)
    try:
        url = with_database(server_url, name)
        await asyncio.to_thread(migrate, "telemetry", url)
        yield url
    finally:
        try:
            drop_database(server_url, name)
        finally:
            if handle is not None:
                handle.close()


class ExecutemanyUsageRepository(SqlUsageRepository):
    """The rows stored as they were before (the baseline): the hourly rows by one upsert bound row by
    row (SQLAlchemy's executemany), each touched day deleted and summed again by statements built on
    every flush."""

    async def save(self, rows: Sequence[UsageRow]) -> None:
        if not rows:
            return
        stmt = pg_insert(usage_hourly)
        await self.session.execute(
            stmt.on_conflict_do_update(
                constraint="pk_usage_hourly",
                set_={c.name: stmt.excluded[c.name] for c in usage_hourly.c if c.name not in _HOURLY_KEY},
            ),
            [_row_values(r) for r in rows],
        )

    async def rollup_days(self, days: Sequence[datetime]) -> None:
        for day in sorted(set(days)):
            end = day + timedelta(days=1)
            await self.session.execute(delete(usage_daily).where(usage_daily.c.day == day))
            labels = ("job_id", "queue", "tenant", "flavor", "capacity_type")
            source = (
                select(
                    literal(day, DateTime(timezone=True)).label("day"),
                    *(usage_hourly.c[c] for c in labels),
                    *(func.sum(usage_hourly.c[c]).label(c) for c in _SUM_COLUMNS),
                )
                .where(usage_hourly.c.window_start >= day, usage_hourly.c.window_start < end)
                .group_by(*(usage_hourly.c[c] for c in labels))
            )
            await self.session.execute(
                insert(usage_daily).from_select(["day", *labels, *_SUM_COLUMNS], source)
            )


class BaselineUnitOfWork(TelemetryUnitOfWork):
    def open_repositories(self, session: AsyncSession) -> None:
        super().open_repositories(session)
        self.usage = ExecutemanyUsageRepository(session)


@dataclass
class FlushStats:
    flushes: int = 0
    rows_written: int = 0
    findings_opened: int = 0


class UsageStore:
    """The service's unit of work on one engine, as `ServiceContext.uow` builds it."""

    def __init__(self, url: str, baseline: bool = False) -> None:
        self.engine: AsyncEngine = make_engine(url, pool_size=2, application_name="tessera-telemetry")
        self.sessions = make_session_factory(self.engine)
        self.stats = FlushStats()
        self.unit = BaselineUnitOfWork if baseline else TelemetryUnitOfWork

    def uow(self, baseline: bool | None = None) -> TelemetryUnitOfWork:
        unit = self.unit if baseline is None else BaselineUnitOfWork if baseline else TelemetryUnitOfWork
        return unit(self.sessions, orm.outbox, orm.inbox, "tessera/telemetry")

    async def close(self) -> None:
        await self.engine.dispose()

    async def store_directory(self, directory: JobDirectory, at: datetime) -> None:
        """The jobs and placements, as the `job_accepted` and `gang_placed` handlers store them."""
        async with self.uow() as uow:
            for job in directory.jobs.values():
                await uow.directory.upsert_job(job.job_id, job.job_id, job.tenant, job.queue, at)
            await uow.directory.place(
                [PlacedPod(p.pod, p.job_id, p.node, dict(p.gpus)) for p in directory.pods.values()], at
            )
            await uow.commit()

    async def flush(self, ledger: UsageLedger, now: datetime, final: bool = False) -> list[Recommendation]:
        """The service's `flush_usage` (`final`: the sampler's last, as it stops); returns the
        recommendations it took (to score them)."""
        flushed = await flush_usage(self.uow, ledger, now, final)
        if flushed.rows or flushed.recommendations:
            self.stats.flushes += 1
        self.stats.rows_written += flushed.rows
        self.stats.findings_opened += len(flushed.opened)
        return flushed.recommendations

    async def rows(self, since: datetime) -> list[UsageRow]:
        async with self.uow() as uow:
            return await uow.usage.rows_since(since)

    async def counts(self) -> dict[str, int]:
        """Rows stored per table."""
        out = {}
        async with self.engine.connect() as conn:
            for table in (orm.usage_hourly, orm.usage_daily, orm.rightsizing_findings, orm.outbox):
                out[table.name] = int(
                    (await conn.execute(select(func.count()).select_from(table))).scalar_one()
                )
        return out

    async def compare_save(self, rows: Sequence[UsageRow], batch: int, rounds: int) -> dict[str, float]:
        """CPU milliseconds of this process per `record_usage` of `batch` rows (hourly rows stored,
        their days rebuilt), the baseline's repository against the service's, alternating, on rows
        already stored (so nothing changes), `rounds` batches each (whole ones, cycling through the
        rows), after one of each to prepare the statements; each batch is its own committed unit of
        work, as a flush is."""
        spent = {"executemany": 0.0, "unnest": 0.0}
        batches = [rows[i : i + batch] for i in range(0, len(rows), batch) if len(rows) - i >= batch]
        if not batches:
            return spent
        for n, chunk in enumerate([batches[0], *itertools.islice(itertools.cycle(batches), rounds)]):
            for name, baseline in (("executemany", True), ("unnest", False)):
                began = time.process_time()
                async with self.uow(baseline) as uow:
                    await record_usage(uow, chunk)
                    await uow.commit()
                if n:  # the first of each prepares its statements
                    spent[name] += time.process_time() - began
        return {name: round(1000 * cpu / rounds, 3) for name, cpu in spent.items()}

    async def server_pid(self) -> int:
        async with self.engine.connect() as conn:
            return int((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2 :].split()  # fields from the state on (the name may hold spaces)


def _is_postgres(pid: int) -> bool:
    try:
        return b"postgres" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


class ServerCpu:
    """CPU seconds of a local PostgreSQL server: the postmaster's, its exited children's (reaped into
    its cutime/cstime) and every live child's (backends, WAL writer, checkpointer...). None when the
    server is not a process of this machine (a remote URL, a container in its own pid namespace)."""

    def __init__(self, backend_pid: int) -> None:
        fields = _stat(backend_pid) if _is_postgres(backend_pid) else None
        parent = int(fields[1]) if fields else 0
        self.postmaster = parent if parent and _is_postgres(parent) else None

    def seconds(self) -> float | None:
        if self.postmaster is None:
            return None
        own = _stat(self.postmaster)
        if own is None:
            return None
        ticks = sum(int(v) for v in own[11:15])  # utime stime cutime cstime
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            fields = _stat(int(entry.name))
            if fields is not None and int(fields[1]) == self.postmaster:
                ticks += int(fields[11]) + int(fields[12])
        return ticks / _TICK
