"""Admission's use cases: submit, cancel, outcome reports, and the scheduler's and telemetry's
news. The admission cycle itself is in `cycle.py`."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert

from tessera.admission.adapters.config_repository import ConfigRepository
from tessera.admission.adapters.orm import change_seq, inventory_nodes, jobs, placements
from tessera.admission.adapters.repository import JobRepository
from tessera.admission.domain.model import HOLDS_QUOTA, InvalidTransition, Job, JobState
from tessera.admission.domain.queueing import QueueingEngine, QueueingValidationError
from tessera.admission.domain.workloads import groups_of, open_config, tenant_queue, to_workload
from tessera.admission.service_layer.cycle import CYCLE_LOCK_KEY
from tessera.contracts.base import FieldError
from tessera.contracts.events import (
    GangFinished,
    GangPlaced,
    GangUnschedulable,
    InventoryChanged,
    ReportJobOutcome,
    SubmitJob,
)
from tessera.contracts.jobs import JobSpec
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


async def hold_cycle_off(uow: UnitOfWork) -> None:
    """Changes to admitted jobs wait for a running cycle and keep the next one off until commit
    (the cycle takes the same advisory lock exclusively)."""
    await uow.session.execute(text("SELECT pg_advisory_xact_lock_shared(:key)"), {"key": CYCLE_LOCK_KEY})


async def _queueing_view(uow: UnitOfWork, spec: JobSpec, job_id: str) -> tuple[str, int, dict[str, Any]]:
    """The queue, priority and workload of a valid spec; raises `QueueingValidationError`."""
    stored = await ConfigRepository(uow.session).load()
    groups = groups_of(spec)
    open_mode = stored.open_mode
    config = open_config({r for g in groups for r in g["requests"]}) if open_mode else stored.build()
    queue = tenant_queue(config, spec.tenant, spec.queue, open_mode)
    priority = config.priority_of(spec.priority_class) if spec.priority_class else spec.priority
    workload = to_workload(
        job_id,
        queue,
        groups,
        priority=priority,
        created_at=0.0,
        preemptible=spec.preemptible,
        checkpointable=spec.checkpointable,
        config=config,
        open_mode=open_mode,
    )
    QueueingEngine(config).validate(workload)
    return (
        queue,
        priority,
        {
            "groups": groups,
            "preemptible": spec.preemptible,
            "checkpointable": spec.checkpointable,
        },
    )


async def submit_job(raw_spec: object, uow: UnitOfWork, job_id: str | None = None) -> SubmitResult:
    """Validate, store and announce a job. Called inside an open unit of work; the caller commits."""
    job_id = job_id or str(uuid.uuid4())
    with tracer().start_as_current_span("admission.submit_job", attributes={"job_id": job_id}) as span:
        repo = JobRepository(uow.session)
        existing = await repo.get(job_id)
        if existing is not None:
            return SubmitResult(job_id, existing.state, existing.errors, duplicate=True)
        spec, errors = parse_job_spec(raw_spec)
        workload: dict[str, Any] | None = None
        job: Job | None = None
        if spec is not None:
            try:
                queue, priority, workload = await _queueing_view(uow, spec, job_id)
                job = Job.submit(job_id, spec, now(), queue=queue, priority=priority)
            except QueueingValidationError as exc:
                errors = [FieldError(field=exc.field, reason=exc.reason)]
                raw_spec = spec.model_dump(mode="json")
        if job is None:
            job = Job.reject(job_id, raw_spec, errors, now())
            workload = None
        span.set_attribute("accepted", job.state is JobState.QUEUED)
        await repo.add(job, trace_headers=current_trace_headers(), workload=workload)
        await uow.session.execute(select(change_seq.next_value()))
        for event in job.events:
            await uow.publish(event)
        log.info("job %s", job.state, extra={"job_id": job_id, "errors": len(errors)})
        return SubmitResult(job_id, job.state, errors)


async def handle_submit_command(envelope: Envelope, uow: UnitOfWork) -> None:
    command = envelope.parse()
    assert isinstance(command, SubmitJob)
    await submit_job(command.spec, uow, command.job_id or envelope.id)


class JobNotFound(LookupError):
    pass


async def cancel_job(job_id: str, uow: UnitOfWork, reason: str = "cancelled by request") -> Job:
    """Cancel a job; its quota is free for the next cycle. Raises `JobNotFound`, `InvalidTransition`."""
    await hold_cycle_off(uow)
    repo = JobRepository(uow.session)
    job = await repo.get(job_id, for_update=True)
    if job is None:
        raise JobNotFound(job_id)
    before = len(job.history)
    job.move(JobState.CANCELLED, reason, now())
    await repo.save(job, job.history[before:])
    for event in job.events:
        await uow.publish(event)
    return job


OUTCOMES = {
    "running": JobState.RUNNING,
    "succeeded": JobState.SUCCEEDED,
    "failed": JobState.FAILED,
    "preempted": JobState.PREEMPTED,
}


async def report_outcome(job_id: str, state: str, reason: str, uow: UnitOfWork) -> Job | None:
    """A job runs, ends, or has released its resources after a preemption request."""
    target = OUTCOMES.get(state)
    if target is None:
        raise QueueingValidationError("state", f"one of {', '.join(OUTCOMES)}; got {state!r}")
    await hold_cycle_off(uow)
    repo = JobRepository(uow.session)
    job = await repo.get(job_id, for_update=True)
    if job is None:
        log.warning("outcome for an unknown job", extra={"job_id": job_id})
        return None
    preempted_by = await uow.session.scalar(select(jobs.c.preempted_by).where(jobs.c.id == job_id))
    if target is JobState.PREEMPTED and preempted_by:
        reason = f"released after preemption by {preempted_by}" + (f": {reason}" if reason else "")
    before = len(job.history)
    try:
        job.move(target, reason or state, now())
    except InvalidTransition as exc:
        log.info("outcome ignored: %s", exc, extra={"job_id": job_id})
        return None
    await repo.save(job, job.history[before:])
    if target not in HOLDS_QUOTA:
        await uow.session.execute(delete(placements).where(placements.c.job_id == job_id))
    for event in job.events:
        await uow.publish(event)
    return job


async def handle_outcome_command(envelope: Envelope, uow: UnitOfWork) -> None:
    command = envelope.parse()
    assert isinstance(command, ReportJobOutcome)
    try:
        await report_outcome(command.job_id, command.state, command.reason, uow)
    except QueueingValidationError as exc:
        log.warning("bad outcome report: %s", exc, extra={"job_id": command.job_id})


async def handle_scheduler_event(envelope: Envelope, uow: UnitOfWork) -> None:
    event = envelope.parse()
    if isinstance(event, GangFinished):
        ended = ", ".join(f"{pod} {phase}" for pod, phase in sorted(event.pods.items()))
        state = "succeeded" if event.succeeded else "failed"
        await report_outcome(event.job_id, state, f"every pod ended: {ended}" if ended else state, uow)
        return
    if not isinstance(event, GangPlaced | GangUnschedulable):
        return
    await hold_cycle_off(uow)
    repo = JobRepository(uow.session)
    job = await repo.get(event.job_id, for_update=True)
    if job is None:
        log.warning("scheduler outcome for an unknown job", extra={"job_id": event.job_id})
        return
    if job.state != JobState.ADMITTED:
        log.info("scheduler outcome ignored in state %s", job.state, extra={"job_id": job.id})
        return
    before = len(job.history)
    if isinstance(event, GangPlaced):
        nodes = sorted({p.node for p in event.placements})
        job.move(JobState.PLACED, f"placed {len(event.placements)} pods on {', '.join(nodes)}", now())
        pods = [p.model_dump(mode="json") for p in event.placements]
        stmt = pg_insert(placements).values(job_id=job.id, pods=pods, placed_at=now())
        await uow.session.execute(
            stmt.on_conflict_do_update(index_elements=[placements.c.job_id], set_={"pods": pods})
        )
    else:
        job.note(f"unschedulable: {event.message}", now())
    await repo.save(job, job.history[before:])
    for message in job.events:
        await uow.publish(message)


async def handle_inventory(envelope: Envelope, uow: UnitOfWork) -> None:
    """Keep admission's own copy of the node and GPU inventory telemetry publishes (per source)."""
    event = envelope.parse()
    assert isinstance(event, InventoryChanged)
    await hold_cycle_off(uow)
    at = now()
    names = [n.name for n in event.nodes]
    await uow.session.execute(
        delete(inventory_nodes).where(
            inventory_nodes.c.source == event.source, inventory_nodes.c.name.not_in(names)
        )
    )
    for node in event.nodes:
        gpus = [g.model_dump(mode="json") for g in node.gpus]
        stmt = pg_insert(inventory_nodes).values(
            name=node.name, source=event.source, gpus=gpus, updated_at=at
        )
        await uow.session.execute(
            stmt.on_conflict_do_update(
                index_elements=[inventory_nodes.c.name],
                set_={"source": event.source, "gpus": gpus, "updated_at": at},
            )
        )
    await uow.session.execute(select(change_seq.next_value()))
