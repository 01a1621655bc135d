"""Jobs in Postgres: the `Job` aggregate, its transitions, and the queueing view the cycle reads.

A job is loaded whole (`get`, with its history) or, for the cycle, in bulk without its history
(`get_many`). Either way the repository remembers how many transitions are already stored, so
`save_all` writes only what the job recorded since, for thousands of jobs in two statements.
Loaded and added jobs are handed to `track`: the unit of work publishes their events at commit.
A job comes with its newest checkpoint (`job_checkpoints`, joined), which it resumes from."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import (
    DateTime,
    Select,
    String,
    Text,
    any_,
    bindparam,
    cast,
    func,
    insert,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from tessera.admission.adapters.orm import job_checkpoints, job_transitions, jobs
from tessera.admission.domain.model import ACTIVE, Job, JobCheckpoint, JobState, Transition
from tessera.admission.domain.workloads import ActiveJob
from tessera.contracts.base import FieldError
from tessera.contracts.jobs import JobSpec

AGGREGATE = (
    jobs.c.id,
    jobs.c.name,
    jobs.c.tenant,
    jobs.c.queue,
    jobs.c.priority,
    jobs.c.state,
    cast(jobs.c.spec, Text).label("spec"),  # parsed by pydantic straight from the JSON text
    jobs.c.errors,
    jobs.c.trace_headers,
    jobs.c.submitted_at,
    jobs.c.flavors,
    jobs.c.admitted_at,
    jobs.c.wait_reason,
    jobs.c.wait_message,
    jobs.c.preempted_by,
    jobs.c.preemption_deadline,
)
"""The columns of the aggregate (not the queueing view, `workload`)."""
_LATEST = (
    select(
        job_checkpoints.c.id,
        job_checkpoints.c.step,
        job_checkpoints.c.size_bytes,
        job_checkpoints.c.uri,
        job_checkpoints.c.at,
    )
    .where(job_checkpoints.c.job_id == jobs.c.id)
    .order_by(job_checkpoints.c.at.desc(), job_checkpoints.c.step.desc(), job_checkpoints.c.id)
    .limit(1)
    .lateral("latest_checkpoint")
)
LATEST_CHECKPOINT = (
    _LATEST.c.id.label("checkpoint_id"),
    _LATEST.c.step.label("checkpoint_step"),
    _LATEST.c.size_bytes.label("checkpoint_bytes"),
    _LATEST.c.uri.label("checkpoint_uri"),
    _LATEST.c.at.label("checkpoint_at"),
)
"""The job's newest checkpoint (one index lookup per job), what it resumes from."""


def _aggregate() -> Select[Any]:
    return select(*AGGREGATE, *LATEST_CHECKPOINT).select_from(jobs.outerjoin(_LATEST, true()))


_TS = DateTime(timezone=True)
_CHANGED: dict[str, Any] = {
    "id": String,
    "state": String,
    "flavors": Text,
    "admitted_at": _TS,
    "wait_reason": String,
    "wait_message": Text,
    "preempted_by": String,
    "preemption_deadline": _TS,
    "updated_at": _TS,
}
"""The columns a transition may change, each sent as one array: `_SAVE` updates every changed
row in one statement (`UPDATE ... FROM unnest(...)`) rather than one statement per row."""
_changes = (
    func.unnest(*(bindparam(f"b_{name}", type_=ARRAY(kind)) for name, kind in _CHANGED.items()))
    .table_valued(*_CHANGED)
    .render_derived(name="changes")
)
_SAVE = (
    update(jobs)
    .where(jobs.c.id == _changes.c.id)
    .values(
        {
            name: cast(_changes.c[name], JSONB) if name == "flavors" else _changes.c[name]
            for name in _CHANGED
            if name != "id"
        }
    )
)


def ids_param(ids: Collection[str]) -> Any:
    """`column = ANY(:ids)`: one array parameter however many ids (no 32k-parameter limit)."""
    return any_(bindparam("ids", list(ids), type_=ARRAY(String)))


