"""The scheduler's unit of work in memory, for handler and engine tests with no I/O.

`FakeSchedulerRepository` keeps what `SqlSchedulerRepository` stores in plain collections, with
the same rules (a repeated pending gang is not queued again, a withdrawal forces an earlier request,
a source's report replaces only that source's nodes). Each unit works on a copy of what was
committed: a commit keeps the copy and runs the after-commit callbacks; leaving without one drops both.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any

import pytest

from tessera.contracts.events import NodeInventory, PreemptionRequested, ReadyForEviction
from tessera.contracts.jobs import JobSpec
from tessera.scheduler.domain.placement.model import PodShape
from tessera.scheduler.domain.placement.observed_workload import placed_shape
from tessera.scheduler.service_layer.repository_port import (
    JOB,
    PendingGang,
    PlacementRow,
    Preemption,
    ready_reason,
)
from tessera.scheduler.service_layer.unit_of_work import SchedulerUnitOfWork
from tessera.testing.fakes import FakeUnitOfWork

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class StoredNode:
    source: str
    inventory: NodeInventory
    updated_at: datetime


@dataclass
class StoredPreemption:
    preemptor_job_id: str
    reason: str
    deadline: datetime
    grace_period_s: int
    checkpointable: bool
    forced: bool
    requested_at: int


@dataclass
class SchedulerStore:
    """Everything the scheduler's schema holds, plus the sample sizes the loop asked for."""

    version: int = 0
    nodes: dict[str, StoredNode] = field(default_factory=dict)
    pending: dict[str, PendingGang] = field(default_factory=dict)
    placements: dict[str, PlacementRow] = field(default_factory=dict)
    """By pod, oldest placement first."""
    preemptions: dict[str, StoredPreemption] = field(default_factory=dict)
    ready: dict[tuple[str, str], ReadyForEviction] = field(default_factory=dict)
    """The checkpoint service's answers, by victim and preemptor."""
    writes: int = 0
    samples: list[int] = field(default_factory=list)
    """The ``limit`` of each ``recent_gpu_shapes`` call."""

    def tick(self) -> int:
        self.writes += 1
        return self.writes


