"""The slicing service's unit of work: the events it records, its operations, node leases and pods' measured use, with the
outbox and inbox on one transaction. Operations the repository loads or adds are tracked, so `commit()`
writes the events they recorded into the outbox."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tessera.core.recording.service_layer import RecordingUnitOfWork
from tessera.slicing.adapters import orm
from tessera.slicing.adapters.repository import (
    LeaseRepository,
    OperationRepository,
    SignalRepository,
    SqlLeaseRepository,
    SqlOperationRepository,
    SqlSignalRepository,
)
from tessera.slicing.adapters.usage_repository import SqlUsageRepository, UsageRepository

if TYPE_CHECKING:  # the session is only handed on to the adapters
    from sqlalchemy.ext.asyncio import AsyncSession


class SlicingUnitOfWork(RecordingUnitOfWork):
    observed_table = orm.observed_events
    operations: OperationRepository
    leases: LeaseRepository
    signals: SignalRepository
    usage: UsageRepository

    def open_repositories(self, session: AsyncSession) -> None:
        super().open_repositories(session)
        self.operations = SqlOperationRepository(session, self.track)
        self.leases = SqlLeaseRepository(session)
        self.signals = SqlSignalRepository(session)
        self.usage = SqlUsageRepository(session)
