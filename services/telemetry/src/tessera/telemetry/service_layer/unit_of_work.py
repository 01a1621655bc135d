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
from tessera.telemetry.adapters.usage_repository import (
    JobDirectoryRepository,
    RightsizingRepository,
    SqlJobDirectoryRepository,
    SqlRightsizingRepository,
    SqlUsageRepository,
    UsageRepository,
)


class TelemetryUnitOfWork(UnitOfWork):
    inventory: InventoryRepository
    rollups: RollupRepository
    findings: FindingRepository
    directory: JobDirectoryRepository
    usage: UsageRepository
    rightsizing: RightsizingRepository

    def open_repositories(self, session: AsyncSession) -> None:
        self.inventory = SqlInventoryRepository(session)
        self.rollups = SqlRollupRepository(session)
        self.findings = SqlFindingRepository(session)
        self.directory = SqlJobDirectoryRepository(session)
        self.usage = SqlUsageRepository(session)
        self.rightsizing = SqlRightsizingRepository(session)
