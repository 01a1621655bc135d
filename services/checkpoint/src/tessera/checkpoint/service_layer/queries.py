"""What the checkpoint service answers about its state."""

from __future__ import annotations

from tessera.checkpoint.domain.model import Checkpoint
from tessera.checkpoint.service_layer.unit_of_work import CheckpointUnitOfWork


async def checkpoints_of(uow: CheckpointUnitOfWork, job_id: str, limit: int = 100) -> list[Checkpoint]:
    """The job's recorded checkpoints, newest first."""
    return await uow.checkpoints.of_job(job_id, limit)