class JobRepository:
    def __init__(self, session: AsyncSession, track: Callable[[Job], None] | None = None) -> None:
        self.session = session
        self._track = track
        self._stored: dict[str, int] = {}
        """Job id -> how many of its transitions are in the database (of those in `history`)."""

    def _seen(self, job: Job, stored: int) -> Job:
        self._stored[job.id] = stored
        if self._track is not None:
            self._track(job)
        return job

    async def add(self, job: Job, workload: Mapping[str, Any] | None = None) -> bool:
        """Insert a new job; False if a job with that id already exists (an idempotent resubmission).
        `workload` is the queueing view of an accepted job (pod groups and their requests)."""
        result = await self.session.execute(
            pg_insert(jobs)
            .values(
                **_row(job),
                name=job.name,
                tenant=job.tenant,
                queue=job.queue,
                priority=job.priority,
                spec=job.spec.model_dump(mode="json") if job.spec else None,
                errors=[e.model_dump() for e in job.errors],
                trace_headers=job.trace_headers or {},
                workload=workload,
                cluster_queue=job.queue if workload is not None else None,
                submitted_at=job.submitted_at,
            )
            .on_conflict_do_nothing(index_elements=[jobs.c.id])
            .returning(jobs.c.id)
        )
        if result.first() is None:
            return False
        await self._append([(job.id, t) for t in job.history])
        self._seen(job, len(job.history))
        return True

    async def get(self, job_id: str, *, for_update: bool = False) -> Job | None:
        """The job with its whole history."""
        query = _aggregate().where(jobs.c.id == job_id)
        if for_update:
            query = query.with_for_update(of=jobs)
        row = (await self.session.execute(query)).first()
        if row is None:
            return None
        history = [
            Transition(JobState(h.state), h.reason, h.at)
            for h in await self.session.execute(
                select(job_transitions.c.state, job_transitions.c.reason, job_transitions.c.at)
                .where(job_transitions.c.job_id == job_id)
                .order_by(job_transitions.c.seq)
            )
        ]
        return self._seen(_to_job(row, history), len(history))

    async def get_many(self, ids: Sequence[str]) -> dict[str, Job]:
        """Many jobs in one query, without their history (the cycle appends to it, never reads it),
        in the order of `ids`: the order their events are published in."""
        if not ids:
            return {}
        rows = await self.session.execute(_aggregate().where(jobs.c.id == ids_param(ids)))
        found = {row.id: _to_job(row, []) for row in rows}
        return {i: self._seen(found[i], 0) for i in ids if i in found}

    async def active(self) -> list[ActiveJob]:
        """The queueing view of every queued job and every job holding quota, oldest first."""
        rows = await self.session.execute(
            select(
                jobs.c.id,
                jobs.c.tenant,
                jobs.c.queue,
                jobs.c.priority,
                jobs.c.state,
                jobs.c.submitted_at,
                jobs.c.workload,
                jobs.c.flavors,
                jobs.c.admitted_at,
                jobs.c.wait_reason,
                jobs.c.wait_message,
                jobs.c.preempted_by,
            )
            .where(jobs.c.state.in_([s.value for s in ACTIVE]), jobs.c.workload.is_not(None))
            .order_by(jobs.c.submitted_at, jobs.c.id)
        )
        return [
            ActiveJob(
                row.id,
                row.tenant,
                row.queue,
                row.priority,
                JobState(row.state),
                row.submitted_at,
                row.workload,
                tuple(row.flavors or ()),
                row.admitted_at,
                _waiting(row.wait_reason, row.wait_message),
                row.preempted_by,
            )
            for row in rows
        ]

    async def count_by_state(self) -> dict[str, int]:
        """Every job in the table by state, ended ones included (one grouped count)."""
        rows = await self.session.execute(select(jobs.c.state, func.count()).group_by(jobs.c.state))
        return {str(state): int(count) for state, count in rows.all()}

    async def save(self, job: Job) -> None:
        await self.save_all([job])

    async def save_all(self, changed: Iterable[Job]) -> None:
        """Write every job that recorded a transition since it was loaded: one UPDATE for all the
        rows and one INSERT for all the new transitions."""
        columns: dict[str, list[Any]] = {name: [] for name in _CHANGED}
        transitions: list[tuple[str, Transition]] = []
        for job in changed:
            stored = self._stored.get(job.id)
            if stored is None:
                raise ValueError(f"job {job.id} was not loaded or added through this repository")
            new = job.history[stored:]
            if not new:
                continue
            row = _row(job)
            row["flavors"] = json.dumps(row["flavors"]) if row["flavors"] is not None else None
            for name, value in row.items():
                columns[name].append(value)
            transitions.extend((job.id, t) for t in new)
            self._stored[job.id] = len(job.history)
        if columns["id"]:
            await self.session.execute(_SAVE, {f"b_{name}": values for name, values in columns.items()})
        await self._append(transitions)

    async def list(
        self,
        *,
        tenant: str | None = None,
        state: str | None = None,
        queue: str | None = None,
        limit: int = 100,
    ) -> list[Job]:
        """The most recent jobs, without their history."""
        query = _aggregate().order_by(jobs.c.submitted_at.desc()).limit(limit)
        if tenant:
            query = query.where(jobs.c.tenant == tenant)
        if queue:
            query = query.where(jobs.c.queue == queue)
        if state:
            query = query.where(jobs.c.state == state)
        return [_to_job(row, []) for row in await self.session.execute(query)]

    async def _append(self, transitions: Sequence[tuple[str, Transition]]) -> None:
        if transitions:
            await self.session.execute(
                insert(job_transitions),
                [
                    {"job_id": job_id, "state": t.state.value, "reason": t.reason, "at": t.at}
                    for job_id, t in transitions
                ],
            )


def _row(job: Job) -> dict[str, Any]:
    """The columns a transition may change."""
    return {
        "id": job.id,
        "state": job.state.value,
        "flavors": list(job.flavors) if job.flavors else None,
        "admitted_at": job.admitted_at,
        "wait_reason": job.waiting[0] if job.waiting else None,
        "wait_message": job.waiting[1] if job.waiting else None,
        "preempted_by": job.preempted_by,
        "preemption_deadline": job.preemption_deadline,
        "updated_at": job.history[-1].at if job.history else job.submitted_at,
    }


def _waiting(reason: str | None, message: str | None) -> tuple[str, str] | None:
    return (reason, message or "") if reason is not None else None


def _to_job(row: Any, history: list[Transition]) -> Job:
    return Job(
        id=row.id,
        name=row.name,
        tenant=row.tenant,
        queue=row.queue,
        priority=row.priority,
        spec=JobSpec.model_validate_json(row.spec) if row.spec not in (None, "null") else None,
        submitted_at=row.submitted_at,
        state=JobState(row.state),
        history=history,
        errors=[FieldError.model_validate(e) for e in row.errors],
        flavors=tuple(row.flavors or ()),
        admitted_at=row.admitted_at,
        waiting=_waiting(row.wait_reason, row.wait_message),
        preempted_by=row.preempted_by,
        preemption_deadline=row.preemption_deadline,
        latest_checkpoint=JobCheckpoint(
            row.checkpoint_id,
            row.checkpoint_step,
            row.checkpoint_bytes,
            row.checkpoint_uri,
            row.checkpoint_at,
        )
        if row.checkpoint_id is not None
        else None,
        trace_headers=dict(row.trace_headers) or None,
    )
