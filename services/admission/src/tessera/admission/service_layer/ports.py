"""What the service layer needs from storage, one protocol per repository. The Postgres
repositories in `adapters/` implement them; unit tests install in-memory ones."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from tessera.admission.domain.documents import StoredConfig
from tessera.admission.domain.model import Job, JobCheckpoint
from tessera.admission.domain.queueing import InFlightPreemption
from tessera.admission.domain.queueing.model import DrainingVictim
from tessera.admission.domain.queueing.resources import FlavorResource
from tessera.admission.domain.workloads import ActiveJob


class Jobs(Protocol):
    """Jobs it loads or adds are tracked by the unit of work, which publishes their events."""

    async def add(self, job: Job, workload: Mapping[str, Any] | None = None) -> bool: ...
    async def get(self, job_id: str, *, for_update: bool = False) -> Job | None: ...
    async def get_many(self, ids: Sequence[str]) -> dict[str, Job]:
        """In the order of `ids`, which is the order their events are published in."""

    async def active(self) -> list[ActiveJob]: ...
    async def save(self, job: Job) -> None: ...
    async def save_all(self, changed: Iterable[Job]) -> None: ...
    async def list(
        self,
        *,
        tenant: str | None = None,
        state: str | None = None,
        queue: str | None = None,
        limit: int = 100,
    ) -> list[Job]: ...


class Checkpoints(Protocol):
    """The checkpoints jobs saved (a job loaded through `Jobs` comes with its newest one)."""

    async def add(self, job_id: str, checkpoint: JobCheckpoint, request_id: str | None = None) -> bool:
        """Record a checkpoint of a known job; False when it is recorded already."""

    async def of_jobs(self, job_ids: Collection[str], limit: int = 100) -> dict[str, list[JobCheckpoint]]:
        """Each job's checkpoints, newest first, at most `limit` per job."""

    async def latest_times(self, job_ids: Collection[str]) -> dict[str, datetime]:
        """When each job that saved any saved its newest checkpoint."""


class QueueingConfigs(Protocol):
    async def load(self) -> StoredConfig: ...
    async def save(self, before: StoredConfig, after: StoredConfig) -> None: ...


class Tokens(Protocol):
    async def add(self, sha256: str, tenant: str | None, admin: bool = False) -> None: ...
    async def find(self, sha256: str) -> tuple[str | None, bool] | None: ...


class Inventory(Protocol):
    async def replace_source(
        self, source: str, nodes: Mapping[str, Sequence[Mapping[str, Any]]], at: datetime
    ) -> None: ...
    async def nodes(self) -> list[tuple[str, list[dict[str, Any]]]]: ...
    async def record_placement(
        self, job_id: str, pods: Sequence[Mapping[str, Any]], at: datetime
    ) -> None: ...
    async def release_placement(self, job_id: str) -> None: ...
    async def placements_of(self, job_ids: Collection[str]) -> dict[str, list[dict[str, Any]]]: ...


class CycleRecords(Protocol):
    async def preemptions(self) -> tuple[list[InFlightPreemption], list[DrainingVictim]]: ...
    async def save_preemptions(
        self, inflight: Sequence[InFlightPreemption], draining: Iterable[DrainingVictim]
    ) -> None: ...
    async def fair_share(self) -> dict[str, tuple[dict[FlavorResource, float], datetime]]: ...
    async def save_fair_share(
        self, history: Mapping[str, Mapping[FlavorResource, float]], sampled_at: datetime
    ) -> None: ...


class CycleGate(Protocol):
    """One admission cycle at a time, and changes that wait for it (see `adapters.cycle_records`)."""

    async def lock(self) -> None: ...
    async def hold_off(self) -> None: ...
    async def mark_changed(self) -> None: ...
    async def change_mark(self) -> int: ...
