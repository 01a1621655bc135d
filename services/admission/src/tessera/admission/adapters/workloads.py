"""The Kubernetes objects of each job, as admission last made sure of them (`workloads`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import String, and_, case, cast, delete, func, literal, null, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from tessera.admission.adapters.orm import jobs, workloads
from tessera.admission.domain.job_conditions import ConditionsDue, JobStatusView
from tessera.admission.domain.model import JobState
from tessera.admission.domain.workload_sync import Applied, Owner, WorkloadDue, desired
from tessera.contracts.base import FieldError
from tessera.contracts.jobs import JobSpec

_OWNER = func.coalesce(workloads.c.owner, Owner.TESSERA.value)
_WANT = case(
    *[
        (and_(jobs.c.state == state.value, _OWNER.in_([owner.value])), literal(want.value))
        for state in JobState
        for owner in Owner
        if (want := desired(state, owner)) is not None
    ],
    else_=null(),
)


class WorkloadRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def due(self, limit: int = 100) -> list[WorkloadDue]:
        """Jobs whose objects differ from what their state wants, oldest change first. A job never
        made on the cluster is due only while it still wants objects (not when deleted)."""
        want = _WANT.label("want")
        query = (
            select(
                jobs.c.id,
                jobs.c.state,
                cast(jobs.c.spec, String).label("spec"),
                workloads.c.namespace,
                workloads.c.objects,
                workloads.c.applied,
                _OWNER.label("owner"),
                want,
                jobs.c.flavors,
                workloads.c.updated_at.label("recorded_at"),
            )
            .select_from(jobs.outerjoin(workloads, workloads.c.job_id == jobs.c.id))
            .where(
                _WANT.is_not(None),
                or_(
                    and_(workloads.c.applied.is_(None), _WANT.not_in([Applied.DELETED.value])),
                    and_(
                        workloads.c.applied != _WANT,
                        workloads.c.applied != Applied.UNRUNNABLE.value,
                        workloads.c.applied != Applied.DELETED.value,
                    ),
                ),
            )
            .order_by(jobs.c.updated_at)
            .limit(limit)
        )
        rows = (await self.session.execute(query)).all()
        return [
            WorkloadDue(
                job_id=row.id,
                state=JobState(row.state),
                spec=JobSpec.model_validate_json(row.spec) if row.spec not in (None, "null") else None,
                namespace=row.namespace,
                objects=tuple((o["kind"], o["name"]) for o in row.objects or ()),
                applied=Applied(row.applied) if row.applied else None,
                want=Applied(row.want),
                owner=Owner(row.owner),
                flavors=tuple(row.flavors or ()),
                recorded_at=row.recorded_at,
            )
            for row in rows
        ]

    async def record(
        self,
        job_id: str,
        namespace: str,
        objects: Sequence[tuple[str, str]],
        applied: Applied,
        at: datetime,
        note: str = "",
        owner: Owner = Owner.TESSERA,
    ) -> None:
        values = {
            "namespace": namespace,
            "owner": owner.value,
            "objects": [{"kind": kind, "name": name} for kind, name in objects],
            "applied": applied.value,
            "note": note,
            "updated_at": at,
        }
        await self.session.execute(
            pg_insert(workloads)
            .values(job_id=job_id, **values)
            .on_conflict_do_update(index_elements=[workloads.c.job_id], set_=values)
        )

    async def conditions_due(self, limit: int = 100) -> list[ConditionsDue]:
        """Jobs on the cluster whose record changed since their conditions were last written."""
        query = (
            select(
                jobs.c.id,
                jobs.c.state,
                jobs.c.queue,
                jobs.c.wait_reason,
                jobs.c.wait_message,
                jobs.c.errors,
                jobs.c.flavors,
                jobs.c.preempted_by,
                jobs.c.updated_at,
                workloads.c.namespace,
                workloads.c.objects,
            )
            .select_from(jobs.join(workloads, workloads.c.job_id == jobs.c.id))
            .where(
                workloads.c.applied.not_in([Applied.DELETED.value, Applied.UNRUNNABLE.value]),
                # any other updated_at than the one reported, not only a later one: a cycle stamps
                # a job's wait reason with the time it started, which may be before the job was
                # queued and its first conditions written
                workloads.c.reported_at.is_distinct_from(jobs.c.updated_at),
            )
            .order_by(jobs.c.updated_at)
            .limit(limit)
        )
        return [
            ConditionsDue(
                row.id,
                row.namespace,
                tuple(o["name"] for o in row.objects or () if o["kind"] == "Job"),
                JobStatusView(
                    JobState(row.state),
                    row.queue,
                    (row.wait_reason, row.wait_message or "") if row.wait_reason else None,
                    tuple(FieldError.model_validate(e) for e in row.errors or ()),
                    tuple(row.flavors or ()),
                    row.preempted_by,
                ),
                row.updated_at,
                tuple(o["name"] for o in row.objects or () if o["kind"] == "Pod"),
                tuple(o["name"] for o in row.objects or () if o["kind"] == "JobSet"),
            )
            for row in (await self.session.execute(query)).all()
        ]

    async def mark_reported(self, job_id: str, updated_at: datetime) -> None:
        await self.session.execute(
            update(workloads).where(workloads.c.job_id == job_id).values(reported_at=updated_at)
        )

    async def of_job(self, job_id: str) -> tuple[str, list[tuple[str, str]], Applied, str] | None:
        """(namespace, objects, applied, note) of a job's objects, if admission made any."""
        row = (
            await self.session.execute(select(workloads).where(workloads.c.job_id == job_id))
        ).one_or_none()
        if row is None:
            return None
        objects = [(o["kind"], o["name"]) for o in row.objects]
        return row.namespace, objects, Applied(row.applied), row.note

    async def user_owned(self, kind: str | None = None) -> list[tuple[str, str, str]]:
        """(job id, namespace, name) of users' workloads not known deleted: those of ``kind`` (a Job, a
        Pod), or of every kind."""
        rows = (
            await self.session.execute(
                select(workloads.c.job_id, workloads.c.namespace, workloads.c.objects).where(
                    workloads.c.owner == Owner.USER.value, workloads.c.applied != Applied.DELETED.value
                )
            )
        ).all()
        return [
            (row.job_id, row.namespace, row.objects[0]["name"])
            for row in rows
            if row.objects and kind in (None, row.objects[0]["kind"])
        ]

    async def forget(self, job_id: str) -> None:
        await self.session.execute(delete(workloads).where(workloads.c.job_id == job_id))
