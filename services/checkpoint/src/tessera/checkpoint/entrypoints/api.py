"""The checkpoint service's HTTP API: a job's checkpoints, newest first (what a restart resumes from).

A bearer token is required, checked with admission (`tessera.core.tenant_tokens`): the admin's reads
every job's checkpoints, a tenant's only its own jobs' (another tenant's job is 404, as admission
answers it). `auth=disabled` (the local stack) lets every caller read every job's."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel

from tessera.checkpoint.service_layer.dependencies import CheckpointDeps
from tessera.checkpoint.service_layer.queries import checkpoints_of
from tessera.core.tenant_tokens import AUTH_RESPONSES, ErrorDetail

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


@router.get(
    "/jobs/{job_id}/checkpoints",
    response_model=list[CheckpointOut],
    responses={
        **AUTH_RESPONSES,
        404: {"model": ErrorDetail, "description": "a job the token may not see (another tenant's)"},
    },
)
async def list_checkpoints(
    request: Request, job_id: str, deps: Deps, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> list[CheckpointOut]:
    """The job's checkpoints, newest first. A tenant's token sees only its own jobs'."""
    await deps.tokens.require_job(request, job_id)
    async with deps.uow() as uow:
        found = await checkpoints_of(uow, job_id, limit)
    return [CheckpointOut(id=c.id, step=c.step, bytes=c.size_bytes, uri=c.uri, at=c.saved_at) for c in found]
