"""Telemetry's unit of work: its repositories on one transaction, with the outbox and the inbox."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from tessera.core.db.uow import UnitOfWork
from tessera.telemetry.adapters.repository import (
    FindingRepository,
    InventoryRepository,
    RollupRepository,
    SqlFindingRepository,
    SqlInventoryRepository,
    SqlRollupRepository,
)


class TelemetryUnitOfWork(UnitOfWork):
    inventory: InventoryRepository
    rollups: RollupRepository
    findings: FindingRepository

    def open_repositories(self, session: AsyncSession) -> None:
        self.inventory = SqlInventoryRepository(session)
        self.rollups = SqlRollupRepository(session)
        self.findings = SqlFindingRepository(session)
