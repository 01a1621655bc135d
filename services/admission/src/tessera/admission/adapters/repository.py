"""Jobs in Postgres. The aggregate is loaded and saved whole; transitions are appended."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from tessera.admission.adapters.orm import change_seq, job_transitions, jobs
from tessera.admission.domain.model import Job, JobState, Transition
from tessera.contracts.base import FieldError
from tessera.contracts.jobs import JobSpec


class JobRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def add(
        self,
        job: Job,
        trace_headers: dict[str, str] | None = None,
        workload: dict[str, Any] | None = None,
    ) -> bool:
        """Insert a new job; False if a job with that id already exists (an idempotent resubmission).
        `workload` is the queueing view of an accepted job (pod groups and their requests)."""
        result = await self.session.execute(
            pg_insert(jobs)
            .values(
                id=job.id,
                name=job.name,
                tenant=job.tenant,
                queue=job.queue,
                priority=job.priority,
                state=job.state.value,
                spec=job.spec.model_dump(mode="json") if job.spec else None,
                errors=[e.model_dump() for e in job.errors],
                trace_headers=trace_headers or {},
                workload=workload,
                cluster_queue=job.queue if workload is not None else None,
                submitted_at=job.submitted_at,
                updated_at=job.history[-1].at,
            )
            .on_conflict_do_nothing(index_elements=[jobs.c.id])
            .returning(jobs.c.id)
        )
        if result.first() is None:
            return False
        await self._append(job.id, job.history)
        return True

    async def get(self, job_id: str, *, for_update: bool = False) -> Job | None:
        query = select(jobs).where(jobs.c.id == job_id)
        if for_update:
            query = query.with_for_update()
        row = (await self.session.execute(query)).mappings().first()
        if row is None:
            return None
        history = (
            (
                await self.session.execute(
                    select(job_transitions)
                    .where(job_transitions.c.job_id == job_id)
                    .order_by(job_transitions.c.seq)
                )
            )
            .mappings()
            .all()
        )
        return _to_job(row, [Transition(JobState(h["state"]), h["reason"], h["at"]) for h in history])

    async def trace_headers(self, job_id: str) -> dict[str, str]:
        value = await self.session.scalar(select(jobs.c.trace_headers).where(jobs.c.id == job_id))
        return dict(value or {})

    async def save(self, job: Job, new_transitions: Sequence[Transition]) -> None:
        await self.session.execute(
            update(jobs).where(jobs.c.id == job.id).values(state=job.state.value, updated_at=func.now())
        )
        await self.session.execute(select(change_seq.next_value()))
        await self._append(job.id, new_transitions)

    async def list(
        self,
        *,
        tenant: str | None = None,
        state: str | None = None,
        queue: str | None = None,
        limit: int = 100,
    ) -> list[Job]:
        query = select(jobs).order_by(jobs.c.submitted_at.desc()).limit(limit)
        if tenant:
            query = query.where(jobs.c.tenant == tenant)
        if queue:
            query = query.where(jobs.c.queue == queue)
        if state:
            query = query.where(jobs.c.state == state)
        rows = (await self.session.execute(query)).mappings().all()
        return [_to_job(row, []) for row in rows]

    async def _append(self, job_id: str, transitions: Sequence[Transition]) -> None:
        if transitions:
            await self.session.execute(
                insert(job_transitions),
                [
                    {"job_id": job_id, "state": t.state.value, "reason": t.reason, "at": t.at}
                    for t in transitions
                ],
            )


def _to_job(row: Any, history: list[Transition]) -> Job:
    return Job(
        id=row["id"],
        name=row["name"],
        tenant=row["tenant"],
        queue=row["queue"],
        priority=row["priority"],
        spec=JobSpec.model_validate(row["spec"]) if row["spec"] else None,
        submitted_at=row["submitted_at"],
        state=JobState(row["state"]),
        history=history,
        errors=[FieldError.model_validate(e) for e in row["errors"]],
    )
