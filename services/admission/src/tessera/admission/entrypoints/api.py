"""REST: submit, read, cancel jobs and report their outcomes."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Query, Request, status
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from tessera.admission.domain.model import InvalidTransition, Job, JobCheckpoint, JobState
from tessera.admission.domain.queueing import QueueingValidationError
from tessera.admission.entrypoints.auth import Caller, deps_of
from tessera.admission.entrypoints.errors import ERRORS, ApiError, ErrorBody
from tessera.admission.service_layer.handlers import (
    OUTCOMES,
    JobNotFound,
    cancel_job,
    report_outcome,
    submit_job,
)
from tessera.admission.service_layer.idempotency import KeyReused, submit_once
from tessera.contracts.base import FieldError
from tessera.contracts.jobs import JobSpec

router = APIRouter(prefix="/v1", tags=["jobs"], responses=ERRORS)

IDEMPOTENCY_KEY_MAX = 64
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=IDEMPOTENCY_KEY_MAX,
        pattern=r"^[!-~]+$",
        description="the tenant's own key: a retry with the same key and body answers with the job it "
        "made (whose id is the key, unless another job has that id); the same key with another body is "
        f"refused (409); 1 to {IDEMPOTENCY_KEY_MAX} visible ASCII characters",
    ),
]

CHECKPOINTS_SHOWN = 100
CHECKPOINTS_LISTED = 10
"""Checkpoints shown per job: of one job, and of each job in a list."""


class TransitionOut(BaseModel):
    state: str
    reason: str
    at: datetime


class CheckpointOut(BaseModel):
    """A checkpoint the job saved: as the checkpoint service lists it (`GET /v1/jobs/{id}/checkpoints`)."""

    id: str
    step: int
    bytes: int
    uri: str
    at: datetime


class KubernetesObjectOut(BaseModel):
    kind: str
    name: str


class KubernetesOut(BaseModel):
    """The Kubernetes objects that run the job, and what admission last made sure of them."""

    namespace: str
    objects: list[KubernetesObjectOut]
    state: str = Field(description="suspended, running (unsuspended), deleted, or unrunnable")
    note: str = ""


class WaitingOut(BaseModel):
    reason: str
    message: str


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
    waiting: WaitingOut | None = Field(
        None, description="why a queued job is not admitted yet, as admission's latest cycle said"
    )
    kubernetes: KubernetesOut | None = Field(
        None, description="its Kubernetes objects (when admission runs jobs on a cluster; one job only)"
    )
    checkpoints: list[CheckpointOut] = Field(
        default_factory=list,
        description=(
            f"the checkpoints it saved, newest first (at most {CHECKPOINTS_SHOWN}, or {CHECKPOINTS_LISTED} per "
            "job in a list); a requeued job resumes from the first"
        ),
    )


class Submitted(BaseModel):
    id: str
    state: str


class OutcomeIn(BaseModel):
    state: str
    reason: str = ""


def _out(
    job: Job, checkpoints: list[JobCheckpoint] | None = None, kubernetes: KubernetesOut | None = None
) -> JobOut:
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
        waiting=WaitingOut(reason=job.waiting[0], message=job.waiting[1]) if job.waiting else None,
        kubernetes=kubernetes,
        checkpoints=[
            CheckpointOut(id=c.id, step=c.step, bytes=c.size_bytes, uri=c.uri, at=c.at)
            for c in checkpoints or ()
        ],
    )


async def _with_checkpoints(
    request: Request, found: list[Job], limit: int = CHECKPOINTS_SHOWN
) -> list[JobOut]:
    async with deps_of(request).uow() as uow:
        checkpoints = await uow.checkpoints.of_jobs([job.id for job in found], limit)
        objects: dict[str, KubernetesOut] = {}
        if len(found) == 1 and (made := await uow.workloads.of_job(found[0].id)) is not None:
            namespace, refs, applied, note = made
            listed = [KubernetesObjectOut(kind=kind, name=name) for kind, name in refs]
            objects[found[0].id] = KubernetesOut(
                namespace=namespace, objects=listed, state=applied, note=note
            )
    return [_out(job, checkpoints.get(job.id), objects.get(job.id)) for job in found]


@router.post(
    "/jobs",
    status_code=status.HTTP_201_CREATED,
    response_model=Submitted,
    responses={
        422: {
            "model": ErrorBody,
            "description": "the job is invalid; each error names the field. A spec that parses but can "
            "never be admitted (code invalid_job) is kept as a rejected job with its id",
        }
    },
)
async def create_job(
    request: Request,
    caller: Caller,
    spec: Annotated[JobSpec, Body(description="the job")],
    idempotency_key: IdempotencyKey = None,
) -> Any:
    """Submit a job. A tenant's token may submit only as that tenant (to its own queue)."""
    if not caller.admin:
        caller.require_tenant(spec.tenant, "submit jobs on behalf")
    deps = deps_of(request)
    if idempotency_key is not None:
        try:
            result = await submit_once(
                deps.uow, spec, idempotency_key, templates_required=deps.templates_required
            )
        except KeyReused as exc:
            raise ApiError(
                409, "conflict", f"{exc}; send a new key for a new job", "header.Idempotency-Key"
            ) from None
    else:
        async with deps.uow() as uow:
            result = await submit_job(spec, uow, templates_required=deps.templates_required)
            await uow.commit()
    if result.errors:
        first = result.errors[0]
        body = ErrorBody(
            code="invalid_job",
            message=f"the job is rejected: {first.field}: {first.reason}",
            field=first.field,
            job_id=result.job_id,
            errors=result.errors,
        )
        return JSONResponse(body.model_dump(mode="json"), status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)
    deps_of(request).wake_cycle()
    return Submitted(id=result.job_id, state=result.state)


