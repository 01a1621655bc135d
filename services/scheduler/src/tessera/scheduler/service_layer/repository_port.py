"""What the service layer sees of the scheduler's state in Postgres (`adapters.repository` keeps
every query): the pending gangs with their queue state, placements and preemptions, and the
repository's protocol."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from tessera.contracts.events import NodeInventory, PreemptionRequested, ReadyForEviction
from tessera.contracts.jobs import JobSpec
from tessera.scheduler.domain.placement.model import PodShape

JOB = "job"
PODGROUP = "podgroup"


@dataclass(frozen=True)
class PendingGang:
    job_id: str
    source: str
    spec: JobSpec | None
    priority: int
    submitted_at: datetime
    attempts: int
    reason_code: str
    last_reason: str
    backoff_until: datetime | None
    trace: Mapping[str, str]
    resume_from: str | None = None
    """The checkpoint the job resumes from, handed to its pods."""


@dataclass(frozen=True)
class Preemption:
    job_id: str
    preemptor_job_id: str
    reason: str
    grace_period_s: int
    ready: str | None = None
    """Why the checkpoint service let the victim go (``checkpoint_saved at step N (uri)``, ...); none
    when it went because it cannot checkpoint, was forced, or reached its deadline unanswered."""


@dataclass(frozen=True)
class PlacementRow:
    job_id: str
    pod: str
    pod_group: str
    node: str
    gpus: tuple[tuple[int, int], ...]
    cpu_milli: int
    memory_mib: int


class SchedulerRepository(Protocol):
    """The scheduler's stored state, as the handlers and the scheduling loop use it."""

    # -- decisions: one at a time across replicas ------------------------------------------------

    async def lock_for_decision(self) -> None:
        """Hold the scheduling lock until the transaction ends. From then on, the cycle's writes to
        placements and pending gangs are held back and sent together (see :meth:`flush`)."""
        ...

    async def flush(self) -> None:
        """Send the writes held back; reads, other writes and the commit do it first themselves."""
        ...

    async def decision_version(self) -> int: ...

    async def bump_decision_version(self) -> int:
        """Record that this cycle decided something; returns the new version."""
        ...

    # -- inventory -------------------------------------------------------------------------------

    async def replace_inventory(self, source: str, nodes: list[NodeInventory]) -> None:
        """The nodes ``source`` reports become exactly ``nodes`` (others' nodes stay)."""
        ...

    async def mark_gpu_unhealthy(self, node: str, gpu_uuid: str) -> None:
        """Keep a GPU's fault in the stored inventory until the next report; unknown nodes are ignored."""
        ...

    async def inventory_stamp(self) -> tuple[int, datetime | None]:
        """Changes whenever a node is added, removed or updated: (count, last update)."""
        ...

    async def inventory(self) -> list[NodeInventory]: ...

    # -- pending gangs ---------------------------------------------------------------------------

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
        """Queue a gang unless it is known already (resuming from the checkpoint ``resume_from``);
        returns whether it was new."""
        ...

    async def pending(self, only: Iterable[str] | None = None) -> list[PendingGang]:
        """Pending gangs by priority then submit time; ``only`` restricts them to those ids."""
        ...

    async def pending_ids(self) -> set[str]: ...

    async def record_requeued(
        self, job_id: str, attempts: int, reason_code: str, message: str, backoff_until: float
    ) -> None: ...

    async def remove_pending(self, job_id: str) -> None: ...

    # -- placements ------------------------------------------------------------------------------

    async def record_placements(self, rows: Iterable[PlacementRow]) -> None:
        """Store each placement; a pod already placed keeps its row."""
        ...

    async def placements(self) -> list[PlacementRow]:
        """Every placement in force, oldest first."""
        ...

    async def recent_gpu_shapes(self, limit: int) -> list[PodShape]:
        """The shapes of the latest ``limit`` placements that hold GPU milli, newest first."""
        ...

    async def is_placed(self, job_id: str) -> bool: ...

    async def release_pod(self, pod: str) -> None: ...

    async def release_job(self, job_id: str) -> None: ...

    # -- preemptions -----------------------------------------------------------------------------

    async def add_preemption(self, request: PreemptionRequested) -> None:
        """Record a request; a repeat (say, now forced) replaces the earlier one."""
        ...

    async def add_withdrawal(self, job_id: str, reason: str, at_time: datetime) -> None:
        """The job left admission for good: kept with the preemptions (no preemptor), forced; an
        earlier request for the job keeps its fields and becomes forced."""
        ...

    async def mark_ready_for_eviction(self, event: ReadyForEviction) -> None:
        """The checkpoint service let a victim go; kept even before its preemption request arrives."""
        ...

    async def due_preemptions(self, now: float) -> list[Preemption]:
        """Victims to evict now: they cannot checkpoint, the request is forced, the checkpoint service
        let them go, or the deadline passed."""
        ...

    async def next_preemption_deadline(self) -> float | None: ...

    async def remove_preemption(self, job_id: str) -> None: ...


def ready_reason(reason: str | None, step: int | None, uri: str | None) -> str | None:
    """How the checkpoint service let a victim go, for the job's history."""
    if reason is None:
        return None
    if step is not None and uri:
        return f"{reason} at step {step} ({uri})"
    return reason
