"""Admission's unit of work: one transaction, with the repositories the handlers and the cycle
use opened on it. Jobs the repositories load or add are tracked, so `commit()` writes the events
they recorded into the outbox, each in its job's trace."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tessera.admission.adapters.config_repository import ConfigRepository
from tessera.admission.adapters.cycle_records import CycleGate as SqlCycleGate
from tessera.admission.adapters.cycle_records import CycleRecordRepository
from tessera.admission.adapters.inventory import InventoryRepository
from tessera.admission.adapters.repository import JobRepository
from tessera.admission.adapters.tokens import TokenRepository
from tessera.admission.service_layer.ports import (
    CycleGate,
    CycleRecords,
    Inventory,
    Jobs,
    QueueingConfigs,
    Tokens,
)
from tessera.core.db.uow import Aggregate, UnitOfWork

if TYPE_CHECKING:  # the session is only handed on to the adapters
    from sqlalchemy.ext.asyncio import AsyncSession


class AdmissionUnitOfWork(UnitOfWork):
    jobs: Jobs
    config: QueueingConfigs
    tokens: Tokens
    inventory: Inventory
    cycle_records: CycleRecords
    gate: CycleGate

    _tracked_ids: set[int]
    _tracked_in: list[Aggregate] | None = None

    def track(self, aggregate: Aggregate) -> None:
        """As the base class does, in constant time: a cycle tracks thousands of jobs, and the
        base class compares each new one with every one tracked before (quadratic)."""
        if self._tracked_in is not self._tracked:  # a new unit, or forgotten events: a new list
            self._tracked_in, self._tracked_ids = self._tracked, set()
        if id(aggregate) not in self._tracked_ids:  # ids are unique among the live, tracked objects
            self._tracked_ids.add(id(aggregate))
            self._tracked.append(aggregate)

    def open_repositories(self, session: AsyncSession) -> None:
        self.jobs = JobRepository(session, self.track)
        self.config = ConfigRepository(session)
        self.tokens = TokenRepository(session)
        self.inventory = InventoryRepository(session)
        self.cycle_records = CycleRecordRepository(session)
        self.gate = SqlCycleGate(session)
