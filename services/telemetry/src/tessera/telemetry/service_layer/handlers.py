"""Telemetry's use cases: keep the inventory and announce it when it changes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from tessera.contracts.events import InventoryChanged, NodeInventory
from tessera.core.db.uow import UnitOfWork
from tessera.telemetry.adapters.orm import gpus, published_inventory
from tessera.telemetry.domain.model import inventory_digest


async def sync_inventory(
    uow: UnitOfWork, source: str, nodes: list[NodeInventory], republish_after: timedelta
) -> bool:
    """Store the inventory; publish `inventory_changed` when it differs from the last one announced, or
    when that announcement is older than `republish_after` (streams of samples keep a short max-age)."""
    digest = inventory_digest(nodes)
    row = (
        await uow.session.execute(
            select(published_inventory.c.digest, published_inventory.c.published_at)
            .where(published_inventory.c.source == source)
            .with_for_update()
        )
    ).first()
    now = datetime.now(UTC)
    if row is not None and row.digest == digest and now - row.published_at < republish_after:
        return False
    node_names = [n.name for n in nodes]
    await uow.session.execute(delete(gpus).where(gpus.c.node.in_(node_names)))
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
        await uow.session.execute(pg_insert(gpus), rows)
    stmt = pg_insert(published_inventory).values(source=source, digest=digest, published_at=now)
    await uow.session.execute(
        stmt.on_conflict_do_update(
            index_elements=[published_inventory.c.source], set_={"digest": digest, "published_at": now}
        )
    )
    await uow.publish(InventoryChanged(source=source, nodes=nodes))
    return True
