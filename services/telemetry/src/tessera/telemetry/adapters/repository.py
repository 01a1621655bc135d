"""Telemetry's state in Postgres: the GPU inventory and its last announcement, rollups, findings.

The protocols are what the service layer sees; the `Sql*` classes keep every query in this module.
Usage and cost accounting keeps its own in `usage_repository`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime
from typing import Protocol

from sqlalchemy import (
    delete,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from tessera.contracts.events import NodeInventory
from tessera.telemetry.adapters.orm import (
    gpu_findings,
    gpu_rollups,
    gpus,
    published_inventory,
)
from tessera.telemetry.domain.model import Announcement, FindingKind, GpuFinding
from tessera.telemetry.domain.rollups import Rollup


class InventoryRepository(Protocol):
    async def last_announcement(self, source: str) -> Announcement | None:
        """What `source` announced last; held until the unit ends, so two instances do not both announce."""
        ...

    async def replace_nodes(self, nodes: Sequence[NodeInventory]) -> None:
        """The stored GPUs of these nodes become exactly the ones listed."""
        ...

    async def record_announcement(self, source: str, announcement: Announcement) -> None: ...

    async def set_gpu_health(self, gpu_uuid: str, healthy: bool, at: datetime) -> None: ...


class RollupRepository(Protocol):
    async def save(self, rollups: Sequence[Rollup]) -> None:
        """Store each rollup, replacing one stored for the same GPU and window."""
        ...


class FindingRepository(Protocol):
    async def open(self, finding: GpuFinding) -> None:
        """Store an open finding; nothing changes when the GPU has one of that kind open already."""
        ...

    async def end(self, kind: FindingKind, gpu_uuid: str, at: datetime) -> None: ...

    async def open_findings(self) -> list[GpuFinding]: ...


class SqlInventoryRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def last_announcement(self, source: str) -> Announcement | None:
        row = (
            await self.session.execute(
                select(published_inventory.c.digest, published_inventory.c.published_at)
                .where(published_inventory.c.source == source)
                .with_for_update()
            )
        ).first()
        return None if row is None else Announcement(row.digest, row.published_at)

    async def replace_nodes(self, nodes: Sequence[NodeInventory]) -> None:
        await self.session.execute(delete(gpus).where(gpus.c.node.in_([n.name for n in nodes])))
        rows = [
            {
                "node": n.name,
                "gpu_index": g.index,
                "uuid": g.uuid,
                "model": g.model,
                "memory_mib": g.memory_mib,
                "healthy": g.healthy,
            }
            for n in nodes
            for g in n.gpus
        ]
        if rows:
            await self.session.execute(pg_insert(gpus), rows)

    async def record_announcement(self, source: str, announcement: Announcement) -> None:
        values = {"digest": announcement.digest, "published_at": announcement.at}
        stmt = pg_insert(published_inventory).values(source=source, **values)
        await self.session.execute(
            stmt.on_conflict_do_update(index_elements=[published_inventory.c.source], set_=values)
        )

    async def set_gpu_health(self, gpu_uuid: str, healthy: bool, at: datetime) -> None:
        await self.session.execute(
            update(gpus).where(gpus.c.uuid == gpu_uuid).values(healthy=healthy, updated_at=at)
        )


class SqlRollupRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def save(self, rollups: Sequence[Rollup]) -> None:
        if not rollups:
            return
        stmt = pg_insert(gpu_rollups)
        key = ("gpu_uuid", "window_start")
        await self.session.execute(
            stmt.on_conflict_do_update(
                constraint="pk_gpu_rollups",
                set_={c.name: stmt.excluded[c.name] for c in gpu_rollups.c if c.name not in key},
            ),
            [asdict(r) for r in rollups],
        )


class SqlFindingRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def open(self, finding: GpuFinding) -> None:
        stmt = pg_insert(gpu_findings).values(
            gpu_uuid=finding.gpu_uuid,
            kind=finding.kind.value,
            node=finding.node,
            gpu_index=finding.gpu_index,
            since=finding.since,
            detail=finding.detail,
        )
        await self.session.execute(
            stmt.on_conflict_do_nothing(
                index_elements=[gpu_findings.c.gpu_uuid, gpu_findings.c.kind],
                index_where=gpu_findings.c.ended_at.is_(None),
            )
        )

    async def end(self, kind: FindingKind, gpu_uuid: str, at: datetime) -> None:
        await self.session.execute(
            update(gpu_findings)
            .where(
                gpu_findings.c.gpu_uuid == gpu_uuid,
                gpu_findings.c.kind == kind.value,
                gpu_findings.c.ended_at.is_(None),
            )
            .values(ended_at=at)
        )

    async def open_findings(self) -> list[GpuFinding]:
        rows = await self.session.execute(
            select(
                gpu_findings.c.kind,
                gpu_findings.c.gpu_uuid,
                gpu_findings.c.node,
                gpu_findings.c.gpu_index,
                gpu_findings.c.since,
                gpu_findings.c.detail,
            ).where(gpu_findings.c.ended_at.is_(None))
        )
        return [
            GpuFinding(FindingKind(r.kind), r.gpu_uuid, r.node, r.gpu_index, r.since, r.detail or {})
            for r in rows
        ]
