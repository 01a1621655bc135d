"""The scheduler's view in Postgres: inventory, placements and pending gangs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import delete, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from tessera.contracts.events import NodeInventory, PodPlacement
from tessera.contracts.jobs import JobSpec
from tessera.scheduler.adapters.orm import inventory_nodes, pending_gangs, placements
from tessera.scheduler.domain.first_fit import FULL, FreeGpu, FreeNode

_SCHEDULING_LOCK = 0x7E55E7A  # one placement decision at a time across replicas


class SchedulerRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def lock_for_decision(self) -> None:
        await self.session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEDULING_LOCK})

    async def replace_inventory(self, source: str, nodes: list[NodeInventory]) -> None:
        names = [n.name for n in nodes]
        await self.session.execute(
            delete(inventory_nodes).where(
                inventory_nodes.c.source == source, inventory_nodes.c.name.not_in(names)
            )
        )
        for node in nodes:
            stmt = pg_insert(inventory_nodes).values(
                name=node.name, source=source, data=node.model_dump(mode="json")
            )
            await self.session.execute(
                stmt.on_conflict_do_update(
                    index_elements=[inventory_nodes.c.name],
                    set_={"data": stmt.excluded.data, "source": source, "updated_at": text("now()")},
                )
            )

    async def free_nodes(self) -> list[FreeNode]:
        """The inventory minus what placements hold, in node-name order (first fit is deterministic)."""
        rows = (
            await self.session.execute(select(inventory_nodes.c.data).order_by(inventory_nodes.c.name))
        ).all()
        nodes = {}
        for (data,) in rows:
            inv = NodeInventory.model_validate(data)
            nodes[inv.name] = FreeNode(
                inv.name,
                inv.cpu_milli,
                inv.memory_mib,
                [FreeGpu(g.index, g.uuid, g.model, FULL, g.healthy) for g in inv.gpus],
            )
        held = (await self.session.execute(select(placements))).mappings().all()
        for row in held:
            node = nodes.get(row["node"])
            if node is None:
                continue
            node.cpu_milli -= row["cpu_milli"]
            node.memory_mib -= row["memory_mib"]
            by_index = {g.index: g for g in node.gpus}
            for gpu in row["gpus"]:
                if gpu["index"] in by_index:
                    by_index[gpu["index"]].free_milli -= gpu["milli"]
        return list(nodes.values())

    async def add_pending(self, job_id: str, spec: JobSpec, submitted_at: datetime) -> None:
        await self.session.execute(
            pg_insert(pending_gangs)
            .values(
                job_id=job_id,
                priority=spec.priority,
                spec=spec.model_dump(mode="json"),
                submitted_at=submitted_at,
            )
            .on_conflict_do_nothing()
        )

    async def pending(self) -> list[tuple[str, JobSpec]]:
        rows = (
            await self.session.execute(
                select(pending_gangs.c.job_id, pending_gangs.c.spec).order_by(
                    pending_gangs.c.priority.desc(), pending_gangs.c.submitted_at, pending_gangs.c.job_id
                )
            )
        ).all()
        return [(job_id, JobSpec.model_validate(spec)) for job_id, spec in rows]

    async def is_placed(self, job_id: str) -> bool:
        return (
            await self.session.scalar(select(placements.c.pod).where(placements.c.job_id == job_id).limit(1))
        ) is not None

    async def record_placement(self, job_id: str, spec: JobSpec, pods: list[PodPlacement]) -> None:
        groups = {g.name: g for g in spec.pod_groups}
        rows: list[dict[str, Any]] = [
            {
                "job_id": job_id,
                "pod": p.pod,
                "pod_group": p.group,
                "node": p.node,
                "gpus": [g.model_dump() for g in p.gpus],
                "cpu_milli": groups[p.group].cpu_milli,
                "memory_mib": groups[p.group].memory_mib,
            }
            for p in pods
        ]
        await self.session.execute(pg_insert(placements), rows)
        await self.session.execute(delete(pending_gangs).where(pending_gangs.c.job_id == job_id))

    async def record_unschedulable(self, job_id: str, reason: str) -> None:
        await self.session.execute(
            update(pending_gangs)
            .where(pending_gangs.c.job_id == job_id)
            .values(attempts=pending_gangs.c.attempts + 1, last_reason=reason)
        )
