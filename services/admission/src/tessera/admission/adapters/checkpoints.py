"""The checkpoints jobs saved, as the checkpoint service announced them (`checkpoint_saved`).

Admission keeps its own copy, so the job resource lists them, a requeued job resumes from its newest,
and preemption prefers the victims that lose the least work. Each is recorded once by its id
(`tessera.contracts.events.checkpoint_id`, the checkpoint service's own)."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from tessera.admission.adapters.orm import job_checkpoints
from tessera.admission.adapters.repository import ids_param
from tessera.admission.domain.model import JobCheckpoint

NEWEST_FIRST = (job_checkpoints.c.at.desc(), job_checkpoints.c.step.desc(), job_checkpoints.c.id)


class CheckpointRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def add(self, job_id: str, checkpoint: JobCheckpoint, request_id: str | None = None) -> bool:
        """Record a checkpoint of a known job; False when it is recorded already."""
        result = await self.session.execute(
            pg_insert(job_checkpoints)
            .values(
                id=checkpoint.id,
                job_id=job_id,
                step=checkpoint.step,
                size_bytes=checkpoint.size_bytes,
                uri=checkpoint.uri,
                request_id=request_id,
                at=checkpoint.at,
            )
            .on_conflict_do_nothing(index_elements=[job_checkpoints.c.id])
            .returning(job_checkpoints.c.id)
        )
        return result.first() is not None

    async def of_jobs(self, job_ids: Collection[str], limit: int = 100) -> dict[str, list[JobCheckpoint]]:
        """Each job's checkpoints, newest first, at most `limit` per job, in one query."""
        if not job_ids:
            return {}
        rank = func.row_number().over(partition_by=job_checkpoints.c.job_id, order_by=NEWEST_FIRST)
        ranked = (
            select(job_checkpoints, rank.label("rank"))
            .where(job_checkpoints.c.job_id == ids_param(job_ids))
            .subquery()
        )
        rows = await self.session.execute(
            select(ranked)
            .where(ranked.c.rank <= limit)
            .order_by(ranked.c.job_id, ranked.c.at.desc(), ranked.c.step.desc(), ranked.c.id)
        )
        found: dict[str, list[JobCheckpoint]] = {}
        for row in rows:
            found.setdefault(row.job_id, []).append(
                JobCheckpoint(row.id, row.step, row.size_bytes, row.uri, row.at)
            )
        return found

    async def latest_times(self, job_ids: Collection[str]) -> dict[str, datetime]:
        """When each job (of those that saved any) saved its newest checkpoint, in one query."""
        if not job_ids:
            return {}
        rows = await self.session.execute(
            select(job_checkpoints.c.job_id, func.max(job_checkpoints.c.at).label("at"))
            .where(job_checkpoints.c.job_id == ids_param(job_ids))
            .group_by(job_checkpoints.c.job_id)
        )
        return {row.job_id: row.at for row in rows}
