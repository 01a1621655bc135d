"""Admission's unit of work: one transaction, with the repositories the handlers and the cycle
use opened on it. Jobs the repositories load or add are tracked, so `commit()` writes the events
they recorded into the outbox, each in its job's trace."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tessera.admission.adapters.checkpoints import CheckpointRepository
from tessera.admission.adapters.config_repository import ConfigRepository
from tessera.admission.adapters.cycle_records import CycleGate as SqlCycleGate
from tessera.admission.adapters.cycle_records import CycleRecordRepository
from tessera.admission.adapters.inventory import InventoryRepository
from tessera.admission.adapters.repository import JobRepository
from tessera.admission.adapters.tokens import IdempotencyKeyRepository, TokenRepository
from tessera.admission.adapters.workloads import WorkloadRepository
from tessera.admission.service_layer.ports import (
    Checkpoints,
    CycleGate,
    CycleRecords,
    IdempotencyKeys,
    Inventory,
    Jobs,
    QueueingConfigs,
    Tokens,
    Workloads,
)
from tessera.core.db.uow import UnitOfWork

if TYPE_CHECKING:  # the session is only handed on to the adapters
    from sqlalchemy.ext.asyncio import AsyncSession


class AdmissionUnitOfWork(UnitOfWork):
    jobs: Jobs
    checkpoints: Checkpoints
    config: QueueingConfigs
    tokens: Tokens
    idempotency: IdempotencyKeys
    inventory: Inventory
    cycle_records: CycleRecords
    gate: CycleGate
    workloads: Workloads

    def open_repositories(self, session: AsyncSession) -> None:
        self.jobs = JobRepository(session, self.track)
        self.checkpoints = CheckpointRepository(session)
        self.config = ConfigRepository(session)
        self.tokens = TokenRepository(session)
        self.idempotency = IdempotencyKeyRepository(session)
        self.inventory = InventoryRepository(session)
        self.cycle_records = CycleRecordRepository(session)
        self.gate = SqlCycleGate(session)
        self.workloads = WorkloadRepository(session)
