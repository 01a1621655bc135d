"""The cluster as admission sees it: telemetry's GPU inventory per node, and the scheduler's
placements of the jobs that hold quota (which GPUs they use)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from tessera.admission.adapters.orm import inventory_nodes, placements
from tessera.admission.adapters.repository import ids_param


class InventoryRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def replace_source(
        self,
        source: str,
        nodes: Mapping[str, Sequence[Mapping[str, Any]]],
        at: datetime,
        labels: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        """`source` now reports exactly `nodes` (name -> its GPUs) with their `labels` (by name);
        its other nodes are gone."""
        labels = labels or {}
        await self.session.execute(
            delete(inventory_nodes).where(
                inventory_nodes.c.source == source, inventory_nodes.c.name.not_in(list(nodes))
            )
        )
        if not nodes:
            return
        stmt = pg_insert(inventory_nodes)
        await self.session.execute(
            stmt.on_conflict_do_update(
                index_elements=[inventory_nodes.c.name],
                set_={
                    "source": stmt.excluded.source,
                    "gpus": stmt.excluded.gpus,
                    "labels": stmt.excluded.labels,
                    "updated_at": stmt.excluded.updated_at,
                },
            ),
            [
                {
                    "name": name,
                    "source": source,
                    "gpus": list(gpus),
                    "labels": dict(labels.get(name, {})),
                    "updated_at": at,
                }
                for name, gpus in nodes.items()
            ],
        )

    async def nodes(self) -> list[tuple[str, list[dict[str, Any]]]]:
        """Every node with its GPUs as telemetry reported them."""
        return [(r.name, list(r.gpus)) for r in await self.session.execute(select(inventory_nodes))]

    async def node_labels(self) -> dict[str, dict[str, str]]:
        rows = await self.session.execute(select(inventory_nodes.c.name, inventory_nodes.c.labels))
        return {r.name: dict(r.labels or {}) for r in rows}

    async def record_placement(self, job_id: str, pods: Sequence[Mapping[str, Any]], at: datetime) -> None:
        stmt = pg_insert(placements).values(job_id=job_id, pods=list(pods), placed_at=at)
        await self.session.execute(
            stmt.on_conflict_do_update(
                index_elements=[placements.c.job_id], set_={"pods": stmt.excluded.pods}
            )
        )

    async def release_placement(self, job_id: str) -> None:
        await self.session.execute(delete(placements).where(placements.c.job_id == job_id))

    async def placements_of(self, job_ids: Collection[str]) -> dict[str, list[dict[str, Any]]]:
        """Job id -> its placed pods (with the GPUs each uses), for the jobs that have one."""
        if not job_ids:
            return {}
        rows = await self.session.execute(
            select(placements.c.job_id, placements.c.pods).where(placements.c.job_id == ids_param(job_ids))
        )
        return {r.job_id: list(r.pods) for r in rows}
