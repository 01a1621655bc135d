"""The checkpoint service's state in Postgres: requests, checkpoints, jobs and node signals.

The protocols are what the service layer sees; the `Sql*` classes keep every query in this module.
Repositories hand what they load or add to `track`, so the unit of work publishes the events those
aggregates record when it commits."""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from tessera.checkpoint.adapters.orm import checkpoint_requests, checkpoints, job_pods, jobs, node_signals
from tessera.checkpoint.domain.model import OPEN_STATES, Checkpoint, CheckpointRequest, Job, RequestState
from tessera.checkpoint.domain.signals import NodeSignal
from tessera.core.db.uow import Aggregate

Track = Callable[[Aggregate], None]
_OPEN = [state.value for state in OPEN_STATES]


class RequestRepository(Protocol):
    async def add(self, request: CheckpointRequest) -> bool:
        """Store a new request; False (and nothing stored or sent) when the job already has an open one."""
        ...

    async def get(self, request_id: str) -> CheckpointRequest | None:
        """The request, locked until the unit ends."""
        ...

    async def open_for(self, job_id: str) -> CheckpointRequest | None:
        """The job's open request (at most one), locked until the unit ends."""
        ...

    async def due(self, now: datetime, limit: int) -> list[CheckpointRequest]:
        """Open requests whose deadline passed, oldest deadline first; ones another unit holds are skipped."""
        ...

    async def next_deadline(self) -> datetime | None: ...

    async def save(self, request: CheckpointRequest) -> None: ...


class CheckpointRepository(Protocol):
    async def add(self, checkpoint: Checkpoint) -> bool:
        """Record a checkpoint; False when it was recorded before (it is then not announced again)."""
        ...

    async def latest(self, job_id: str) -> Checkpoint | None: ...

    async def of_job(self, job_id: str, limit: int) -> list[Checkpoint]:
        """The job's checkpoints, newest first."""
        ...


class JobRepository(Protocol):
    async def get(self, job_id: str) -> Job:
        """The job, locked until the unit ends; a blank one (stored as such) when it is new."""
        ...

    async def on_node(self, node: str) -> list[Job]:
        """Jobs not finished with a pod on `node`."""
        ...

    async def save(self, job: Job) -> None: ...


class SignalRepository(Protocol):
    async def note(self, signal: NodeSignal) -> bool:
        """Store the signal; True when it is new (or its value changed): act on it then, and only then."""
        ...

    async def keep_only(self, node: str, keys: Collection[str]) -> None:
        """Forget the node's other signals (the marks were removed, or the node is gone)."""
        ...


