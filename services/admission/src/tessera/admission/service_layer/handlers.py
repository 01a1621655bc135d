"""Admission's use cases: submit, admit (FIFO for now), and follow the scheduler's outcomes."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

from opentelemetry import context as otel_context
from opentelemetry import propagate

from tessera.admission.adapters.repository import JobRepository
from tessera.admission.domain.model import Job, JobState
from tessera.contracts.base import FieldError
from tessera.contracts.events import GangPlaced, GangUnschedulable, SubmitJob
from tessera.contracts.validation import parse_job_spec
from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.envelope import Envelope
from tessera.core.observability.tracing import current_trace_headers, tracer

log = logging.getLogger(__name__)


def now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class SubmitResult:
    job_id: str
    state: JobState
    errors: list[FieldError] = field(default_factory=list)
    duplicate: bool = False


async def submit_job(raw_spec: object, uow: UnitOfWork, job_id: str | None = None) -> SubmitResult:
    """Validate, store and announce a job. Called inside an open unit of work; the caller commits."""
    job_id = job_id or str(uuid.uuid4())
    with tracer().start_as_current_span("admission.submit_job", attributes={"job_id": job_id}) as span:
        repo = JobRepository(uow.session)
        existing = await repo.get(job_id)
        if existing is not None:
            return SubmitResult(job_id, existing.state, existing.errors, duplicate=True)
        spec, errors = parse_job_spec(raw_spec)
        job = Job.submit(job_id, spec, now()) if spec else Job.reject(job_id, raw_spec, errors, now())
        span.set_attribute("accepted", spec is not None)
        await repo.add(job, trace_headers=current_trace_headers())
        for event in job.events:
            await uow.publish(event)
        log.info("job %s", job.state, extra={"job_id": job_id, "errors": len(errors)})
        return SubmitResult(job_id, job.state, errors)


async def handle_submit_command(envelope: Envelope, uow: UnitOfWork) -> None:
    command = envelope.parse()
    assert isinstance(command, SubmitJob)
    await submit_job(command.spec, uow, command.job_id or envelope.id)


async def admit_fifo(uow: UnitOfWork, limit: int = 500) -> list[str]:
    """Admit the oldest queued jobs in order. Quotas and fair share come with the queueing model."""
    repo = JobRepository(uow.session)
    admitted = []
    for job in await repo.lock_queued(limit):
        parent = propagate.extract(await repo.trace_headers(job.id))
        token = otel_context.attach(parent)
        try:
            with tracer().start_as_current_span("admission.admit", attributes={"job_id": job.id}):
                before = len(job.history)
                job.admit(now())
                await repo.save(job, job.history[before:])
                for event in job.events:
                    await uow.publish(event)
        finally:
            otel_context.detach(token)
        admitted.append(job.id)
    return admitted


async def handle_scheduler_event(envelope: Envelope, uow: UnitOfWork) -> None:
    event = envelope.parse()
    if not isinstance(event, GangPlaced | GangUnschedulable):
        return
    repo = JobRepository(uow.session)
    job = await repo.get(event.job_id, for_update=True)
    if job is None:
        log.warning("scheduler outcome for an unknown job", extra={"job_id": event.job_id})
        return
    before = len(job.history)
    if isinstance(event, GangPlaced):
        if job.state != JobState.ADMITTED:
            log.info("placement ignored in state %s", job.state, extra={"job_id": job.id})
            return
        nodes = sorted({p.node for p in event.placements})
        job.move(JobState.PLACED, f"placed {len(event.placements)} pods on {', '.join(nodes)}", now())
    else:
        if job.state != JobState.ADMITTED:
            return
        job.move(JobState.ADMITTED, f"unschedulable: {event.message}", now())
    await repo.save(job, job.history[before:])
