"""REST: submit and read jobs."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, HTTPException, Query, Request, status
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from tessera.admission.adapters.repository import JobRepository
from tessera.admission.domain.model import Job, JobState
from tessera.admission.service_layer.handlers import submit_job
from tessera.contracts.base import FieldError
from tessera.core.runner import ServiceContext

router = APIRouter(prefix="/v1", tags=["jobs"])


class TransitionOut(BaseModel):
    state: str
    reason: str
    at: datetime


class JobOut(BaseModel):
    id: str
    name: str
    tenant: str
    queue: str
    priority: int
    state: str
    submitted_at: datetime
    spec: dict[str, Any] | None
    errors: list[FieldError]
    history: list[TransitionOut]


class ErrorBody(BaseModel):
    code: str
    message: str
    job_id: str | None = None
    errors: list[FieldError] = []


def _ctx(request: Request) -> ServiceContext:
    ctx: ServiceContext = request.app.state.ctx
    return ctx


def _out(job: Job) -> JobOut:
    return JobOut(
        id=job.id,
        name=job.name,
        tenant=job.tenant,
        queue=job.queue,
        priority=job.priority,
        state=job.state,
        submitted_at=job.submitted_at,
        spec=job.spec.model_dump(mode="json") if job.spec else None,
        errors=job.errors,
        history=[TransitionOut(state=t.state, reason=t.reason, at=t.at) for t in job.history],
    )


@router.post(
    "/jobs",
    status_code=status.HTTP_201_CREATED,
    responses={422: {"model": ErrorBody, "description": "the job is invalid; each error names the field"}},
)
async def create_job(request: Request, spec: Annotated[dict[str, Any], Body(description="a JobSpec")]) -> Any:
    async with _ctx(request).uow() as uow:
        result = await submit_job(spec, uow, request.headers.get("Idempotency-Key"))
        await uow.commit()
    if result.errors:
        body = ErrorBody(
            code="invalid_job", message="the job spec is invalid", job_id=result.job_id, errors=result.errors
        )
        return JSONResponse(body.model_dump(), status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)
    return {"id": result.job_id, "state": result.state}


@router.get("/jobs/{job_id}", response_model=JobOut, responses={404: {"model": ErrorBody}})
async def get_job(request: Request, job_id: str) -> JobOut:
    async with _ctx(request).uow() as uow:
        job = await JobRepository(uow.session).get(job_id)
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no job with id {job_id}")
    return _out(job)


@router.get("/jobs", response_model=list[JobOut])
async def list_jobs(
    request: Request,
    tenant: str | None = None,
    state: JobState | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[JobOut]:
    async with _ctx(request).uow() as uow:
        found = await JobRepository(uow.session).list(tenant=tenant, state=state, limit=limit)
    return [_out(job) for job in found]