class SqlRequestRepository:
    def __init__(self, session: AsyncSession, track: Track) -> None:
        self.session = session
        self.track = track

    async def add(self, request: CheckpointRequest) -> bool:
        row = _request_row(request)
        inserted = await self.session.execute(
            pg_insert(checkpoint_requests)
            .values(request_id=request.request_id, created_at=request.created_at, **row)
            .on_conflict_do_nothing()
            .returning(checkpoint_requests.c.request_id)
        )
        if inserted.first() is None:
            return False
        self.track(request)
        return True

    async def get(self, request_id: str) -> CheckpointRequest | None:
        return await self._one(checkpoint_requests.c.request_id == request_id)

    async def open_for(self, job_id: str) -> CheckpointRequest | None:
        return await self._one(checkpoint_requests.c.job_id == job_id, checkpoint_requests.c.state.in_(_OPEN))

    async def due(self, now: datetime, limit: int) -> list[CheckpointRequest]:
        rows = await self.session.execute(
            select(checkpoint_requests)
            .where(checkpoint_requests.c.state.in_(_OPEN), checkpoint_requests.c.deadline <= now)
            .order_by(checkpoint_requests.c.deadline)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        return [self._tracked(row) for row in rows.mappings()]

    async def next_deadline(self) -> datetime | None:
        value: datetime | None = await self.session.scalar(
            select(func.min(checkpoint_requests.c.deadline)).where(checkpoint_requests.c.state.in_(_OPEN))
        )
        return value

    async def save(self, request: CheckpointRequest) -> None:
        await self.session.execute(
            update(checkpoint_requests)
            .where(checkpoint_requests.c.request_id == request.request_id)
            .values(**_request_row(request))
        )
        self.track(request)

    async def _one(self, *where: Any) -> CheckpointRequest | None:
        row = (
            (await self.session.execute(select(checkpoint_requests).where(*where).with_for_update()))
            .mappings()
            .first()
        )
        return None if row is None else self._tracked(row)

    def _tracked(self, row: Any) -> CheckpointRequest:
        request = CheckpointRequest(
            request_id=row["request_id"],
            job_id=row["job_id"],
            reason=row["reason"],
            deadline=row["deadline"],
            created_at=row["created_at"],
            state=RequestState(row["state"]),
            updated_at=row["updated_at"],
            outcome=row["outcome"],
            checkpoint_id=row["checkpoint_id"],
            checkpoint_uri=row["checkpoint_uri"],
            preemptor_job_id=row["preemptor_job_id"],
            trace_headers=row["trace"],
        )
        self.track(request)
        return request


def _request_row(request: CheckpointRequest) -> dict[str, Any]:
    return {
        "job_id": request.job_id,
        "reason": request.reason,
        "state": request.state.value,
        "deadline": request.deadline,
        "updated_at": request.updated_at or request.created_at,
        "outcome": request.outcome,
        "checkpoint_id": request.checkpoint_id,
        "checkpoint_uri": request.checkpoint_uri,
        "preemptor_job_id": request.preemptor_job_id,
        "trace": dict(request.trace_headers) if request.trace_headers else None,
    }


class SqlCheckpointRepository:
    def __init__(self, session: AsyncSession, track: Track) -> None:
        self.session = session
        self.track = track

    async def add(self, checkpoint: Checkpoint) -> bool:
        inserted = await self.session.execute(
            pg_insert(checkpoints)
            .values(
                id=checkpoint.id,
                job_id=checkpoint.job_id,
                step=checkpoint.step,
                uri=checkpoint.uri,
                size_bytes=checkpoint.size_bytes,
                saved_at=checkpoint.saved_at,
                request_id=checkpoint.request_id,
            )
            .on_conflict_do_nothing()
            .returning(checkpoints.c.id)
        )
        if inserted.first() is None:
            return False
        self.track(checkpoint)
        return True

    async def latest(self, job_id: str) -> Checkpoint | None:
        found = await self.of_job(job_id, 1)
        return found[0] if found else None

    async def of_job(self, job_id: str, limit: int) -> list[Checkpoint]:
        rows = await self.session.execute(
            select(checkpoints)
            .where(checkpoints.c.job_id == job_id)
            .order_by(checkpoints.c.saved_at.desc(), checkpoints.c.step.desc())
            .limit(limit)
        )
        return [
            Checkpoint(
                id=row["id"],
                job_id=row["job_id"],
                step=row["step"],
                uri=row["uri"],
                size_bytes=row["size_bytes"],
                saved_at=row["saved_at"],
                request_id=row["request_id"],
            )
            for row in rows.mappings()
        ]


class SqlJobRepository:
    def __init__(self, session: AsyncSession, track: Track) -> None:
        self.session = session
        self.track = track

    async def get(self, job_id: str) -> Job:
        # Create the row first, so that two consumers changing one new job take turns on its lock.
        await self.session.execute(pg_insert(jobs).values(job_id=job_id).on_conflict_do_nothing())
        row = (
            (await self.session.execute(select(jobs).where(jobs.c.job_id == job_id).with_for_update()))
            .mappings()
            .one()
        )
        pods = await self.session.execute(
            select(job_pods.c.pod, job_pods.c.node).where(job_pods.c.job_id == job_id)
        )
        job = _job(row)
        job.pods = {pod: node for pod, node in pods.all()}
        self.track(job)
        return job

    async def on_node(self, node: str) -> list[Job]:
        on_node = select(job_pods.c.job_id).where(job_pods.c.node == node)
        rows = await self.session.execute(
            select(jobs, job_pods.c.pod, job_pods.c.node)
            .join(job_pods, job_pods.c.job_id == jobs.c.job_id)
            .where(jobs.c.job_id.in_(on_node), jobs.c.finished_at.is_(None))
            .order_by(jobs.c.job_id, job_pods.c.pod)
        )
        found: dict[str, Job] = {}
        for row in rows.mappings():
            job = found.get(row["job_id"])
            if job is None:
                job = found[row["job_id"]] = _job(row)
                self.track(job)
            job.pods[row["pod"]] = row["node"]
        return list(found.values())

    async def save(self, job: Job) -> None:
        await self.session.execute(
            update(jobs)
            .where(jobs.c.job_id == job.job_id)
            .values(
                checkpointable=job.checkpointable,
                admitted_at=job.admitted_at,
                placed_at=job.placed_at,
                finished_at=job.finished_at,
                updated_at=func.now(),
            )
        )
        await self.session.execute(delete(job_pods).where(job_pods.c.job_id == job.job_id))
        if job.pods:
            await self.session.execute(
                insert(job_pods),
                [{"job_id": job.job_id, "pod": pod, "node": node} for pod, node in sorted(job.pods.items())],
            )
        self.track(job)


def _job(row: Any) -> Job:
    return Job(
        job_id=row["job_id"],
        checkpointable=row["checkpointable"],
        admitted_at=row["admitted_at"],
        placed_at=row["placed_at"],
        finished_at=row["finished_at"],
    )


class SqlSignalRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def note(self, signal: NodeSignal) -> bool:
        statement = pg_insert(node_signals).values(
            node=signal.node,
            key=signal.key,
            value=signal.value,
            reason=signal.reason,
            noticed_at=signal.noticed_at,
            deadline=signal.deadline,
        )
        changed = await self.session.execute(
            statement.on_conflict_do_update(
                index_elements=[node_signals.c.node, node_signals.c.key],
                set_={
                    "value": statement.excluded.value,
                    "reason": statement.excluded.reason,
                    "noticed_at": statement.excluded.noticed_at,
                    "deadline": statement.excluded.deadline,
                },
                where=node_signals.c.value.is_distinct_from(statement.excluded.value),
            ).returning(node_signals.c.node)
        )
        return changed.first() is not None

    async def keep_only(self, node: str, keys: Collection[str]) -> None:
        await self.session.execute(
            delete(node_signals).where(node_signals.c.node == node, node_signals.c.key.not_in(list(keys)))
        )
