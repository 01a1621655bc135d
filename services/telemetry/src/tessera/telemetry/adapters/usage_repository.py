"""Usage and cost accounting's state in Postgres: the job directory (jobs and pod placements), the
hourly and daily usage rows, and the rightsizing findings.

The protocols are what the service layer sees; the `Sql*` classes keep every query in this module."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Float,
    String,
    TextClause,
    func,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from tessera.telemetry.adapters.orm import (
    jobs,
    pod_placements,
    rightsizing_findings,
    usage_daily,
    usage_hourly,
)
from tessera.telemetry.domain.attribution import UNKNOWN
from tessera.telemetry.domain.directory import JobDirectory, PlacedPod
from tessera.telemetry.domain.rightsizing import Recommendation
from tessera.telemetry.domain.usage_report import GroupBy, UsageTotal
from tessera.telemetry.domain.usage_rows import HOUR_S, UsageKey, UsageRow, hour_of
from tessera.telemetry.domain.usage_series import HourSum


class JobDirectoryRepository(Protocol):
    async def upsert_job(self, job_id: str, name: str, tenant: str, queue: str, at: datetime) -> None: ...

    async def place(self, pods: Sequence[PlacedPod], at: datetime) -> None:
        """Record the pods of a placement, replacing an older placement of the same pods (namespace
        and name)."""
        ...

    async def end_pods(self, job_id: str, pods: Sequence[str] | None, at: datetime) -> None:
        """The job's pods (all, or these) let their GPUs go."""
        ...

    async def load(self) -> JobDirectory:
        """Every job, and the pods still placed."""
        ...


class UsageRepository(Protocol):
    async def save(self, rows: Sequence[UsageRow]) -> None:
        """Store each row, replacing the one stored for the same hour, GPU and container."""
        ...

    async def rows_since(self, since: datetime, nodes: Sequence[str] | None = None) -> list[UsageRow]: ...

    async def latest_hour(self, before: datetime, nodes: Sequence[str] | None = None) -> datetime | None:
        """The latest hour stored before `before` (of these nodes' rows), None when there is none."""
        ...

    async def rollup_days(self, days: Sequence[datetime]) -> None:
        """Rebuild the daily rows of these days (UTC midnights) from the hourly rows."""
        ...

    async def totals(
        self, by: GroupBy, start: datetime, end: datetime, tenant: str | None = None
    ) -> list[UsageTotal]:
        """Per group, the hourly rows of the hours from `start`'s (floored, UTC) to `end` summed."""
        ...

    async def hour_sums(
        self, by: GroupBy, start: datetime, end: datetime, tenant: str | None = None
    ) -> list[HourSum]:
        """Per hour and group, the hourly rows summed (one query)."""
        ...


class RightsizingRepository(Protocol):
    async def open(
        self, job_id: str, tenant: str, recommendation: Recommendation, detail: dict[str, object]
    ) -> bool:
        """Store an open finding; False when one of that kind was open already for the container."""
        ...

    async def open_findings(self) -> list[tuple[str, str, str, str, str]]:
        """(gpu_uuid, namespace, pod, container, kind) of every open finding."""
        ...

    async def end_for_pods(self, job_id: str, pods: Sequence[str], at: datetime) -> None:
        """End the open findings of the job's pods of these names (or of pods billed to `unknown`)."""
        ...


class SqlJobDirectoryRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def upsert_job(self, job_id: str, name: str, tenant: str, queue: str, at: datetime) -> None:
        values = {"name": name, "tenant": tenant, "queue": queue, "updated_at": at}
        stmt = pg_insert(jobs).values(job_id=job_id, **values)
        await self.session.execute(stmt.on_conflict_do_update(index_elements=[jobs.c.job_id], set_=values))

    async def place(self, pods: Sequence[PlacedPod], at: datetime) -> None:
        if not pods:
            return
        rows = [
            {
                "namespace": p.namespace,
                "pod": p.pod,
                "job_id": p.job_id,
                "node": p.node,
                "gpus": [{"uuid": u, "milli": m} for u, m in p.gpus.items()],
                "placed_at": at,
                "ended_at": None,
            }
            for p in pods
        ]
        stmt = pg_insert(pod_placements)
        await self.session.execute(
            stmt.on_conflict_do_update(
                constraint="pk_pod_placements",
                set_={c: stmt.excluded[c] for c in ("job_id", "node", "gpus", "placed_at", "ended_at")},
            ),
            rows,
        )

    async def end_pods(self, job_id: str, pods: Sequence[str] | None, at: datetime) -> None:
        stmt = update(pod_placements).where(
            pod_placements.c.job_id == job_id, pod_placements.c.ended_at.is_(None)
        )
        if pods is not None:
            stmt = stmt.where(pod_placements.c.pod.in_(list(pods)))
        await self.session.execute(stmt.values(ended_at=at))

    async def load(self) -> JobDirectory:
        directory = JobDirectory()
        for r in await self.session.execute(select(jobs.c.job_id, jobs.c.tenant, jobs.c.queue)):
            directory.add_job(r.job_id, r.tenant, r.queue)
        p = pod_placements.c
        placed = await self.session.execute(
            select(p.namespace, p.pod, p.job_id, p.node, p.gpus).where(p.ended_at.is_(None))
        )
        directory.place(
            PlacedPod(r.pod, r.job_id, r.node, {g["uuid"]: int(g["milli"]) for g in r.gpus}, r.namespace)
            for r in placed
        )
        return directory


DAILY_ROLLUP_LOCK = 0x7E55E7A_D1
"""pg_advisory_xact_lock key of the daily rollup: one day rebuilt at a time across instances."""

_SUM_COLUMNS = ("allocated_gpu_s", "used_gpu_s", "memory_mib_s", "idle_gpu_s", "cost", "samples")
_HOURLY_KEY = ("window_start", "node", "gpu_uuid", "namespace", "pod", "container")


def _array_type(column: Column[Any]) -> str:
    for kind, name in ((DateTime, "timestamptz"), (String, "text"), (BigInteger, "int8"), (Float, "float8")):
        if isinstance(column.type, kind):
            return name
    raise TypeError(f"usage_hourly.{column.name}: no array type for {column.type!r}")


#: usage_hourly's columns, in the order `_row_tuple` gives their values
_HOURLY_COLUMNS = (
    *_HOURLY_KEY,
    "job_id",
    "queue",
    "tenant",
    "flavor",
    "capacity_type",
    "split",
    "allocated_gpu_s",
    "used_gpu_s",
    "memory_mib_s",
    "idle_gpu_s",
    "cost",
    "samples",
    "first_at",
    "last_at",
    "idle_run_since",
    "idle_pending_s",
)


def _row_tuple(r: UsageRow) -> tuple[object, ...]:
    k = r.key
    return (
        k.window_start,
        k.node,
        k.gpu_uuid,
        k.namespace,
        k.pod,
        k.container,
        r.job_id,
        r.queue,
        r.tenant,
        r.flavor,
        r.capacity_type,
        r.split,
        r.allocated_gpu_s,
        r.used_gpu_s,
        r.memory_mib_s,
        r.idle_gpu_s,
        r.cost,
        r.samples,
        r.first_at,
        r.last_at,
        None if r.idle_run_since is None else datetime.fromtimestamp(r.idle_run_since, UTC),
        r.idle_pending_s,
    )


def _row_values(r: UsageRow) -> dict[str, object]:
    return dict(zip(_HOURLY_COLUMNS, _row_tuple(r), strict=True))


@functools.cache
def _hourly_upsert() -> str:
    """One statement for a whole flush: each column's values as one array, `unnest`ed into rows, each
    replacing the stored row of its key. One round trip and one parameter set, however many rows
    (an executemany binds every row apart: most of a flush's CPU, in the driver and SQLAlchemy). It
    is the driver's SQL (`$n` parameters), run as it is: the arrays go to the driver untouched."""
    columns = [c.name for c in usage_hourly.c]
    if tuple(sorted(columns)) != tuple(sorted(_HOURLY_COLUMNS)):
        raise RuntimeError(f"usage_hourly's columns {columns} are not those _row_tuple gives")
    types = {c.name: _array_type(c) for c in usage_hourly.c}
    arrays = ", ".join(f"${i}::{types[c]}[]" for i, c in enumerate(_HOURLY_COLUMNS, start=1))
    updates = ", ".join(f"{c} = excluded.{c}" for c in _HOURLY_COLUMNS if c not in _HOURLY_KEY)
    return (
        f"INSERT INTO {usage_hourly.fullname} ({', '.join(_HOURLY_COLUMNS)}) SELECT * FROM unnest({arrays}) "
        f"ON CONFLICT ON CONSTRAINT pk_usage_hourly DO UPDATE SET {updates}"
    )


