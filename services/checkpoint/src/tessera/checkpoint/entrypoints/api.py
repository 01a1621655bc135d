"""The checkpoint service's HTTP API: a job's checkpoints, newest first (what a restart resumes from)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel

from tessera.checkpoint.service_layer.dependencies import CheckpointDeps
from tessera.checkpoint.service_layer.queries import checkpoints_of

router = APIRouter(prefix="/v1", tags=["checkpoints"])


class CheckpointOut(BaseModel):
    id: str
    step: int
    bytes: int
    uri: str
    at: datetime


def _deps(request: Request) -> CheckpointDeps:
    deps: CheckpointDeps = request.app.state.deps
    return deps


Deps = Annotated[CheckpointDeps, Depends(_deps)]


@router.get("/jobs/{job_id}/checkpoints", response_model=list[CheckpointOut])
async def list_checkpoints(
    job_id: str, deps: Deps, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> list[CheckpointOut]:
    async with deps.uow() as uow:
        found = await checkpoints_of(uow, job_id, limit)
    return [CheckpointOut(id=c.id, step=c.step, bytes=c.size_bytes, uri=c.uri, at=c.saved_at) for c in found]