async def _visible_job(request: Request, caller: Caller, job_id: str) -> Job:
    """The job, when the caller may see it. Another tenant's job is answered as an unknown id (404),
    so a tenant's token cannot learn which ids exist or whose they are."""
    async with deps_of(request).uow() as uow:
        job = await uow.jobs.get(job_id)
    if job is None or not (caller.admin or caller.tenant == job.tenant):
        raise ApiError(404, "not_found", f"no job with id {job_id}", "job_id")
    return job


@router.get("/jobs/{job_id}", response_model=JobOut)
async def get_job(request: Request, caller: Caller, job_id: str) -> JobOut:
    """A job with its whole history (every transition with its time and reason) and the checkpoints
    it saved, newest first."""
    return (await _with_checkpoints(request, [await _visible_job(request, caller, job_id)]))[0]


@router.get("/jobs", response_model=list[JobOut])
async def list_jobs(
    request: Request,
    caller: Caller,
    tenant: str | None = None,
    queue: str | None = None,
    state: JobState | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[JobOut]:
    """The most recent jobs; a tenant's token sees only that tenant's jobs."""
    if not caller.admin:
        if tenant is not None and tenant != caller.tenant:
            caller.require_tenant(tenant, "list the jobs")
        tenant = caller.tenant
    async with deps_of(request).uow() as uow:
        found = await uow.jobs.list(tenant=tenant, state=state, queue=queue, limit=limit)
    return await _with_checkpoints(request, found, CHECKPOINTS_LISTED)


@router.post("/jobs/{job_id}/cancel", response_model=JobOut)
async def cancel(request: Request, caller: Caller, job_id: str) -> JobOut:
    """Cancel a queued or running job; the quota it held is free for the next cycle."""
    await _visible_job(request, caller, job_id)
    try:
        async with deps_of(request).uow() as uow:
            job = await cancel_job(job_id, uow, "cancelled by request")
            await uow.commit()
    except JobNotFound:
        raise ApiError(404, "not_found", f"no job with id {job_id}", "job_id") from None
    except InvalidTransition as exc:
        raise ApiError(
            409, "conflict", f"job {job_id} is {exc.current}: it cannot be cancelled", "state"
        ) from None
    deps_of(request).wake_cycle()
    return (await _with_checkpoints(request, [job]))[0]


@router.post("/jobs/{job_id}/outcome", response_model=JobOut)
async def outcome(request: Request, caller: Caller, job_id: str, body: OutcomeIn) -> JobOut:
    """Report a job running, succeeded, failed, or released after a preemption (admin only;
    the same as the `report_job_outcome` command)."""
    caller.require_admin("report job outcomes")
    if body.state not in OUTCOMES:
        raise ApiError(422, "invalid", f"state must be one of {', '.join(OUTCOMES)}", "state")
    async with deps_of(request).uow() as uow:
        try:
            job = await report_outcome(job_id, body.state, body.reason, uow)
        except QueueingValidationError as exc:
            raise ApiError(422, "invalid", exc.reason, exc.field) from None
        await uow.commit()
    if job is None:
        current = await _visible_job(request, caller, job_id)
        raise ApiError(
            409, "conflict", f"job {job_id} is {current.state}: cannot become {body.state}", "state"
        )
    deps_of(request).wake_cycle()
    return (await _with_checkpoints(request, [job]))[0]