@functools.cache
def _daily_rollup() -> TextClause:
    """One statement for every day a flush touched: each day's rows summed again from its hourly rows
    and stored (replacing), and the day's stored rows of groups that no longer have hours deleted;
    what is left of those days is exactly the hours' sums, as deleting and inserting them would be."""
    labels = ("job_id", "queue", "tenant", "flavor", "capacity_type")
    key = ("day", *labels)
    daily = usage_daily.fullname
    return text(
        f"WITH fresh AS (SELECT d.day, {', '.join(f'h.{c}' for c in labels)}, "
        f"{', '.join(f'sum(h.{c}) AS {c}' for c in _SUM_COLUMNS)} "
        f"FROM unnest(CAST(:days AS timestamptz[])) AS d(day) JOIN {usage_hourly.fullname} AS h "
        "ON h.window_start >= d.day AND h.window_start < d.day + interval '24 hours' "
        f"GROUP BY d.day, {', '.join(f'h.{c}' for c in labels)}), "
        f"gone AS (DELETE FROM {daily} AS o WHERE o.day = ANY(CAST(:days AS timestamptz[])) "
        f"AND NOT EXISTS (SELECT 1 FROM fresh AS f WHERE {' AND '.join(f'f.{c} = o.{c}' for c in key)})) "
        f"INSERT INTO {daily} ({', '.join(key)}, {', '.join(_SUM_COLUMNS)}) "
        f"SELECT {', '.join(key)}, {', '.join(_SUM_COLUMNS)} FROM fresh "
        f"ON CONFLICT ON CONSTRAINT pk_usage_daily DO UPDATE SET "
        f"{', '.join(f'{c} = excluded.{c}' for c in _SUM_COLUMNS)}"
    )


def _row_arrays(rows: Sequence[UsageRow]) -> tuple[list[object], ...]:
    """The rows column by column (in `_HOURLY_COLUMNS` order), one row per key (the last given wins,
    as one after another would)."""
    unique = {r.key: r for r in rows}.values()
    return tuple(list(column) for column in zip(*map(_row_tuple, unique), strict=True))


_GROUP_COLUMN = {"tenant": "tenant", "queue": "queue", "job": "job_id", "flavor": "flavor"}


class SqlUsageRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def save(self, rows: Sequence[UsageRow]) -> None:
        if not rows:
            return
        connection = await self.session.connection()
        await connection.exec_driver_sql(_hourly_upsert(), _row_arrays(rows))

    async def rows_since(self, since: datetime, nodes: Sequence[str] | None = None) -> list[UsageRow]:
        query = select(usage_hourly).where(usage_hourly.c.window_start >= since)
        if nodes is not None:
            query = query.where(usage_hourly.c.node.in_(list(nodes)))
        out = []
        for r in (await self.session.execute(query)).mappings():
            out.append(
                UsageRow(
                    UsageKey(*(r[c] for c in _HOURLY_KEY)),
                    r["job_id"],
                    r["queue"],
                    r["tenant"],
                    r["flavor"],
                    r["capacity_type"],
                    r["split"],
                    r["allocated_gpu_s"],
                    r["used_gpu_s"],
                    r["memory_mib_s"],
                    r["idle_gpu_s"],
                    r["cost"],
                    r["samples"],
                    r["first_at"],
                    r["last_at"],
                    None if r["idle_run_since"] is None else r["idle_run_since"].timestamp(),
                    r["idle_pending_s"],
                )
            )
        return out

    async def latest_hour(self, before: datetime, nodes: Sequence[str] | None = None) -> datetime | None:
        query = select(func.max(usage_hourly.c.window_start)).where(usage_hourly.c.window_start < before)
        if nodes is not None:
            query = query.where(usage_hourly.c.node.in_(list(nodes)))
        latest: datetime | None = (await self.session.execute(query)).scalar()
        return latest

    async def rollup_days(self, days: Sequence[datetime]) -> None:
        if not days:
            return
        # Telemetry runs on every node, and two instances may rebuild one day at once. The lock,
        # held to commit, makes the second rebuild read the day after the first committed its hours;
        # otherwise it reads the day without them and overwrites the first's sums with its own.
        await self.session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": DAILY_ROLLUP_LOCK})
        await self.session.execute(_daily_rollup(), {"days": sorted(set(days))})

    async def totals(
        self, by: GroupBy, start: datetime, end: datetime, tenant: str | None = None
    ) -> list[UsageTotal]:
        group = usage_hourly.c[_GROUP_COLUMN[by.value]]
        query = (
            select(
                group.label("grp"),
                func.min(usage_hourly.c.tenant).label("tenant"),
                func.min(usage_hourly.c.queue).label("queue"),
                *(func.sum(usage_hourly.c[c]).label(c) for c in _SUM_COLUMNS),
            )
            # the hour `start` falls in counts, as in `hour_sums`: rows are whole hours
            .where(usage_hourly.c.window_start >= hour_of(start), usage_hourly.c.window_start < end)
            .group_by(group)
        )
        if tenant is not None:
            query = query.where(usage_hourly.c.tenant == tenant)
        rows = (await self.session.execute(query)).mappings()
        out = [
            UsageTotal(
                r["grp"],
                r["allocated_gpu_s"] / HOUR_S,
                r["used_gpu_s"] / HOUR_S,
                r["idle_gpu_s"] / HOUR_S,
                r["memory_mib_s"] / 1024 / HOUR_S,
                r["cost"],
                r["tenant"] if by in (GroupBy.JOB, GroupBy.QUEUE) else "",
                r["queue"] if by is GroupBy.JOB else "",
            )
            for r in rows
        ]
        return sorted(out, key=lambda t: (-t.cost, -t.allocated_gpu_hours, t.group))

    async def hour_sums(
        self, by: GroupBy, start: datetime, end: datetime, tenant: str | None = None
    ) -> list[HourSum]:
        h = usage_hourly.c
        group = h[_GROUP_COLUMN[by.value]]
        query = (
            select(
                h.window_start,
                group.label("grp"),
                *(func.sum(h[c]).label(c) for c in ("allocated_gpu_s", "used_gpu_s", "idle_gpu_s", "cost")),
            )
            .where(h.window_start >= start, h.window_start < end)
            .group_by(h.window_start, group)
            .order_by(h.window_start, group)
        )
        if tenant is not None:
            query = query.where(h.tenant == tenant)
        rows = (await self.session.execute(query)).mappings()
        return [
            HourSum(
                r["window_start"], r["grp"], r["allocated_gpu_s"], r["used_gpu_s"], r["idle_gpu_s"], r["cost"]
            )
            for r in rows
        ]


class SqlRightsizingRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def open(
        self, job_id: str, tenant: str, recommendation: Recommendation, detail: dict[str, object]
    ) -> bool:
        r = recommendation
        stmt = pg_insert(rightsizing_findings).values(
            gpu_uuid=r.gpu_uuid,
            namespace=r.namespace,
            pod=r.pod,
            container=r.container,
            kind=r.kind.value,
            job_id=job_id,
            tenant=tenant,
            since=r.window_start,
            detail=detail,
        )
        result = await self.session.execute(
            stmt.on_conflict_do_nothing(
                index_elements=[
                    rightsizing_findings.c.gpu_uuid,
                    rightsizing_findings.c.namespace,
                    rightsizing_findings.c.pod,
                    rightsizing_findings.c.container,
                    rightsizing_findings.c.kind,
                ],
                index_where=rightsizing_findings.c.ended_at.is_(None),
            ).returning(rightsizing_findings.c.id)
        )
        return result.first() is not None

    async def open_findings(self) -> list[tuple[str, str, str, str, str]]:
        f = rightsizing_findings.c
        rows = await self.session.execute(
            select(f.gpu_uuid, f.namespace, f.pod, f.container, f.kind).where(f.ended_at.is_(None))
        )
        return [(r.gpu_uuid, r.namespace, r.pod, r.container, r.kind) for r in rows]

    async def end_for_pods(self, job_id: str, pods: Sequence[str], at: datetime) -> None:
        if not pods:
            return
        f = rightsizing_findings.c
        await self.session.execute(
            update(rightsizing_findings)
            .where(f.pod.in_(list(pods)), f.job_id.in_([job_id, UNKNOWN]), f.ended_at.is_(None))
            .values(ended_at=at)
        )
