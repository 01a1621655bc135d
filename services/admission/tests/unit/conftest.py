"""In-memory fakes of admission's repositories, and a unit of work that installs them.

The fakes keep what was saved across units of work (as the database would) and hand out copies,
so a handler that changes a job without saving it changes nothing. Like the Postgres repository,
jobs loaded in bulk come without their history, and saving appends only the new transitions."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from tessera.admission.domain.documents import QueueingDocument, StoredConfig
from tessera.admission.domain.model import ACTIVE, Job, JobCheckpoint
from tessera.admission.domain.queueing import InFlightPreemption
from tessera.admission.domain.queueing.model import DrainingVictim
from tessera.admission.domain.queueing.resources import FlavorResource
from tessera.admission.domain.tokens import TokenRecord, token_id
from tessera.admission.domain.workloads import ActiveJob
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork
from tessera.testing.fakes import FakeUnitOfWork


class InMemoryJobs:
    def __init__(self) -> None:
        self.stored: dict[str, Job] = {}
        self.workloads: dict[str, Mapping[str, Any]] = {}
        self.saves = 0
        self.loaded_in_bulk: list[set[str]] = []
        self._track: Callable[[Job], None] = lambda job: None
        self._known: dict[str, int] = {}

    def opened(self, track: Callable[[Job], None]) -> InMemoryJobs:
        self._track = track
        self._known = {}
        return self

    def _hand_out(self, job: Job, with_history: bool = True) -> Job:
        out = copy.deepcopy(job)
        if not with_history:
            out.history = []
        self._known[out.id] = len(out.history)
        self._track(out)
        return out

    async def add(self, job: Job, workload: Mapping[str, Any] | None = None) -> bool:
        if job.id in self.stored:
            return False
        self.stored[job.id] = _snapshot(job)
        if workload is not None:
            self.workloads[job.id] = copy.deepcopy(dict(workload))
        self._known[job.id] = len(job.history)
        self._track(job)
        return True

    async def get(self, job_id: str, *, for_update: bool = False) -> Job | None:
        job = self.stored.get(job_id)
        return None if job is None else self._hand_out(job)

    async def get_many(self, ids: Sequence[str]) -> dict[str, Job]:
        self.loaded_in_bulk.append(set(ids))
        return {i: self._hand_out(self.stored[i], with_history=False) for i in ids if i in self.stored}

    async def active(self) -> list[ActiveJob]:
        found = [j for j in self.stored.values() if j.state in ACTIVE and j.id in self.workloads]
        return [
            ActiveJob(
                j.id,
                j.tenant,
                j.queue,
                j.priority,
                j.state,
                j.submitted_at,
                copy.deepcopy(self.workloads[j.id]),
                j.flavors,
                j.admitted_at,
                j.waiting,
                j.preempted_by,
            )
            for j in sorted(found, key=lambda j: (j.submitted_at, j.id))
        ]

    async def save(self, job: Job) -> None:
        await self.save_all([job])

    async def save_all(self, changed: Iterable[Job]) -> None:
        for job in changed:
            known = self._known[job.id]
            new = job.history[known:]
            if not new:
                continue
            stored = self.stored[job.id]
            snapshot = _snapshot(job)
            snapshot.history = [*stored.history, *new]
            snapshot.trace_headers = stored.trace_headers  # stored once, at submission
            self.stored[job.id] = snapshot
            self._known[job.id] = len(job.history)
            self.saves += 1

    async def list(
        self,
        *,
        tenant: str | None = None,
        state: str | None = None,
        queue: str | None = None,
        limit: int = 100,
    ) -> list[Job]:
        found = [
            j
            for j in self.stored.values()
            if (not tenant or j.tenant == tenant)
            and (not state or j.state == state)
            and (not queue or j.queue == queue)
        ]
        return [copy.deepcopy(j) for j in sorted(found, key=lambda j: j.submitted_at, reverse=True)[:limit]]


def _snapshot(job: Job) -> Job:
    snapshot = copy.deepcopy(job)
    snapshot.events = []
    return snapshot


class InMemoryCheckpoints:
    """Checkpoints by job, as recorded. Like the database, a job handed out by `InMemoryJobs` carries
    its newest one because the job saved it (the handler records both)."""

    def __init__(self) -> None:
        self.by_job: dict[str, list[tuple[JobCheckpoint, str | None]]] = {}
        self.bulk_reads: list[set[str]] = []

    async def add(self, job_id: str, checkpoint: JobCheckpoint, request_id: str | None = None) -> bool:
        if any(c.id == checkpoint.id for cs in self.by_job.values() for c, _ in cs):
            return False
        self.by_job.setdefault(job_id, []).append((checkpoint, request_id))
        return True

    def _newest_first(self, job_id: str) -> list[JobCheckpoint]:
        return sorted((c for c, _ in self.by_job.get(job_id, [])), key=lambda c: c.order, reverse=True)

    async def of_jobs(self, job_ids: Collection[str], limit: int = 100) -> dict[str, list[JobCheckpoint]]:
        return {j: self._newest_first(j)[:limit] for j in job_ids if j in self.by_job}

    async def latest_times(self, job_ids: Collection[str]) -> dict[str, datetime]:
        self.bulk_reads.append(set(job_ids))
        return {j: self._newest_first(j)[0].at for j in job_ids if j in self.by_job}


class InMemoryConfig:
    def __init__(self) -> None:
        self.stored = StoredConfig()

    async def load(self) -> StoredConfig:
        return copy.deepcopy(self.stored)

    async def save(self, before: StoredConfig, after: StoredConfig) -> None:
        self.stored = copy.deepcopy(after)


class InMemoryTokens:
    def __init__(self) -> None:
        self.by_hash: dict[str, TokenRecord] = {}

    async def add(
        self, sha256: str, tenant: str | None, admin: bool = False, expires_at: datetime | None = None
    ) -> TokenRecord:
        record = TokenRecord(token_id(sha256), tenant, admin, datetime.now(UTC), expires_at)
        self.by_hash[sha256] = record
        return record

    async def find(self, sha256: str) -> TokenRecord | None:
        return self.by_hash.get(sha256)

    async def list(self, *, tenant: str | None = None) -> list[TokenRecord]:
        return [r for r in self.by_hash.values() if tenant is None or r.tenant == tenant]

    async def revoke(self, id_: str, at: datetime) -> TokenRecord | None:
        for sha256, record in self.by_hash.items():
            if record.id == id_:
                if record.revoked_at is None:
                    self.by_hash[sha256] = record = dataclasses.replace(record, revoked_at=at)
                return record
        return None


class InMemoryIdempotencyKeys:
    def __init__(self) -> None:
        self.keys: dict[tuple[str, str], tuple[str, str]] = {}

    async def find(self, tenant: str, key: str) -> tuple[str, str] | None:
        return self.keys.get((tenant, key))

    async def claim(self, tenant: str, key: str, body_sha256: str, job_id: str) -> bool:
        if (tenant, key) in self.keys:
            return False
        self.keys[tenant, key] = (body_sha256, job_id)
        return True


class InMemoryInventory:
    def __init__(self) -> None:
        self.nodes_by_name: dict[str, tuple[str, list[dict[str, Any]]]] = {}
        self.placements: dict[str, list[dict[str, Any]]] = {}
        self.labels: dict[str, dict[str, str]] = {}

    async def replace_source(
        self,
        source: str,
        nodes: Mapping[str, Sequence[Mapping[str, Any]]],
        at: datetime,
        labels: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        for name, (owner, _) in list(self.nodes_by_name.items()):
            if owner == source and name not in nodes:
                del self.nodes_by_name[name]
        for name, gpus in nodes.items():
            self.nodes_by_name[name] = (source, [dict(g) for g in gpus])
            self.labels[name] = dict((labels or {}).get(name, {}))

    async def nodes(self) -> list[tuple[str, list[dict[str, Any]]]]:
        return [(name, copy.deepcopy(gpus)) for name, (_, gpus) in self.nodes_by_name.items()]

    async def node_labels(self) -> dict[str, dict[str, str]]:
        return {name: dict(self.labels.get(name, {})) for name in self.nodes_by_name}

    async def record_placement(self, job_id: str, pods: Sequence[Mapping[str, Any]], at: datetime) -> None:
        self.placements[job_id] = [dict(p) for p in pods]

    async def release_placement(self, job_id: str) -> None:
        self.placements.pop(job_id, None)

    async def placements_of(self, job_ids: Collection[str]) -> dict[str, list[dict[str, Any]]]:
        return {j: copy.deepcopy(self.placements[j]) for j in job_ids if j in self.placements}


class InMemoryCycleRecords:
    def __init__(self) -> None:
        self.inflight: list[InFlightPreemption] = []
        self.draining: list[DrainingVictim] = []
        self.fair_share_history: dict[str, tuple[dict[FlavorResource, float], datetime]] = {}

    async def preemptions(self) -> tuple[list[InFlightPreemption], list[DrainingVictim]]:
        return list(self.inflight), list(self.draining)

    async def save_preemptions(
        self, inflight: Sequence[InFlightPreemption], draining: Iterable[DrainingVictim]
    ) -> None:
        self.inflight, self.draining = list(inflight), list(draining)

    async def fair_share(self) -> dict[str, tuple[dict[FlavorResource, float], datetime]]:
        return dict(self.fair_share_history)

    async def save_fair_share(
        self, history: Mapping[str, Mapping[FlavorResource, float]], sampled_at: datetime
    ) -> None:
        self.fair_share_history.update({q: (dict(h), sampled_at) for q, h in history.items()})


class FakeGate:
    def __init__(self) -> None:
        self.mark = 0
        self.locks = 0
        self.holds = 0
        self.turns = 0

    async def lock(self) -> None:
        self.locks += 1

    async def hold_off(self) -> None:
        self.holds += 1

    async def job_events_in_turn(self) -> None:
        self.turns += 1

    async def mark_changed(self) -> None:
        self.mark += 1

    async def change_mark(self) -> int:
        return self.mark


class FakeAdmissionUnitOfWork(FakeUnitOfWork, AdmissionUnitOfWork):
    def __init__(self) -> None:
        super().__init__()
        self.fake_jobs = InMemoryJobs()
        self.fake_checkpoints = InMemoryCheckpoints()
        self.fake_config = InMemoryConfig()
        self.fake_tokens = InMemoryTokens()
        self.fake_idempotency = InMemoryIdempotencyKeys()
        self.fake_inventory = InMemoryInventory()
        self.fake_cycle_records = InMemoryCycleRecords()
        self.fake_gate = FakeGate()

    def open_repositories(self, session: object) -> None:
        self.jobs = self.fake_jobs.opened(self.track)
        self.checkpoints = self.fake_checkpoints
        self.config = self.fake_config
        self.tokens = self.fake_tokens
        self.idempotency = self.fake_idempotency
        self.inventory = self.fake_inventory
        self.cycle_records = self.fake_cycle_records
        self.gate = self.fake_gate

    def configure(self, document: dict[str, Any]) -> None:
        """Store a queueing configuration as `tessera queues apply` would."""
        self.fake_config.stored = self.fake_config.stored.merged(QueueingDocument.model_validate(document))
        self.fake_config.stored.build()

    def job(self, job_id: str) -> Job:
        """The job as stored."""
        return self.fake_jobs.stored[job_id]


NOW = datetime(2026, 11, 21, 12, tzinfo=UTC)


@pytest.fixture
def uow() -> FakeAdmissionUnitOfWork:
    return FakeAdmissionUnitOfWork()
