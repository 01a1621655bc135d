"""The queueing configuration in Postgres: flavors, cohorts, queues, tenant queues, priority
classes and the policy row. Documents are stored as JSON, checked by the domain on every write."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table, delete, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from tessera.admission.adapters.orm import (
    cohorts,
    flavors,
    policy,
    priority_classes,
    queues,
    tenant_queues,
)
from tessera.admission.domain.documents import (
    CohortDoc,
    FairSharingDoc,
    FlavorDoc,
    PriorityClassDoc,
    QueueDoc,
    StoredConfig,
    TenantQueueDoc,
    TimingDoc,
)

__all__ = ["ConfigRepository", "StoredConfig"]


class ConfigRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def load(self) -> StoredConfig:
        s = self.session
        pol = (await s.execute(select(policy).where(policy.c.id == 1))).mappings().first()
        return StoredConfig(
            [
                FlavorDoc(
                    name=r.name,
                    gpu_model=r.gpu_model,
                    capacity_type=r.capacity_type,
                    node_labels=r.node_labels,
                    tolerations=r.tolerations,
                )
                for r in await s.execute(select(flavors).order_by(flavors.c.name))
            ],
            [
                CohortDoc(name=r.name, parent=r.parent, quotas=r.quotas)
                for r in await s.execute(select(cohorts).order_by(cohorts.c.name))
            ],
            [
                QueueDoc(
                    name=r.name,
                    cohort=r.cohort,
                    quotas=r.quotas,
                    strategy=r.strategy,
                    preemption=r.preemption,
                    fair_share_weight=r.fair_share_weight,
                )
                for r in await s.execute(select(queues).order_by(queues.c.name))
            ],
            [TenantQueueDoc(tenant=r.tenant, queue=r.queue) for r in await s.execute(select(tenant_queues))],
            [
                PriorityClassDoc(name=r.name, value=r.value, description=r.description)
                for r in await s.execute(select(priority_classes))
            ],
            FairSharingDoc.model_validate(pol["fair_sharing"]) if pol and pol["fair_sharing"] else None,
            TimingDoc.model_validate(pol["timing"]) if pol and pol["timing"] else None,
        )

    async def save(self, before: StoredConfig, after: StoredConfig) -> None:
        """Write `after`, deleting what `before` had and `after` lacks. Check `after` first."""
        await self._sync(flavors, "name", before.flavors, after.flavors)
        await self._sync(cohorts, "name", before.cohorts, after.cohorts)
        await self._sync(queues, "name", before.queues, after.queues)
        await self._sync(tenant_queues, "tenant", before.tenant_queues, after.tenant_queues)
        await self._sync(priority_classes, "name", before.priority_classes, after.priority_classes)
        values = {
            "fair_sharing": after.fair_sharing.model_dump(mode="json") if after.fair_sharing else {},
            "timing": after.timing.model_dump(mode="json") if after.timing else {},
        }
        stmt = pg_insert(policy).values(id=1, **values)
        await self.session.execute(stmt.on_conflict_do_update(index_elements=[policy.c.id], set_=values))

    async def _sync(self, table: Table, key: str, before: list[Any], after: list[Any]) -> None:
        gone = {getattr(b, key) for b in before} - {getattr(a, key) for a in after}
        if gone:
            await self.session.execute(delete(table).where(table.c[key].in_(gone)))
        old = {getattr(b, key): b for b in before}
        for doc in after:
            if old.get(getattr(doc, key)) == doc:
                continue
            row = doc.model_dump(mode="json")
            stmt = pg_insert(table).values(**row)
            update = {k: v for k, v in row.items() if k != key}
            await self.session.execute(
                stmt.on_conflict_do_update(index_elements=[table.c[key]], set_=update)
                if update
                else stmt.on_conflict_do_nothing()
            )
