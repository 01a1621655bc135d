"""Telemetry's use cases: keep the inventory and announce it when it changes."""

from __future__ import annotations

from datetime import datetime, timedelta

from tessera.contracts.events import InventoryChanged, NodeInventory
from tessera.telemetry.domain.model import Announcement, announcement_due, inventory_digest
from tessera.telemetry.service_layer.unit_of_work import TelemetryUnitOfWork


async def sync_inventory(
    uow: TelemetryUnitOfWork,
    source: str,
    nodes: list[NodeInventory],
    republish_after: timedelta,
    now: datetime,
) -> bool:
    """Store the inventory and publish `inventory_changed` when it differs from the last one announced,
    or when that announcement is older than `republish_after`; True when it was announced."""
    digest = inventory_digest(nodes)
    if not announcement_due(await uow.inventory.last_announcement(source), digest, now, republish_after):
        return False
    await uow.inventory.replace_nodes(nodes)
    await uow.inventory.record_announcement(source, Announcement(digest, now))
    await uow.publish(InventoryChanged(source=source, nodes=nodes))
    return True
