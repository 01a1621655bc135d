"""Store what the monitor observed, and publish the findings people and services act on.

Rollups, findings and the events that announce them are written in one transaction (the outbox),
so a finding is published exactly when it is stored.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import and_, delete, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from tessera.contracts.events import GpuIdle, GpuUnhealthy
from tessera.core.db.uow import UnitOfWork
from tessera.telemetry.adapters.orm import gpu_findings, gpu_rollups, gpus
from tessera.telemetry.domain.health import BecameUnhealthy
from tessera.telemetry.domain.idle import BecameIdle
from tessera.telemetry.domain.monitor import Monitor, Observation

UNHEALTHY = "unhealthy"
IDLE = "idle"


async def record_observation(uow: UnitOfWork, observation: Observation) -> None:
    if observation.rollups:
        rows = [
            {
                "gpu_uuid": r.gpu_uuid,
                "window_start": r.window_start,
                "node": r.node,
                "gpu_index": r.gpu_index,
                "samples": r.samples,
                "utilization_mean_pct": r.utilization_mean_pct,
                "utilization_max_pct": r.utilization_max_pct,
                "memory_mean_mib": r.memory_mean_mib,
                "memory_max_mib": r.memory_max_mib,
                "power_mean_w": r.power_mean_w,
                "power_max_w": r.power_max_w,
                "temperature_mean_c": r.temperature_mean_c,
                "temperature_max_c": r.temperature_max_c,
            }
            for r in observation.rollups
        ]
        stmt = pg_insert(gpu_rollups)
        await uow.session.execute(
            stmt.on_conflict_do_update(
                constraint="pk_gpu_rollups",
                set_={c: stmt.excluded[c] for c in rows[0] if c not in ("gpu_uuid", "window_start")},
            ),
            rows,
        )
    for change in observation.health:
        uuid = change.reading.gpu_uuid
        if isinstance(change, BecameUnhealthy):
            r, finding = change.reading, change.finding
            event = GpuUnhealthy(
                node=r.node,
                gpu_index=r.gpu_index,
                gpu_uuid=uuid,
                faults=[f.value for f in finding.faults],
                reasons=list(finding.faults.values()),
                at=r.at,
                xid=finding.xid,
            )
            await _open_finding(
                uow, UNHEALTHY, r.gpu_uuid, r.node, r.gpu_index, r.at, event.model_dump(mode="json")
            )
            await uow.session.execute(
                update(gpus).where(gpus.c.uuid == uuid).values(healthy=False, updated_at=r.at)
            )
            await uow.publish(event)
        else:
            await _end_finding(uow, UNHEALTHY, uuid, change.reading.at)
            await uow.session.execute(
                update(gpus).where(gpus.c.uuid == uuid).values(healthy=True, updated_at=change.reading.at)
            )
    for idle in observation.idle:
        if isinstance(idle, BecameIdle):
            r = idle.reading
            idle_event = GpuIdle(
                node=r.node,
                gpu_index=r.gpu_index,
                gpu_uuid=r.gpu_uuid,
                pods=list(r.pods or ()),
                idle_since=idle.idle_since,
                at=r.at,
                mean_utilization_pct=idle.mean_utilization_pct,
                memory_used_mib=r.memory_used_mib,
            )
            detail = idle_event.model_dump(mode="json")
            await _open_finding(uow, IDLE, r.gpu_uuid, r.node, r.gpu_index, idle.idle_since, detail)
            await uow.publish(idle_event)
        else:
            await _end_finding(uow, IDLE, idle.gpu_uuid, idle.at)


async def _open_finding(
    uow: UnitOfWork, kind: str, uuid: str, node: str, index: int, since: datetime, detail: dict[str, object]
) -> None:
    stmt = pg_insert(gpu_findings).values(
        gpu_uuid=uuid, kind=kind, node=node, gpu_index=index, since=since, detail=detail
    )
    await uow.session.execute(
        stmt.on_conflict_do_nothing(
            index_elements=[gpu_findings.c.gpu_uuid, gpu_findings.c.kind],
            index_where=gpu_findings.c.ended_at.is_(None),
        )
    )


async def _end_finding(uow: UnitOfWork, kind: str, uuid: str, at: datetime) -> None:
    await uow.session.execute(
        update(gpu_findings)
        .where(
            and_(
                gpu_findings.c.gpu_uuid == uuid,
                gpu_findings.c.kind == kind,
                gpu_findings.c.ended_at.is_(None),
            )
        )
        .values(ended_at=at)
    )


async def restore_findings(uow: UnitOfWork, monitor: Monitor) -> int:
    """Seed the monitor with the findings still open, so a restart does not report them again."""
    rows = (
        await uow.session.execute(
            select(
                gpu_findings.c.gpu_uuid, gpu_findings.c.kind, gpu_findings.c.since, gpu_findings.c.detail
            ).where(gpu_findings.c.ended_at.is_(None))
        )
    ).all()
    for row in rows:
        if row.kind == UNHEALTHY:
            monitor.health.seed_unhealthy(row.gpu_uuid)
        elif row.kind == IDLE:
            pods = tuple(str(p) for p in (row.detail or {}).get("pods", ()))
            monitor.idle.seed_idle(row.gpu_uuid, pods, row.since)
    return len(rows)


async def prune_rollups(uow: UnitOfWork, older_than: timedelta, now: datetime) -> int:
    result = await uow.session.execute(
        delete(gpu_rollups).where(gpu_rollups.c.window_start < now - older_than)
    )
    return int(getattr(result, "rowcount", 0) or 0)