class FakeSchedulerRepository:
    def __init__(self, store: SchedulerStore) -> None:
        self.store = store

    async def flush(self) -> None:
        return None

    async def lock_for_decision(self) -> None:
        pass

    async def decision_version(self) -> int:
        return self.store.version

    async def bump_decision_version(self) -> int:
        self.store.version += 1
        return self.store.version

    async def replace_inventory(self, source: str, nodes: list[NodeInventory]) -> None:
        names = {node.name for node in nodes}
        self.store.nodes = {
            name: stored
            for name, stored in self.store.nodes.items()
            if stored.source != source or name in names
        }
        for node in nodes:
            self.store.nodes[node.name] = StoredNode(
                source, node, EPOCH + timedelta(seconds=self.store.tick())
            )

    async def mark_gpu_unhealthy(self, node: str, gpu_uuid: str) -> None:
        stored = self.store.nodes.get(node)
        if stored is None:
            return
        gpus = [
            gpu.model_copy(update={"healthy": False}) if gpu.uuid == gpu_uuid else gpu
            for gpu in stored.inventory.gpus
        ]
        stored.inventory = stored.inventory.model_copy(update={"gpus": gpus})
        stored.updated_at = EPOCH + timedelta(seconds=self.store.tick())

    async def inventory_stamp(self) -> tuple[int, datetime | None]:
        stamps = [stored.updated_at for stored in self.store.nodes.values()]
        return len(stamps), max(stamps, default=None)

    async def inventory(self) -> list[NodeInventory]:
        return [self.store.nodes[name].inventory for name in sorted(self.store.nodes)]

    async def add_pending(
        self,
        job_id: str,
        spec: JobSpec | None,
        submitted_at: datetime,
        *,
        source: str = JOB,
        priority: int | None = None,
        trace: Mapping[str, str] | None = None,
        resume_from: str | None = None,
    ) -> bool:
        if job_id in self.store.pending:
            return False
        self.store.pending[job_id] = PendingGang(
            job_id=job_id,
            source=source,
            spec=spec,
            priority=priority if priority is not None else (spec.priority if spec else 0),
            submitted_at=submitted_at,
            attempts=0,
            reason_code="",
            last_reason="",
            backoff_until=None,
            trace=dict(trace or {}),
            resume_from=resume_from,
        )
        return True

    async def pending(self, only: Iterable[str] | None = None) -> list[PendingGang]:
        wanted = set(only) if only is not None else None
        rows = [row for row in self.store.pending.values() if wanted is None or row.job_id in wanted]
        return sorted(rows, key=lambda row: (-row.priority, row.submitted_at, row.job_id))

    async def pending_ids(self) -> set[str]:
        return set(self.store.pending)

    async def record_requeued(
        self, job_id: str, attempts: int, reason_code: str, message: str, backoff_until: float
    ) -> None:
        row = self.store.pending.get(job_id)
        if row is not None:
            self.store.pending[job_id] = replace(
                row,
                attempts=attempts,
                reason_code=reason_code,
                last_reason=message,
                backoff_until=datetime.fromtimestamp(backoff_until, UTC),
            )

    async def remove_pending(self, job_id: str) -> None:
        self.store.pending.pop(job_id, None)

    async def record_placements(self, rows: Iterable[PlacementRow]) -> None:
        for row in rows:
            self.store.placements.setdefault(row.pod, row)

    async def placements(self) -> list[PlacementRow]:
        return list(self.store.placements.values())

    async def recent_gpu_shapes(self, limit: int) -> list[PodShape]:
        self.store.samples.append(limit)
        newest_first = [row for row in reversed(self.store.placements.values()) if row.gpus][:limit]
        shapes = (placed_shape(row.gpus, row.cpu_milli, row.memory_mib) for row in newest_first)
        return [shape for shape in shapes if shape is not None]

    async def is_placed(self, job_id: str) -> bool:
        return any(row.job_id == job_id for row in self.store.placements.values())

    async def release_pod(self, pod: str) -> None:
        self.store.placements.pop(pod, None)

    async def release_job(self, job_id: str) -> None:
        self.store.placements = {
            pod: row for pod, row in self.store.placements.items() if row.job_id != job_id
        }

    async def add_preemption(self, request: PreemptionRequested) -> None:
        earlier = self.store.preemptions.get(request.victim_job_id)
        self.store.preemptions[request.victim_job_id] = StoredPreemption(
            preemptor_job_id=request.preemptor_job_id,
            reason=request.reason,
            deadline=request.deadline,
            grace_period_s=int(request.grace_period_s),
            checkpointable=request.checkpointable,
            forced=request.forced,
            requested_at=earlier.requested_at if earlier else self.store.tick(),
        )

    async def add_withdrawal(self, job_id: str, reason: str, at_time: datetime) -> None:
        earlier = self.store.preemptions.get(job_id)
        if earlier is not None:
            earlier.forced = True
            return
        self.store.preemptions[job_id] = StoredPreemption(
            preemptor_job_id="",
            reason=reason,
            deadline=at_time,
            grace_period_s=0,
            checkpointable=False,
            forced=True,
            requested_at=self.store.tick(),
        )

    async def mark_ready_for_eviction(self, event: ReadyForEviction) -> None:
        self.store.ready[(event.job_id, event.preemptor_job_id or "")] = event

    async def due_preemptions(self, now: float) -> list[Preemption]:
        due = [
            (stored.requested_at, job_id, stored, self.store.ready.get((job_id, stored.preemptor_job_id)))
            for job_id, stored in self.store.preemptions.items()
        ]
        return [
            Preemption(
                job_id,
                stored.preemptor_job_id,
                stored.reason,
                stored.grace_period_s,
                ready_reason(ready.reason, ready.step, ready.checkpoint_uri) if ready else None,
            )
            for _, job_id, stored, ready in sorted(due, key=lambda item: item[:2])
            if not stored.checkpointable
            or stored.forced
            or stored.deadline.timestamp() <= now
            or ready is not None
        ]

    async def next_preemption_deadline(self) -> float | None:
        deadlines = [stored.deadline.timestamp() for stored in self.store.preemptions.values()]
        return min(deadlines, default=None)

    async def remove_preemption(self, job_id: str) -> None:
        self.store.preemptions.pop(job_id, None)
        self.store.ready = {key: ready for key, ready in self.store.ready.items() if key[0] != job_id}


class FakeSchedulerUnitOfWork(FakeUnitOfWork, SchedulerUnitOfWork):
    """``stored`` is what committed units left; ``repo`` is the open unit's copy of it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stored = SchedulerStore()
        self._callbacks: list[Callable[[], None]] = []

    def open_repositories(self, session: object) -> None:
        self.repo = FakeSchedulerRepository(copy.deepcopy(self.stored))
        self._callbacks = []

    def after_commit(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    async def commit(self) -> None:
        await super().commit()
        assert isinstance(self.repo, FakeSchedulerRepository)
        self.stored = self.repo.store
        self.repo = FakeSchedulerRepository(copy.deepcopy(self.stored))
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await super().__aexit__(exc_type, exc, tb)
        self._callbacks = []


@pytest.fixture
def uow() -> FakeSchedulerUnitOfWork:
    return FakeSchedulerUnitOfWork()
